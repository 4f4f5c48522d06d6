"""Every clock read that times GPU work synchronizes the device first (issue 41), on the CPU.

On a GPU a forward pass returns once its kernels are queued: a clock read after it, without a
synchronize, times the launches. No GPU here, so the order of events is checked instead:

- the one helper, ``engine.forward.synchronize(device)``, is wrapped by a recorder in every
  module that holds it, and ``torch.cuda.synchronize`` by another (so the helper's CUDA branch
  can run here); an engine's ``synchronize`` and ``Forward.synchronize`` go through it;
- forward passes, KV evictions and prefix-store copies record ``work`` when they return;
- the clocks the sites read are a fake device clock that records each read and its caller.

A read that times work must find no work queued (on its thread) since the last synchronize.
The reads that are not measurements - deadline checks and progress feedback - are listed in
NOT_TIMING. Each site runs for real on the tiny engine; each runs again with its synchronize
made a no-op (the control), and the check must then find unsynchronized reads.
"""

import collections
import functools
import sys
import threading
import time
import types

import pytest
import torch

from timebill_ros.bench import engine as bench_engine
from timebill_ros.config import (BudgetConfig, EngineConfig, EvictionConfig, PrefixCacheConfig,
                                 QueueConfig, ServerConfig, TimingConfig)
from timebill_ros.engine import LlmEngine, llm_engine, prefix_kv, step_format
from timebill_ros.engine import forward as forward_module
from timebill_ros.engine.forward import Forward
from timebill_ros.engine.hf_forward import TransformersForward
from timebill_ros.engine.lean_llama import LeanLlamaForward
from timebill_ros.engine.models.base import GgufDecoder
from timebill_ros.engine.stopping import StopCriteria
from timebill_ros.latency import hardware, harness
from timebill_ros.predictors import FallbackPredictor
from timebill_ros.server import status
from timebill_ros.server.goals import GoalRequest
from timebill_ros.server.service import TimeBillService
from timebill_ros.timing.batch import probe_batches
from timebill_ros.timing.model import TimingCoefficients
from timebill_ros.timing.prefix import probe_prefix
from timebill_ros.timing.probes import EngineProbes
from timebill_ros.timing.profiler import ProfileGrid, profile
from timebill_ros.timing.startup import load_or_calibrate

COEFFS = TimingCoefficients(a=1e-9, b=1e-5, c=1e-3, p=1e-6, q=1e-3)
PROMPT = 'List the tools on the bench, then say which one opens the hatch and why.'
# Reads that compare the clock with a deadline or stamp feedback: not measurements of work
# (on a GPU ``Forward.layer_wait`` synchronizes before the per-layer deadline checks).
NOT_TIMING = {'DeadlineStop.should_stop', 'PrefillCannotFinish.should_stop',
              'NextStepCannotFinish.should_stop', 'GoalRun._cannot_decode',
              'GoalRun._decide', 'GoalRun._await_prediction', 'GoalRun._feedback'}


class Timeline:
    """Events in order: ``(kind, what, thread)``, kind ``work``, ``sync`` or ``read``."""

    def __init__(self):
        self.events = []

    def add(self, kind, what):
        self.events.append((kind, what, threading.get_ident()))

    def clock(self) -> float:
        """Return fake device seconds, 1 ms a read; record the read and its caller."""
        frame = sys._getframe(1)
        owner = frame.f_locals.get('self')
        name = frame.f_code.co_name
        self.add('read', name if owner is None else f'{type(owner).__name__}.{name}')
        return 1e-3 * len(self.events)

    def time_module(self):
        """Return a stand-in for a site module's ``time``: its clocks are this clock."""
        return types.SimpleNamespace(perf_counter=self.clock, monotonic=self.clock,
                                     time=time.time, sleep=time.sleep)

    def timing_reads(self):
        """Return ``[(caller, synchronized)]`` of the timing reads, in order.

        ``synchronized``: no work was queued on the read's thread since that thread's last
        synchronize (per thread: each executor runs its passes on its own).
        """
        queued, reads = collections.defaultdict(bool), []
        for kind, what, thread in self.events:
            if kind == 'work':
                queued[thread] = True
            elif kind == 'sync':
                queued[thread] = False
            elif kind == 'read' and what not in NOT_TIMING:
                reads.append((what, not queued[thread]))
        return reads

    def unsynchronized(self):
        """Return the callers of the timing reads that found work queued."""
        return sorted({caller for caller, synced in self.timing_reads() if not synced})

    def callers(self):
        """Return the callers of the timing reads."""
        return {caller for caller, _ in self.timing_reads()}


def _working(timeline, what, method):
    """Return ``method`` recording ``work`` when it returns (or raises)."""
    @functools.wraps(method)
    def run(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        finally:
            timeline.add('work', what)
    return run


@pytest.fixture
def timeline(monkeypatch):
    """Record the synchronizes, the model's work and (where a site reads it) the clock."""
    line = Timeline()
    original = forward_module.synchronize

    def recorded(device):
        line.add('sync', str(device))
        original(device)

    holders = [module for name, module in list(sys.modules.items())
               if name.startswith('timebill_ros')
               and getattr(module, 'synchronize', None) is original]
    assert {forward_module, bench_engine, hardware} <= set(holders)
    for module in holders:
        monkeypatch.setattr(module, 'synchronize', recorded)
    monkeypatch.setattr(torch.cuda, 'synchronize',
                        lambda device=None: line.add('cuda synchronize', str(device)))
    for cls in (LeanLlamaForward, TransformersForward, GgufDecoder):
        for name in ('run', 'run_step', 'run_by_layer'):
            method = getattr(cls, name, None)
            if method is not None:
                monkeypatch.setattr(cls, name, _working(line, f'{cls.__name__}.{name}', method))
    monkeypatch.setattr(LlmEngine, '_evict_layer',
                        _working(line, '_evict_layer', LlmEngine._evict_layer))
    for module, name in ((llm_engine, 'load_prefix'), (prefix_kv, 'block_kv')):
        monkeypatch.setattr(module, name, _working(line, name, getattr(module, name)))
    return line


def _no_engine_sync(monkeypatch):
    """Make engines and forwards skip their synchronize (the control)."""
    monkeypatch.setattr(Forward, 'synchronize', lambda self: None)


def test_the_helper_synchronizes_cuda_only(timeline):
    """On a CUDA device the helper waits for the device; on the CPU it does nothing."""
    for device in ('cuda', 'cuda:1', torch.device('cuda', 0)):
        forward_module.synchronize(device)
    forward_module.synchronize('cpu')
    forward_module.synchronize(torch.device('cpu'))
    assert [e[:2] for e in timeline.events] == [
        ('sync', 'cuda'), ('cuda synchronize', 'cuda'),
        ('sync', 'cuda:1'), ('cuda synchronize', 'cuda:1'),
        ('sync', 'cuda:0'), ('cuda synchronize', 'cuda:0'),
        ('sync', 'cpu'), ('sync', 'cpu')]


def test_a_timer_on_a_cuda_device_waits_for_the_device(timeline, monkeypatch):
    """hardware._best_s (the latency study's timer) with device cuda: the GPU is waited for."""
    monkeypatch.setattr(hardware, 'time', timeline.time_module())
    del timeline.events[:]
    assert hardware._best_s(lambda: timeline.add('work', 'kernel'), 'cuda', 2) > 0
    timed = [('sync', 'cuda'), ('cuda synchronize', 'cuda'), ('read', '_best_s')]
    assert [e[:2] for e in timeline.events] == (
        [('work', 'kernel')] + (timed + [('work', 'kernel')] + timed) * 2)
    assert timeline.unsynchronized() == []


def _engine(tiny_model, smollm2_tokenizer, timeline, **engine_kwargs):
    """Return a tiny engine reading ``timeline``'s clock (chunks of 16 tokens, window 8)."""
    return LlmEngine(EngineConfig(prefill_chunk_tokens=16, **engine_kwargs),
                     EvictionConfig(window_size=8), model=tiny_model,
                     tokenizer=smollm2_tokenizer, clock=timeline.clock,
                     prefix_cache=PrefixCacheConfig(block_tokens=8, min_tokens=8))


# --- the sites: each runs one for real and returns the callers it must have read from -----
def step_format_probe(timeline, monkeypatch, tiny_model, smollm2_tokenizer, tmp_path):
    """engine/step_format.py: decode_weights auto times fp32 and fp16 steps at load."""
    monkeypatch.setattr(step_format, 'time', timeline.time_module())
    engine = LlmEngine(EngineConfig(decode_weights='auto'), EvictionConfig(),
                       model=tiny_model, tokenizer=smollm2_tokenizer)
    assert set(engine.step_format_probe) == {'float32', 'float16'}
    return {'forward_step_s'}


def engine_measurements(timeline, monkeypatch, tiny_model, smollm2_tokenizer, tmp_path):
    """Run the engine's own timed prefill, decode, probe and batched step (calibration's)."""
    engine = _engine(tiny_model, smollm2_tokenizer, timeline)
    probes = EngineProbes(engine)
    probes.measure_prefill_s(40, repeats=2)
    probes.measure_decode_step_s(40, steps=3)
    probes.measure_probe(40, 4)
    probes.measure_batch_step_s(2, 40, steps=2)
    ids = engine.encode(PROMPT)
    engine.prefill(ids, StopCriteria(), store=engine.prefix_store)
    state = engine.prefill(ids, StopCriteria(), prefix=engine.match_prefix(ids),
                           store=engine.prefix_store)  # a prefix hit: the copy is timed
    assert state.n_cached > 0
    engine.evict(state, 0.5)
    engine.decode(state, 4, StopCriteria())
    return {'LlmEngine.prefill', 'DecodeBatch.join', 'DecodeBatch._finish',
            'StepTimer.should_stop', 'EngineProbes.measure_batch_step_s'}


def calibration(timeline, monkeypatch, tiny_model, smollm2_tokenizer, tmp_path):
    """Run timing/: the profiler grid, the few-shot start-up calibration, prefix, batch probes.

    The factory's start-up (server/factory.py) runs load_or_calibrate, probe_prefix and
    probe_batches as here.
    """
    monkeypatch.setenv('TIMEBILL_CACHE', str(tmp_path))  # the calibration it saves
    engine = _engine(tiny_model, smollm2_tokenizer, timeline)
    profile(engine, ProfileGrid((16, 32, 64), (16, 32), decode_steps=3), clock=timeline.clock)
    load_or_calibrate(engine, engine.engine_config, TimingConfig(), log=lambda line: None)
    probe_prefix(engine, lengths=(64,), fresh=16, tails=1)
    probe_batches(engine, sizes=(1, 2), kv_lengths=(32,), steps=2)
    return {'LlmEngine.prefill', 'StepTimer.should_stop', 'EngineProbes.measure_batch_step_s',
            '_Run.measure', 'DecodeBatch._finish'}


def online_time_model(timeline, monkeypatch, tiny_model, smollm2_tokenizer, tmp_path):
    """server/runner.py: the warm-up and a goal feed measured times to the time model."""
    config = ServerConfig(engine=EngineConfig(max_new_tokens=6, prefill_chunk_tokens=16,
                                              feedback_every_tokens=1),
                          queue=QueueConfig(max_depth=2),
                          budget=BudgetConfig(mode='fixed', fixed_alpha=0.5))
    engine = LlmEngine(config.engine, config.eviction, model=tiny_model,
                       tokenizer=smollm2_tokenizer, clock=timeline.clock)
    service = TimeBillService(config, engine, FallbackPredictor(), COEFFS,
                              clock=timeline.clock)
    observed = []
    for name in ('observe_prefill', 'observe_evict', 'observe_decode'):
        method = getattr(service.time_model, name)
        monkeypatch.setattr(service.time_model, name, _observed(observed, name, method))
    service.warm_up()
    service.start()
    try:
        done = threading.Event()
        results = []
        service.submit(GoalRequest(PROMPT, budget_s=1e6), lambda feedback: None,
                       lambda result: (results.append(result), done.set()))
        assert done.wait(60), 'no result'
    finally:
        service.shutdown()
    assert results[0].status == status.COMPLETED, results[0].message
    assert {'observe_prefill', 'observe_evict', 'observe_decode'} <= set(observed)
    return {'LlmEngine.prefill', 'JobRunner.timed_now', 'StepTimer.should_stop',
            'DecodeBatch.join', 'DecodeBatch._finish'}


def _observed(observed, name, method):
    """Return ``method`` that notes ``name`` when called (the time model's observations)."""
    def call(*args, **kwargs):
        observed.append(name)
        return method(*args, **kwargs)
    return call


def enginebench(timeline, monkeypatch, tiny_model, smollm2_tokenizer, tmp_path):
    """bench/engine.py: decode, batched steps, prefill and the copy bandwidth."""
    monkeypatch.setattr(bench_engine, 'time', timeline.time_module())
    monkeypatch.setattr(torch.Tensor, 'copy_',
                        _working(timeline, 'copy_', torch.Tensor.copy_))
    engines = {'lean fp32': _engine(tiny_model, smollm2_tokenizer, timeline)}
    rows = {name: bench_engine.Row(name) for name in engines}
    quiet = (lambda line: None)
    bench_engine._measure_decode(engines, rows, (32,), 1, 2, quiet)
    bench_engine._measure_batches(engines, rows, (1, 2), 1, 2, quiet)
    bench_engine._measure_prefill(engines, rows, (32,), 1, quiet)
    assert rows['lean fp32'].batch_s and rows['lean fp32'].decode_s
    bench_engine.copy_bandwidth_gbs(megabytes=1, repeats=2)
    return {'_measure_batches', 'copy_bandwidth_gbs', 'LlmEngine.prefill',
            'DecodeBatch._finish'}


def latency_study(timeline, monkeypatch, tiny_model, smollm2_tokenizer, tmp_path):
    """latency/: the hardware roofline probe and the measured grid of probes."""
    monkeypatch.setattr(hardware, 'time', timeline.time_module())
    monkeypatch.setattr(torch, 'mm', _working(timeline, 'mm', torch.mm))
    monkeypatch.setattr(torch.Tensor, 'copy_',
                        _working(timeline, 'copy_', torch.Tensor.copy_))
    hardware.measure_hardware('cpu', matmul_n=32, copy_mb=1, repeats=2)
    engine = _engine(tiny_model, smollm2_tokenizer, timeline)
    harness.measure_grid(engine, (16, 32), 3, repeats=1, cooldown_s=0.0,
                         sleep=lambda seconds: None, clock=timeline.clock)
    return {'_best_s', 'measure_hardware', 'measure_grid', 'LlmEngine.prefill',
            'StepTimer.should_stop'}


SITES = [step_format_probe, engine_measurements, calibration, online_time_model, enginebench,
         latency_study]


@pytest.mark.parametrize('site', SITES, ids=[site.__name__ for site in SITES])
def test_every_timing_read_follows_a_synchronize(site, timeline, monkeypatch, tiny_model,
                                                 smollm2_tokenizer, tmp_path):
    expected = site(timeline, monkeypatch, tiny_model, smollm2_tokenizer, tmp_path)
    assert expected <= timeline.callers(), sorted(timeline.callers())
    assert any(kind == 'work' for kind, _, _ in timeline.events)
    assert timeline.unsynchronized() == []


def _remove_helper(monkeypatch, *modules):
    for module in modules:
        monkeypatch.setattr(module, 'synchronize', lambda device: None)


@pytest.mark.parametrize('site', SITES, ids=[site.__name__ for site in SITES])
def test_the_check_finds_a_missing_synchronize(site, timeline, monkeypatch, tiny_model,
                                               smollm2_tokenizer, tmp_path):
    """The control: with the site's synchronize a no-op, its timing reads are caught."""
    _no_engine_sync(monkeypatch)
    _remove_helper(monkeypatch, bench_engine, hardware)
    expected = site(timeline, monkeypatch, tiny_model, smollm2_tokenizer, tmp_path)
    assert not any(kind == 'sync' for kind, _, _ in timeline.events)
    missed = set(timeline.unsynchronized())
    assert expected <= missed, (sorted(missed), sorted(expected))


def test_the_runner_alone_is_caught_without_its_synchronize(
        timeline, monkeypatch, tiny_model, smollm2_tokenizer, tmp_path):
    """A finer control: only the runner's own timing reads skip the synchronize."""
    from timebill_ros.server.runner import JobRunner

    def timed_now(self):
        return self.clock()

    monkeypatch.setattr(JobRunner, 'timed_now', timed_now)
    online_time_model(timeline, monkeypatch, tiny_model, smollm2_tokenizer, tmp_path)
    assert 'JobRunner.timed_now' in timeline.unsynchronized()


def test_a_device_fault_in_a_synchronize_fails_the_goal_and_the_server_serves_on(
        tiny_model, smollm2_tokenizer):
    """A CUDA error raised by a synchronize fails its goal (FAILED, the error named).

    The synchronizes added for timing run outside a goal's own fault handling too
    (``JobRunner.timed_now`` stamps its start and end): the executor ends such a goal FAILED
    and goes on serving.
    """
    config = ServerConfig(engine=EngineConfig(max_new_tokens=4, prefill_chunk_tokens=16))
    engine = LlmEngine(config.engine, config.eviction, model=tiny_model,
                       tokenizer=smollm2_tokenizer)
    service = TimeBillService(config, engine, FallbackPredictor(), COEFFS)
    service.start()
    try:
        for fault in (True, False):
            if fault:
                def synchronize():
                    raise RuntimeError('CUDA error: an illegal memory access was encountered')
                engine.synchronize = synchronize
            else:
                del engine.synchronize
            done, results = threading.Event(), []
            service.submit(GoalRequest(PROMPT, budget_s=1e6), lambda feedback: None,
                           lambda result: (results.append(result), done.set()))
            assert done.wait(60), 'no result'
            if fault:
                assert results[0].status == status.FAILED
                assert 'CUDA error' in results[0].message
            else:
                assert results[0].status == status.COMPLETED, results[0].message
    finally:
        service.shutdown()
