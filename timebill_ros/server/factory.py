"""Build the server from a ServerConfig: the backend of ``engine.backend`` builds its service.

The backends (server/backends/) hold what each needs: the local model, its calibration and
predictors; or a remote engine's tokenizer, probes and time model.
"""

import concurrent.futures
import pathlib

from timebill_ros.predictors import FallbackPredictor
from timebill_ros.predictors.contract import predictor_files
from timebill_ros.server.backends import backend_of


def build_service(config, log=print):
    """Load the model, the calibration, the online time-model state and the predictor.

    Without a calibration file for this model/device/dtype/threads, this profiles the engine
    (bounded by timing.max_calibration_s) and caches the result. The time model starts from
    the state saved by the last run on the same calibration (timing.state_file), then the
    warm-up goal measures the machine's speed of the moment (timing.warm_up).
    Returns a TimeBillService, not yet started.

    It runs on a thread of its own that ends when it returns. torch's CPU ops run in OpenMP
    (libgomp) teams, one per thread that starts them, and a team's threads stay for the
    life of the thread that made it. Built on the caller's thread (a ROS executor thread,
    the main thread), the start-up's team stayed beside the goals' team on the executor
    thread; with more OpenMP threads than cores, libgomp's workers spin ~1,000 times instead
    of ~300,000 before they sleep, and every small GEMM then waits for them to wake: a
    3.6k-token prefill in the node's chunks took 1.3-1.4x its time on a 2-core machine, the
    same prefill with the start-up on a thread that had ended 1.0x (docs/own_model.md).
    """
    # The pool's one thread ends when the block does; result() re-raises what it raised.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='timebill-build') as pool:
        return pool.submit(_build, config, log).result()


def _build(config, log):
    """Build the service of ``config.engine.backend`` on the calling thread."""
    return backend_of(config.engine.backend).build(config, log)


def predictor_upgrade(service):
    """Return what a rebuilt service would gain now, keyed by file state, or None.

    ``(text, key)``: ``text`` names the predictors whose files exist now but are not in use
    (``the RLP``, ``the prefill readout``, ``the decode readout`` where checkpoints would read
    it); ``key`` holds their paths and modification times, so one set of files is tried once.
    None when the service runs every predictor its ``predictor`` group asks for, or their
    files are still missing.
    """
    config = service.config.predictor
    if config.kind != 'rlp':
        return None
    # A remote backend reads no prefill states: its readout is never wanted.
    remote = service.config.engine.backend != 'local'
    paths = predictor_files(service.config, service.engine.model_key)
    wanted = [('the RLP', isinstance(service.predictor, FallbackPredictor), paths['RLP']),
              ('the prefill readout',
               config.prefill_readout and service.readout is None and not remote,
               paths['readout']),
              ('the decode readout',
               config.decode_readout and service.config.budget.checkpoint_tokens > 0
               and getattr(service.readout, 'decode', False) is None and not remote,
               paths['decode readout'])]
    found = []
    for text, missing, path in wanted:
        path = pathlib.Path(path)
        if missing and path.is_file():
            found.append((text, str(path), path.stat().st_mtime))
    if not found:
        return None
    return ' and '.join(text for text, _, _ in found), tuple(found)
