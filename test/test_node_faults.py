"""Faults inside the running node, over real rclpy (tiny model): issue 39's fault table.

The faults are injected by the tests' own factories (a predictor that raises, a corrupt ONNX
file, an engine whose decoding step raises), never by anything a goal can reach. Each test
asserts one terminal state per goal and a node that goes on serving afterwards. The core-level
table (every fault point of the run loop in every scheduler mode) is test_faults.py; a corrupt
cached calibration and a read-only cache folder are test_profiler.py's.
"""

import threading

from rclpy.parameter import Parameter
from ros_helpers import COEFFS, node_and_client, tiny_factory

from timebill_ros.engine import LlmEngine
from timebill_ros.predictors import FallbackPredictor, make_predictor
from timebill_ros.ros.client import TimebillClient
from timebill_ros.server import status
from timebill_ros.server.service import TimeBillService

OVERRIDES = [Parameter('engine.max_new_tokens', value=6)]


class RaisingPredictor(FallbackPredictor):
    """The fallback, except that its ``nth`` prediction raises (an ONNX run failing)."""

    def __init__(self, nth):
        super().__init__()
        self.nth, self.calls, self._lock = nth, 0, threading.Lock()

    def _maybe_raise(self):
        with self._lock:
            self.calls += 1
            if self.calls == self.nth:
                raise RuntimeError('injected: onnxruntime session run failed')

    def predict(self, prompt, input_ids, n_max):
        """Return N_max, or raise on the ``nth`` call (predict_bounds calls this too)."""
        self._maybe_raise()
        return super().predict(prompt, input_ids, n_max)


class StepFaultEngine(LlmEngine):
    """An LlmEngine whose ``nth`` decode call raises (the engine failing mid-answer)."""

    nth = 2
    calls = 0

    def decode(self, *args, **kwargs):
        """Decode, or raise on the class's ``nth`` call."""
        type(self).calls += 1
        if type(self).calls == self.nth:
            raise RuntimeError('injected: decoding step failed')
        return super().decode(*args, **kwargs)


def _ask_four(namespace, name):
    with TimebillClient(f'/{namespace}/timebill/instruct', name, wait_s=20) as llm:
        return [llm.ask(f'Plan step {i}.', budget_s=60.0) for i in range(4)]


def _check_one_fault(results, server):
    """Exactly one goal FAILED INTERNAL with a message; the rest completed; node healthy."""
    statuses = [r.status for r in results]
    assert statuses.count(status.FAILED) == 1, [(r.status, r.message) for r in results]
    assert statuses.count(status.COMPLETED) == 3, statuses
    failed = results[statuses.index(status.FAILED)]
    assert failed.error_code == status.ERROR_INTERNAL and 'injected' in failed.message
    assert server.service.healthy


def test_a_predictor_that_raises_falls_back_for_its_goal_and_the_node_serves_on(
        tiny_model, smollm2_tokenizer):
    """The goal it hits runs on N^ = N_max and says why; the predictor serves the next ones."""
    predictor = RaisingPredictor(nth=2)
    factory = tiny_factory(tiny_model, smollm2_tokenizer, predictors=[predictor])
    with node_and_client(factory, 'nf_predict', OVERRIDES, 'nf_predict_client',
                         through_faults=True) as (server, _, spinner):
        results = _ask_four('nf_predict', 'nf_predict_planner')
        assert [r.status for r in results] == [status.COMPLETED] * 4
        said = [r.predictor for r in results]
        assert said[1] == ('fallback (predictor error: RuntimeError: injected: onnxruntime '
                           'session run failed)'), said
        assert said[0] == said[2] == said[3] == predictor.name, said
        assert predictor.calls == 4
        assert server.service.healthy and spinner.is_alive()


def test_the_engine_raising_mid_answer_fails_its_goal_and_the_node_serves_on(
        tiny_model, smollm2_tokenizer):
    StepFaultEngine.calls = 0
    factory = tiny_factory(tiny_model, smollm2_tokenizer, engine_cls=StepFaultEngine)
    with node_and_client(factory, 'nf_engine', OVERRIDES, 'nf_engine_client',
                         through_faults=True) as (server, _, spinner):
        results = _ask_four('nf_engine', 'nf_engine_planner')
        _check_one_fault(results, server)
        assert spinner.is_alive()


def test_a_corrupt_onnx_predictor_file_serves_with_the_fallback_saying_why(
        tiny_model, smollm2_tokenizer, tmp_path):
    corrupt = tmp_path / 'rlp.onnx'
    corrupt.write_bytes(b'\x08\x07 not a protobuf ' * 64)

    def factory(config, log):
        engine = LlmEngine(config.engine, config.eviction, model=tiny_model,
                           tokenizer=smollm2_tokenizer)
        predictor = make_predictor(config.predictor, engine.model_key, log=log)
        return TimeBillService(config, engine, predictor, COEFFS)

    overrides = OVERRIDES + [Parameter('predictor.kind', value='rlp'),
                             Parameter('predictor.model_file', value=str(corrupt))]
    with node_and_client(factory, 'nf_onnx', overrides, 'nf_onnx_client',
                         through_faults=True) as (server, _, spinner):
        results = _ask_four('nf_onnx', 'nf_onnx_planner')
        assert [r.status for r in results] == [status.COMPLETED] * 4
        assert all(r.predictor.startswith('fallback (rlp unavailable: ') for r in results)
        assert server.service.healthy and spinner.is_alive()
