"""The start-up calibration: which Eq. 4 calibration the server uses, made at start-up if none.

An explicit ``timing.calibration_file``, else the cache entry of this engine's model, device,
weight format and threads, else a bounded start-up calibration (five few-shot probes or the
start-up grid) saved to that entry. Also where the online time-model state lives.
"""

import dataclasses
import os

from timebill_ros.config import TimingConfig
from timebill_ros.timing.few_shot import few_shot_profile
from timebill_ros.timing.model import Calibration, calibration_key, default_calibration_path
from timebill_ros.timing.profiler import key_fields, profile, startup_grid


def _load_explicit(path, key, log):
    """Load ``timing.calibration_file``; FileNotFoundError if missing, warn on key mismatch."""
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f'timing.calibration_file {path!r} does not exist; create it with `timebill '
            'profile` or leave timing.calibration_file empty to use the cache')
    calibration = Calibration.load(path)
    if calibration.key != key:
        log(f'warning: timing calibration {path} was made for {calibration.key}, the engine '
            f'is {key}; its time estimates may be off')
    log(f'timing calibration: loaded {path}')
    return calibration


def _load_cached(path, log):
    """Return the cached calibration at ``path``, or None when absent or unreadable."""
    if not os.path.isfile(path):
        return None
    try:
        calibration = Calibration.load(path)
    except (OSError, ValueError) as exc:
        log(f'warning: ignoring unreadable cached timing calibration: {exc}')
        return None
    log(f'timing calibration: loaded cached {path}')
    return calibration


def _calibrate_and_cache(engine, engine_config, timing_config, path, log):
    """Calibrate at start-up within timing.max_calibration_s and save it to ``path``.

    timing.startup_method picks five few-shot probes or the start-up grid.
    """
    log(f'timing calibration: none cached at {path}; {timing_config.startup_method} '
        f'calibration at start-up (at most ~{timing_config.max_calibration_s:g} s)')
    if timing_config.startup_method == 'few_shot':
        calibration = few_shot_profile(engine, engine_config=engine_config,
                                       time_limit_s=timing_config.max_calibration_s,
                                       progress=log)
    else:
        calibration = profile(engine, startup_grid(engine.context_tokens),
                              time_limit_s=timing_config.max_calibration_s,
                              engine_config=engine_config, progress=log)
    try:
        calibration.save(path)
    except OSError as exc:
        log(f'warning: could not cache the timing calibration at {path}: {exc}')
    else:
        log(f'timing calibration: saved {path}')
    return calibration


def load_or_calibrate(engine, engine_config, timing_config, *, log=print):
    """Return the calibration the server should use.

    1. ``timing_config.calibration_file`` if set (FileNotFoundError if missing, ValueError if
       malformed); 2. else the cache entry ``default_calibration_path(key)`` for this engine
       config's model/device/dtype/threads if present and readable; 3. else, when
       ``timing_config.calibrate_on_start``, a start-up calibration (few-shot probes or the
       start-up grid, ``timing_config.startup_method``) bounded by
       ``timing_config.max_calibration_s`` seconds, saved to that cache path; 4. else
       RuntimeError telling to run ``timebill profile``. ``log`` gets one line per event.
    """
    if not isinstance(timing_config, TimingConfig):
        raise TypeError(f'timing_config must be a TimingConfig, got {timing_config!r}')
    key = calibration_key(*key_fields(engine_config))
    if timing_config.calibration_file:
        return _load_explicit(timing_config.calibration_file, key, log)
    path = default_calibration_path(key)
    calibration = _load_cached(path, log)
    if calibration is not None:
        return calibration
    if timing_config.calibrate_on_start:
        return _calibrate_and_cache(engine, engine_config, timing_config, path, log)
    raise RuntimeError(
        f'no timing calibration for {key} (looked for {path}) and timing.calibrate_on_start '
        'is false; run `timebill profile` to create one, or set timing.calibration_file')


def with_probed(calibration, timing_config, what, log=print, **fields):
    """Return ``calibration`` with ``fields`` (probed at start-up), saved with the cache entry.

    The one place a start-up probe's figures (prefix-hit points, batched-step points, the
    json_schema mask's cost) join the calibration: saved into the per-user cache entry so the
    next start-up reads them, never into an explicit ``timing.calibration_file`` (the user's
    file is not rewritten). what: the figures in words, for the log.
    """
    calibration = dataclasses.replace(calibration, **fields)
    if not timing_config.calibration_file:
        path = default_calibration_path(calibration.key)
        calibration.save(path)
        log(f'{what} saved with the calibration ({path})')
    return calibration


def online_state_path(engine_config, timing_config):
    """Return where the online time-model state lives.

    ``timing.state_file``, else next to the cache entry of this engine's calibration
    (``<cache>/calibration/<key>.online.yaml``).
    """
    if timing_config.state_file:
        return os.path.expanduser(timing_config.state_file)
    path = default_calibration_path(calibration_key(*key_fields(engine_config)))
    return path[:-len('.yaml')] + '.online.yaml'
