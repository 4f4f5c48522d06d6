"""The offload executor's engine format (``offload.dtype``) and its start-up, on the CPU.

On a Jetson (config/jetson_orin.yaml) the primary runs float16 on the GPU and the offload
executor on the ARM cores: there it must load in float32 (so ``decode_weights: auto`` can
take the GGUF kernels or the fastest lean format), not in the GPU's float16. No GPU here: a
primary in float16 on the CPU stands in where the factory needs a loaded one.
"""

import dataclasses
import pathlib

import pytest

from timebill_ros import params, paths
from timebill_ros.config import (EngineConfig, EvictionConfig, OffloadConfig, PredictorConfig,
                                 PrefixCacheConfig, ServerConfig, TimingConfig)
from timebill_ros.engine import LlmEngine, model_source
from timebill_ros.predictors import FallbackPredictor
from timebill_ros.server.backends.local import (build_offload, offload_engine_config,
                                                resolved_engine)
from timebill_ros.timing.model import (Calibration, TimingCoefficients, calibration_key,
                                       default_calibration_path, now_iso)
from timebill_ros.timing.profiler import key_fields

JETSON = 'config/jetson_orin.yaml'


def test_offload_dtype_auto_is_float32_on_the_cpu_beside_a_float16_gpu():
    """The preset's offload engine: float32 on the CPU, its auto formats chosen there."""
    config = params.load_config(JETSON)
    assert config.engine.device == 'cuda' and config.engine.dtype == 'float16'
    assert config.offload.dtype == 'auto' and config.offload.device == 'cpu'
    # What the primary resolved on the GPU (decode_weights auto -> a float16 step copy).
    resolved = dataclasses.replace(config, engine=dataclasses.replace(
        config.engine, decode_weights='float16'))
    offload = offload_engine_config(resolved, requested=config.engine)
    assert (offload.device, offload.dtype, offload.threads) == ('cpu', 'float32', 4)
    assert offload.decode_weights == 'auto' and offload.prefill_dtype == 'auto'
    # The embedded model is then served on its GGUF blocks through the CPU kernels.
    assert model_source.gguf_to_serve(offload) == model_source.embedded_gguf_path()
    # Before: the primary's group with the device swapped: float16, off the GGUF path.
    before = dataclasses.replace(resolved.engine, device='cpu', threads=4)
    assert model_source.gguf_to_serve(before) is None

    # Set by the user: kept, on any device.
    for dtype in ('float16', 'bfloat16', 'float32'):
        chosen = dataclasses.replace(resolved, offload=dataclasses.replace(
            resolved.offload, dtype=dtype))
        assert offload_engine_config(chosen, config.engine).dtype == dtype
    # A second executor on the GPU: auto is the engine's dtype, and the primary's resolved
    # group (only threads differ), so that it shares the primary's weights (a twin).
    on_gpu = dataclasses.replace(resolved, offload=dataclasses.replace(
        resolved.offload, device='cuda'))
    assert offload_engine_config(on_gpu, config.engine) == dataclasses.replace(
        resolved.engine, threads=4)


def test_offload_dtype_is_checked():
    assert OffloadConfig().dtype == 'auto'
    assert OffloadConfig(dtype='float16').weight_dtype('float32') == 'float16'
    assert OffloadConfig(device='cpu:0').weight_dtype('bfloat16') == 'float32'
    assert OffloadConfig(device='cuda:1').weight_dtype('bfloat16') == 'bfloat16'
    with pytest.raises(ValueError, match="offload.dtype.*'int8'"):
        OffloadConfig(dtype='int8')
    with pytest.raises(TypeError, match='offload.device'):
        OffloadConfig(device='')
    with pytest.raises(ValueError, match='offload.dtype'):
        params.load_config(JETSON, overrides=['offload.dtype=fp16'])


def _scratch_cache(tmp_path, monkeypatch):
    """Point $TIMEBILL_CACHE at ``tmp_path``, sharing the kernels built in the real cache.

    Calibrations and online states go to the scratch cache; the C++ kernels (built once per
    cache, ~30 s here) are the real cache's.
    """
    kernels = pathlib.Path(paths.cache_root()) / 'kernels'
    kernels.mkdir(parents=True, exist_ok=True)
    (tmp_path / 'kernels').symlink_to(kernels, target_is_directory=True)
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path))


def _cache_calibration(engine_config):
    """Save a calibration for ``engine_config``'s key in the cache (no profiling in a test)."""
    model_key, device, dtype, threads = key_fields(engine_config)
    Calibration(TimingCoefficients(a=1e-9, b=1e-5, c=1e-3, p=1e-6, q=1e-3), model_key, device,
                dtype, threads, None, None, 0, 0.0, now_iso(), 'few_shot', (), ()).save(
        default_calibration_path(calibration_key(model_key, device, dtype, threads)))


def _server_config(engine_config):
    return ServerConfig(engine=engine_config, offload=OffloadConfig(enabled=True, threads=1),
                        prefix_cache=PrefixCacheConfig(enabled=False),
                        predictor=PredictorConfig(kind='fallback'),
                        timing=TimingConfig(calibrate_on_start=False))


def test_the_factory_loads_a_float32_offload_engine_beside_a_float16_primary(
        tiny_model, smollm2_tokenizer, tmp_path, monkeypatch):
    """build_offload, for real: the offload engine is loaded in float32 on the GGUF path."""
    _scratch_cache(tmp_path, monkeypatch)
    requested = EngineConfig(dtype='float16', threads=1)  # decode_weights auto
    primary = LlmEngine(requested, EvictionConfig(), model=tiny_model,
                        tokenizer=smollm2_tokenizer)
    config = resolved_engine(_server_config(requested), primary, log=lambda line: None)
    assert config.engine.dtype == 'float16' and config.engine.decode_weights != 'auto'
    expected = offload_engine_config(config, requested)
    for prefill in ('float32', 'bfloat16'):  # whichever the load's probe picks
        _cache_calibration(dataclasses.replace(expected, decode_weights='gguf',
                                               prefill_dtype=prefill))
    lines = []
    (offload, time_model), tau = build_offload(config, primary, FallbackPredictor(),
                                               log=lines.append, requested=requested)
    assert offload is not primary and offload.forward is not primary.forward
    assert offload.gguf_file is not None and offload.model is None  # its own GGUF blocks
    assert offload.engine_config.dtype == 'float32'
    assert offload.engine_config.decode_weights == 'gguf'
    assert offload.engine_config.threads == 1 and offload.device.type == 'cpu'
    assert any('loading the offload engine (cpu, float32, 1 threads)' in line
               for line in lines), lines
    assert any('timing calibration: loaded cached' in line for line in lines), lines
    assert time_model is not None and (tau is None or tau >= 0)


def test_the_factory_twins_the_primary_on_its_own_device_and_format(
        make_tiny_engine, tmp_path, monkeypatch):
    """A float32 primary on the CPU: the offload engine shares its weights (LlmEngine.twin)."""
    _scratch_cache(tmp_path, monkeypatch)
    primary = make_tiny_engine()
    config = _server_config(primary.engine_config)
    _cache_calibration(dataclasses.replace(primary.engine_config, threads=1))
    lines = []
    (offload, _), _ = build_offload(config, primary, FallbackPredictor(), log=lines.append,
                                    requested=EngineConfig())
    assert offload is not primary and offload.forward.layers is primary.forward.layers
    assert any("shares the primary's weights" in line for line in lines), lines
    # A twin never crosses devices: the GPU primary's twin on the ARM cores is refused.
    with pytest.raises(ValueError, match='device'):
        primary.twin(dataclasses.replace(primary.engine_config, device='cuda'))


def test_the_offload_executor_starts_after_the_primary_on_another_kind_of_device():
    """Beside a GPU primary the ARM cores' executor loads and calibrates while it serves."""
    from timebill_ros.server.backends.local import offload_after_primary
    gpu = ServerConfig(engine=EngineConfig(device='cuda:0', dtype='float16'),
                       offload=OffloadConfig(enabled=True, device='cpu'))
    assert offload_after_primary(gpu)
    assert not offload_after_primary(dataclasses.replace(
        gpu, engine=EngineConfig(device='cpu')))
