"""Build the server's parts from a ServerConfig: engine, time model, predictor, service."""

from timebill_ros.predictors import make_predictor
from timebill_ros.server.service import TimeBillService


def build_service(config, log=print):
    """Load the model, the calibration, the online time-model state and the predictor.

    Without a calibration file for this model/device/dtype/threads, this profiles the engine
    (bounded by timing.max_calibration_s) and caches the result. The time model starts from
    the state saved by the last run on the same calibration (timing.state_file), then the
    warm-up goal measures the machine's speed of the moment (timing.warm_up).
    Returns a TimeBillService, not yet started.
    """
    from timebill_ros.engine import LlmEngine
    from timebill_ros.timing.profiler import (format_report, load_or_calibrate,
                                              online_state_path)

    log(f'loading model ({config.engine.model_path or "embedded SmolLM2-135M-Instruct"})')
    engine = LlmEngine.load(config.engine, config.eviction)
    calibration = load_or_calibrate(engine, config.engine, config.timing, log=log)
    log(format_report(calibration))
    predictor = build_predictor(config, engine, calibration.coefficients, log=log)
    time_model = build_time_model(config, calibration, predictor,
                                  online_state_path(config.engine, config.timing), log)
    service = TimeBillService(config, engine, predictor, time_model, log=log,
                              state_path=online_state_path(config.engine, config.timing))
    if config.timing.warm_up:
        service.warm_up()
    return service


def build_time_model(config, calibration, predictor, state_path, log=print):
    """Return the TimeModel of ``calibration``, restored from ``state_path`` when it fits."""
    from timebill_ros.timing.online import TimeModel
    model = TimeModel(calibration.coefficients, config.timing.online_settings(),
                      predict_s=predictor.expected_time_s,
                      calibration_created=calibration.created,
                      calibration_chunk_tokens=config.engine.prefill_chunk_tokens)
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
