"""Build the server's parts from a ServerConfig: engine, calibration, predictor, service."""

from timebill_ros.predictors import make_predictor
from timebill_ros.server.service import TimeBillService


def build_service(config, log=print):
    """Load the model, the time-model calibration and the predictor; return a TimeBillService.

    Without a calibration file for this model/device/dtype/threads, this profiles the engine
    (bounded by timing.max_calibration_s) and caches the result.
    """
    from timebill_ros.engine import LlmEngine
    from timebill_ros.timing.profiler import format_report, load_or_calibrate

    log(f'loading model ({config.engine.model_path or "embedded SmolLM2-135M-Instruct"})')
    engine = LlmEngine.load(config.engine, config.eviction)
    calibration = load_or_calibrate(engine, config.engine, config.timing, log=log)
    log(format_report(calibration))
    predictor = build_predictor(config, engine, calibration.coefficients, log=log)
    return TimeBillService(config, engine, predictor, calibration.coefficients)


def build_predictor(config, engine, coefficients, log=print):
    """Return the length predictor of ``config`` for ``engine``, compressing against Eq. 4a."""
    return make_predictor(config.predictor, engine.model_key, coefficients.prefill_s,
                          config.engine.model_cache_dir or None, log=log)
