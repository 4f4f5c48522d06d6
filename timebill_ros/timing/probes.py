"""The calibration's measurements on an LlmEngine: prefill, decoding step, batch step, probe.

Calibration (profiler.py, few_shot.py, batch.py) and the latency study time an engine
through four methods: ``measure_prefill_s``, ``measure_decode_step_s``,
``measure_batch_step_s`` and ``measure_probe``. :class:`EngineProbes` implements them on an
LlmEngine with the engine's own prefill and decode loop (stop checks, text streaming and a
feedback callback included), so each figure covers what the server pays; another engine
(llama.cpp's in bench/, a test's fake) implements them itself. :func:`probes_of` gives the
measuring side of either.
"""

import statistics

from timebill_ros.checks import check_count
from timebill_ros.engine.llm_engine import LlmEngine
from timebill_ros.engine.probe import Probe
from timebill_ros.engine.stopping import StepTimer, StopCriteria


def probes_of(engine):
    """Return what measures ``engine``: EngineProbes for an LlmEngine, else the engine."""
    return EngineProbes(engine) if isinstance(engine, LlmEngine) else engine


class EngineProbes:
    """Timed runs of random non-special tokens on one LlmEngine (``engine``), seconds."""

    def __init__(self, engine: LlmEngine):
        if not isinstance(engine, LlmEngine):
            raise TypeError(f'engine must be an LlmEngine, got {engine!r}')
        self.engine = engine

    @property
    def context_tokens(self) -> int:
        """Most positions the engine's model handles, tokens."""
        return self.engine.context_tokens

    @property
    def engine_config(self):
        """The engine's EngineConfig (``auto`` choices resolved): what keys a calibration."""
        return self.engine.engine_config

    def measure_prefill_s(self, n_x: int, repeats: int = 1) -> float:
        """Return the median seconds to prefill ``n_x`` random non-special tokens."""
        engine = self.engine
        check_count('n_x', n_x, maximum=engine.context_tokens)
        check_count('repeats', repeats)
        ids = engine.random_ids(n_x)
        return statistics.median(
            engine.prefill(ids, StopCriteria()).prefill_s for _ in range(repeats))

    def measure_decode_step_s(self, n_kv: int, steps: int = 8) -> float:
        """Return the mean seconds of one decoding step with ``n_kv`` tokens cached.

        The cache is filled by a prefill of ``n_kv`` random tokens (not timed). The steps run
        through the engine's decode itself - stop checks, text streaming and a feedback
        callback included - so the estimate covers what the server pays per token, not only
        the model's forward. The cache grows by one token per step.
        """
        engine = self.engine
        check_count('steps', steps)
        check_count('n_kv', n_kv, maximum=engine.context_tokens - steps - 1)
        state = engine.prefill(engine.random_ids(n_kv), StopCriteria())
        out = engine.decode(state, steps + 1, StopCriteria(), on_tokens=lambda n, text: None,
                            feedback_every=engine.engine_config.feedback_every_tokens)
        # Token 1 comes from the prefill; each further token is one decoding step.
        return out.decode_s / (len(out.token_ids) - 1)

    def measure_batch_step_s(self, batch_size: int, n_kv: int, steps: int = 4) -> float:
        """Return the mean seconds of one decoding step of ``batch_size`` goals together.

        Each goal is a prefill of ``n_kv`` random tokens (not timed); the first step is not
        timed either; then ``steps`` steps of the engine's own batch.
        """
        engine = self.engine
        check_count('batch_size', batch_size, maximum=engine.forward.max_batch)
        check_count('steps', steps)
        check_count('n_kv', n_kv, maximum=engine.context_tokens - steps - 2)
        batch = engine.new_batch()
        for _ in range(batch_size):
            batch.join(engine.prefill(engine.random_ids(n_kv), StopCriteria()), steps + 2,
                       StopCriteria())
        batch.step()
        engine.synchronize()
        start = engine.clock()
        for _ in range(steps):
            batch.step()
        engine.synchronize()
        return (engine.clock() - start) / steps

    def measure_probe(self, n_in: int, n_out: int) -> Probe:
        """Time one generation of exactly ``n_out`` tokens after ``n_in`` random tokens.

        The server's own prefill and decode loop run (stop checks, text streaming and a
        feedback callback included); no KV eviction; EOS does not stop it, so the answer is
        exactly ``n_out`` tokens. Returns the prefill seconds and each decoding step's
        seconds.
        """
        engine = self.engine
        check_count('n_out', n_out)
        check_count('n_in', n_in, maximum=engine.context_tokens - n_out + 1)
        state = engine.prefill(engine.random_ids(n_in), StopCriteria())
        timer = StepTimer(engine.clock, sync=engine.synchronize)
        engine.decode(state, n_out, StopCriteria([timer]), on_tokens=lambda n, text: None,
                      feedback_every=engine.engine_config.feedback_every_tokens)
        return Probe(n_in, n_out, state.prefill_s, tuple(timer.step_durations_s()))
