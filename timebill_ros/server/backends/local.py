"""The local backend: the model, its calibration, predictors, batches and offload executor.

Built from a ServerConfig on the factory's start-up thread (server/factory.py).
"""

import dataclasses
import threading

from timebill_ros.engine import LlmEngine
from timebill_ros.predictors import make_predictor, make_readout
from timebill_ros.predictors.contract import predictor_files
from timebill_ros.predictors.threshold import offload_threshold
from timebill_ros.server.backends.base import Backend
from timebill_ros.server.heap import release_free_heap, resident_mb
from timebill_ros.server.runner import JobRunner
from timebill_ros.server.service import TimeBillService
from timebill_ros.timing.batch import choose_batch_size, fit_batch_step, probe_batches
from timebill_ros.timing.online import TimeModel
from timebill_ros.timing.prefix import hit_mape_pct, probe_prefix
from timebill_ros.timing.profiler import format_report
from timebill_ros.timing.startup import load_or_calibrate, online_state_path, with_probed


class LocalBackend(Backend):
    """``engine.backend: local``: the model runs in this process."""

    name = 'local'

    @classmethod
    def build(cls, config, log=print):
        """Load, calibrate, build the predictors, the service and the offload executor."""
        return _build_local(config, log)


def _build_local(config, log):
    """Build the local service on the calling thread (server/factory.py build_service)."""
    memory = StartupMemory(log)
    log(f'loading model ({config.engine.model_path or "embedded SmolLM2-135M-Instruct"})')
    engine = LlmEngine.load(config.engine, config.eviction, config.prefix_cache)
    requested = config.engine  # its auto formats, for an offload engine on another device
    config = resolved_engine(config, engine, log)
    memory.mark('the model')
    calibration = load_or_calibrate(engine, config.engine, config.timing, log=log)
    calibration = with_prefix_points(config, engine, calibration, log)
    calibration = with_mask_cost(config, engine, calibration, log)
    log(format_report(calibration))
    memory.mark('the calibration')
    predictor = build_predictor(config, engine, calibration.coefficients, log=log)
    readout = make_readout(config.predictor, engine.model_key,
                           config.engine.model_cache_dir or None, log, engine.n_layers)
    time_model = build_time_model(config, calibration, _beside_prefill(predictor, readout),
                                  online_state_path(config.engine, config.timing), log)
    memory.mark('the predictors')
    batch_step, config = build_batch_step(config, engine, calibration, log)
    offload, tau = None, None
    later = config.offload.enabled and offload_after_primary(config)
    if config.offload.enabled and not later:
        offload, tau = build_offload(config, engine, predictor, log, readout, requested)
        memory.mark('the offload executor')
    service = TimeBillService(config, engine, predictor, time_model, log=log,
                              state_path=online_state_path(config.engine, config.timing),
                              offload=offload, tau_tokens=tau,
                              batch_step=batch_step, readout=readout,
                              mask_step_s=calibration.mask_step_s or 0.0)
    # After the service set the pooled layers (a change clears a store).
    twins = offload is not None and offload[0].prefix_store is engine.prefix_store
    for each in [engine] + ([offload[0]] if offload is not None and not twins else []):
        pin_prefixes(config, each, log)
    if config.timing.warm_up:
        service.warm_up()
    memory.mark('the warm-up')
    release_free_heap()  # what loading, calibrating and warming up freed (~400 MB here)
    memory.mark('giving the freed heap back')
    if later:
        _start_offload_later(service, config, engine, predictor, log, readout, requested)
    return service


def offload_after_primary(config) -> bool:
    """Return whether the offload executor starts after the primary serves.

    When it runs on another kind of device than the primary (the ARM cores beside a GPU):
    its load and CPU calibration (minutes on a first start) then neither hold back the
    primary's start nor run beside the primary's calibration.
    """
    kind = config.engine.device.split(':', 1)[0]
    return config.offload.device.split(':', 1)[0] != kind


def _start_offload_later(service, config, engine, predictor, log, readout, requested):
    """Build the offload executor on a thread of its own and attach it to ``service``."""
    def build():
        try:
            offload, tau = build_offload(config, engine, predictor, log, readout, requested)
            pin_prefixes(config, offload[0], log)
        except Exception as exc:  # the primary serves on without it; say why
            log(f'offload executor not started: {type(exc).__name__}: {exc}')
            return
        if service.attach_offload(offload, tau):
            log('offload executor started beside the serving primary')
        else:
            log('offload executor built after the service shut down: not started')

    log('the offload executor starts after the primary serves (another kind of device)')
    threading.Thread(target=build, name='timebill-offload-start', daemon=True).start()


def build_fallback(config, log=print):
    """Return the local JobRunner a remote service falls back to (``engine.remote_fallback``).

    The engine of ``engine.model_path`` with its calibration (profiled when missing), its
    prefix-hit points, its own length predictor (no prefill readout) and time model.
    """
    log(f'remote fallback: loading the local engine '
        f'({config.engine.model_path or "embedded SmolLM2-135M-Instruct"})')
    engine = LlmEngine.load(config.engine, config.eviction, config.prefix_cache)
    config = resolved_engine(config, engine, log)
    calibration = load_or_calibrate(engine, config.engine, config.timing, log=log)
    calibration = with_prefix_points(config, engine, calibration, log)
    predictor = build_predictor(config, engine, calibration.coefficients, log=log)
    time_model = build_time_model(config, calibration, predictor,
                                  online_state_path(config.engine, config.timing), log)
    return JobRunner(engine, predictor, time_model, config)


class StartupMemory:
    """Log the resident memory after each start-up stage (where a node's memory goes)."""

    def __init__(self, log):
        self.log, self.last_mb = log, resident_mb()

    def mark(self, stage: str) -> None:
        """Log the resident MB now and the change since the last mark, after ``stage``."""
        now_mb = resident_mb()
        if now_mb is not None and self.last_mb is not None:
            self.log(f'memory: {now_mb:.0f} MB resident after {stage} '
                     f'({now_mb - self.last_mb:+.0f} MB)')
        self.last_mb = now_mb


def with_mask_cost(config, engine, calibration, log=print):
    """Return ``calibration`` with the json_schema mask's seconds a step, probed if missing.

    A probe's figure is saved with the cached calibration (not into an explicit
    ``timing.calibration_file``); without xgrammar it is 0 and nothing is saved.
    """
    if calibration.mask_step_s is not None:
        log(f'json_schema: the token mask adds {calibration.mask_step_s * 1e3:.2f} ms a '
            'decoding step (calibration)')
        return calibration
    seconds = mask_cost(engine, log)
    if seconds <= 0:
        return calibration
    return with_probed(calibration, config.timing, 'json_schema mask cost', log,
                       mask_step_s=seconds)


def mask_cost(engine, log=print):
    """Return the seconds a json_schema mask adds to a step (a probe, ~0.1 s), 0 if none."""
    from timebill_ros.engine.grammar import measure_mask_step_s
    try:
        seconds = measure_mask_step_s(engine)
    except Exception as exc:  # no xgrammar: schema goals are refused at admission
        log(f'json_schema: constrained decoding unavailable ({type(exc).__name__}: {exc})')
        return 0.0
    log(f'json_schema: the token mask adds {seconds * 1e3:.2f} ms a decoding step')
    return seconds


def with_prefix_points(config, engine, calibration, log=print):
    """Return ``calibration`` with prefix-store hit points, probed (and cached) if it has none.

    Only with ``prefix_cache.enabled``: a few prefills that hit a scratch store
    (timing/prefix.py; ~10 s here), saved with the cached calibration (not into an
    explicit ``timing.calibration_file``).
    """
    if engine.prefix_store is None:
        return calibration
    if not calibration.prefix_points:
        log('prefix store: the calibration has no prefix-hit points; probing')
        calibration = with_probed(calibration, config.timing, 'prefix-hit points', log,
                                  prefix_points=tuple(probe_prefix(engine, progress=log)))
    copy_s = calibration.copy_token_s
    mape = hit_mape_pct(calibration.coefficients, calibration.prefix_points, copy_s)
    log(f'prefix store: {copy_s * 1e6:.1f} us a copied prompt token; hit prefill model '
        f'MAPE {mape:.1f} % on {len(calibration.prefix_points)} probes')
    return calibration


def pin_prefixes(config, engine, log=print):
    """Prefill and pin ``prefix_cache.pin``'s system prompts in the engine's prefix store."""
    if engine.prefix_store is None:
        if config.prefix_cache.pin:
            log('prefix_cache.pin is set but prefix_cache.enabled is false: nothing pinned')
        return
    for text in config.prefix_cache.pin:
        n_tokens = engine.pin_prefix(text)
        log(f'prefix store: pinned {n_tokens} tokens of the system prompt '
            f'{text[:40]!r}{"..." if len(text) > 40 else ""}')


def resolved_engine(config, engine, log=print):
    """Return ``config`` with the engine group the engine resolved (``auto`` formats).

    Calibration files and the online state key on the resolved format.
    """
    if engine.step_format_probe:
        probe = ', '.join(f'{name} {seconds * 1e3:.1f} ms'
                          for name, seconds in engine.step_format_probe.items())
        log(f'engine.decode_weights auto: {engine.engine_config.decode_weights} '
            f'(decoding step: {probe})')
        if engine.gguf_skipped:
            log(f'engine.decode_weights auto did not try gguf: {engine.gguf_skipped}')
    if config.engine.prefill_dtype != engine.engine_config.prefill_dtype:
        from timebill_ros.engine.models.weights import auto_prefill_dtype
        log(f'engine.prefill_dtype {config.engine.prefill_dtype}: '
            f'{engine.engine_config.prefill_dtype} ({auto_prefill_dtype()[1]})')
    return dataclasses.replace(config, engine=engine.engine_config)


def build_batch_step(config, engine, calibration, log=print):
    """Return ``(fit, config)``: the batched-step fit goals in a batch budget with, or None.

    Only when the primary batches (``scheduler.consolidation`` or ``scheduler.continuous``)
    on an engine that can: the calibration's ``batch_points`` when it has them, else probed
    now (B = 1, 2, 4, 8 at 128 and 1,024 tokens a goal; ~30 s here) and saved with the cached
    calibration (not into an explicit ``timing.calibration_file``). The config returned has
    ``scheduler.batch_size`` 0 resolved (timing.batch.choose_batch_size; 1 when nothing
    batches).
    """
    scheduler = config.scheduler
    batches = scheduler.consolidation or scheduler.continuous
    fit, points = None, ()
    if batches and engine.forward.max_batch >= 2:
        fit, points = _batch_fit(config, engine, calibration, log)
    if scheduler.batch_size == 0:
        size = 1
        if fit is not None:
            sizes = [b for b in {b for b, _, _ in points} if b <= engine.forward.max_batch]
            size = choose_batch_size(fit, sizes, scheduler.batch_gain)
        log(f'scheduler.batch_size 0: C_f = {size} (per-token cost stops falling by more '
            f'than {scheduler.batch_gain:.0%} past it)')
        config = dataclasses.replace(
            config, scheduler=dataclasses.replace(scheduler, batch_size=size))
    return fit, config


def _batch_fit(config, engine, calibration, log):
    """Return (fit, points): the calibration's batch points, probed (and cached) if none."""
    points = calibration.batch_points
    if not points:
        log('batching: the calibration has no batched-step points; probing')
        points = tuple(probe_batches(engine, progress=log))
        with_probed(calibration, config.timing, 'batched-step points', log,
                    batch_points=points)
    fit = fit_batch_step(points)
    log(f'batched step: t_step(B, S) = {fit.q * 1e3:.1f} ms + {fit.r * 1e3:.2f} ms (B - 1) '
        f'+ {fit.p * 1e6:.2f} us/token S')
    return fit, points


def _beside_prefill(predictor, readout):
    """Return the predictor that runs beside each prefill: none when a readout gives N^."""
    return None if readout is not None else predictor


def offload_engine_config(config, requested=None):
    """Return the EngineConfig of the offload executor's engine (``offload.*``).

    config: the ServerConfig, its ``engine`` group the primary's as resolved
    (:func:`resolved_engine`). requested: the engine group as set, its ``auto`` formats
    unresolved (None: ``config.engine``). The offload engine runs on ``offload.device``
    with ``offload.threads`` threads in ``offload.dtype`` (``auto``: float32 on a CPU,
    whatever the primary's dtype; OffloadConfig.weight_dtype). On the primary's device in
    the primary's dtype it is the primary's resolved group with those threads, so that
    LlmEngine.twin shares the weights. Elsewhere (the ARM cores beside a CUDA primary) it is
    the requested group on that device, in that dtype: a format the primary resolved is one
    fast on the GPU (a float16 step copy), and ``auto`` chooses again on the offload device
    (the GGUF kernels for the embedded model on the CPU).
    """
    offload, primary = config.offload, config.engine
    dtype = offload.weight_dtype(primary.dtype)
    if (offload.device, dtype) == (primary.device, primary.dtype):
        return dataclasses.replace(primary, threads=offload.threads)
    return dataclasses.replace(requested or primary, device=offload.device, dtype=dtype,
                               threads=offload.threads)


def _offload_engine(engine, engine_config, config, log):
    """Return the offload executor's engine: the primary's twin on its device, else loaded."""
    where = (f'{engine_config.device}, {engine_config.dtype}, '
             f'{engine_config.threads} threads')
    try:
        twin = engine.twin(engine_config)
    except (ValueError, NotImplementedError) as why:
        log(f'loading the offload engine ({where}): {why}')
        return LlmEngine.load(engine_config, config.eviction, config.prefix_cache)
    log(f'the offload engine shares the primary\'s weights and prefix store ({where})')
    return twin


def build_offload(config, engine, predictor, log=print, readout=None, requested=None):
    """Return ((engine, TimeModel), tau) of the offload executor (``offload.*``).

    Its engine (:func:`offload_engine_config`: ``offload.device``, ``offload.dtype``,
    ``offload.threads``; ``requested`` the engine group as set, None: ``config.engine``) is
    the primary's twin, on the same weights, when device and dtype match (LlmEngine.twin),
    else loaded on its own; it has its own calibration (the cache entry of its device,
    format and thread count, profiled at start-up when missing; never the primary's
    ``timing.calibration_file``) and online state.
    """
    engine_config = offload_engine_config(config, requested)
    timing_config = dataclasses.replace(config.timing, calibration_file='', state_file='')
    offload_engine = _offload_engine(engine, engine_config, config, log)
    engine_config = offload_engine.engine_config  # decode_weights auto resolved
    log(f'offload engine: {engine_config.device}, {engine_config.dtype}, decode_weights '
        f'{engine_config.decode_weights}')
    offload_engine.bind_thread()  # the calibration below runs on this thread
    try:
        calibration = load_or_calibrate(offload_engine, engine_config, timing_config, log=log)
        calibration = with_prefix_points(
            dataclasses.replace(config, timing=timing_config), offload_engine, calibration, log)
    finally:
        engine.bind_thread()
    model = build_time_model(config, calibration, _beside_prefill(predictor, readout),
                             online_state_path(engine_config, timing_config), log)
    model_file = None
    if config.predictor.kind == 'rlp':
        model_file = predictor_files(config, engine.model_key)['RLP']
    tau = offload_threshold(predictor, config.offload.quantile, config.engine.max_new_tokens,
                            model_file, log)
    return (offload_engine, model), tau


def build_time_model(config, calibration, predictor, state_path, log=print):
    """Return the TimeModel of ``calibration``, restored from ``state_path`` when it fits.

    predictor: the length predictor running beside each prefill (its t^_Predict overhang is
    part of a goal's time), or None (a prefill readout: the runner counts its time itself).
    """
    model = TimeModel(calibration.coefficients, config.timing.online_settings(),
                      predict_s=None if predictor is None else predictor.expected_time_s,
                      calibration_created=calibration.created,
                      calibration_chunk_tokens=config.engine.prefill_chunk_tokens,
                      copy_token_s=(calibration.copy_token_s if config.prefix_cache.enabled
                                    else 0.0))
    if not config.timing.online:
        log('time model: fixed (timing.online is false): no speed factor, no margin')
        return model
    try:
        if model.load(state_path):
            log(f'time model: online state restored from {state_path}')
        else:
            log(f'time model: no online state at {state_path} yet; starting from the '
                'calibration')
    except ValueError as exc:
        log(f'time model: ignoring the online state at {state_path}: {exc}')
    return model


def build_predictor(config, engine, coefficients, log=print):
    """Return the length predictor of ``config`` for ``engine``, compressing against Eq. 4a."""
    return make_predictor(config.predictor, engine.model_key, coefficients.prefill_s,
                          config.engine.model_cache_dir or None, log=log)
