"""The trained RLP, run with onnxruntime on the CPU alongside the prefill (CUDA if asked).

Prompt compression (TimeBill Sec. 5.2): t^_Predict(N_p) = a_p N_p^2 + b_p N_p + c_p is fitted
at load time by timing the session on random ids; each call reads at most the largest N_p with
t^_Predict(N_p) <= t^_prefill(N_x), clamped to [min_input_tokens, max_input_tokens], and
:func:`compress_ids` keeps the head and tail of the prompt (see predictors/compress.py for why).
"""

import dataclasses
import math
import pathlib
import statistics
import threading
import time
from typing import Callable, Optional, Sequence

import numpy as np

from timebill_ros.predictors.base import LengthPredictor
from timebill_ros.predictors.compress import compress_ids
from timebill_ros.predictors.contract import (INPUT_NAME, load_for, OUTPUT_NAME,
                                              predictor_paths, read_metadata)
from timebill_ros.predictors.length_distribution import OutputFormat
from timebill_ros.timing.model import fit_prefill

TIMING_LENGTHS = (16, 64, 256, 512, 1024, 2048)  # N_p probed for the t^_Predict fit, tokens
TIMING_REPEATS = 3
PROVIDERS = {'cpu': ['CPUExecutionProvider'],
             'cuda': ['CUDAExecutionProvider', 'CPUExecutionProvider']}


@dataclasses.dataclass(frozen=True)
class PredictorTiming:
    """t^_Predict(N_p) = a_p N_p^2 + b_p N_p + c_p; a_p s/token^2, b_p s/token, c_p s."""

    a_p: float
    b_p: float
    c_p: float

    def predict_s(self, n_p: int) -> float:
        """Return the predicted predictor time for ``n_p`` input tokens, seconds."""
        return self.a_p * n_p * n_p + self.b_p * n_p + self.c_p

    def max_tokens_within(self, t_s: float) -> int:
        """Return the largest N_p >= 0 with t^_Predict(N_p) <= ``t_s`` seconds (0 if none)."""
        if t_s < self.c_p:
            return 0
        if self.a_p == 0.0:
            return math.inf if self.b_p == 0.0 else int((t_s - self.c_p) / self.b_p)
        root = (-self.b_p + math.sqrt(self.b_p ** 2 + 4 * self.a_p * (t_s - self.c_p)))
        return int(root / (2 * self.a_p))


# The run option that gives onnxruntime's CPU arena back at the end of a call (run()).
ARENA_SHRINKAGE = ('memory.enable_memory_arena_shrinkage', 'cpu:0')


def resolve_providers(provider: str) -> list:
    """Return the onnxruntime providers of ``predictor.provider`` ``provider``.

    ``auto`` and ``cpu``: ``CPUExecutionProvider`` only, on a GPU robot too (onnxruntime-gpu
    installed). The predictor runs *beside* the prefill (TimeBill Sec. 5.2): on a Jetson the
    GPU is busy with that very prefill, so a predictor call there would queue behind it (or
    slow it) instead of overlapping it; and the RLP is a small model, so a call on the GPU
    pays host-device copies and kernel launches that cost more than its arithmetic saves
    (the design's reasoning; not measured on a GPU here). ``cuda``: onnxruntime's CUDA
    provider, with the CPU as its fallback (what onnxruntime uses where CUDA is missing).
    """
    if provider not in PROVIDERS and provider != 'auto':
        raise ValueError(f'provider must be auto, cpu or cuda, got {provider!r}')
    return list(PROVIDERS['cpu' if provider == 'auto' else provider])


def trained_input_tokens(meta) -> int:
    """Return the N_p an RLP file was trained at (its ``max_input_tokens``), tokens; 0: unknown."""
    text = meta.get('max_input_tokens', '0') or '0'
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f'RLP metadata max_input_tokens must be an int >= 0, got {text!r}')
    return value


class OnnxRlpPredictor(LengthPredictor):
    """N^ from the exported RLP (Eq. 2), with prompt compression.

    Args:
        session: an onnxruntime InferenceSession of an RLP export.
        prefill_s: N_x (tokens) -> t^_prefill in seconds (Eq. 4a); None = no compression
            beyond ``max_input_tokens``.
        timing: the t^_Predict fit; None = fit it now (about a few seconds).
        min_input_tokens / max_input_tokens: clamp of N_p, tokens; max_input_tokens is lowered
            to the N_p the file was trained at (its ``max_input_tokens`` metadata), if smaller.

    """

    name = 'rlp'

    def __init__(self, session, prefill_s: Optional[Callable[[int], float]] = None,
                 timing: Optional[PredictorTiming] = None, min_input_tokens: int = 64,
                 max_input_tokens: int = 2048):
        if not 2 <= min_input_tokens <= max_input_tokens:
            raise ValueError(f'need 2 <= min_input_tokens <= max_input_tokens, got '
                             f'{min_input_tokens!r} and {max_input_tokens!r}')
        # One call at a time: a call's activations grow with N_p^2 (attention) and a node calls
        # from up to three threads (each runner's prediction, the queue's uncertainty). The
        # embedded model's RLP on 2048-token prompts: one call peaked at +380 MB resident,
        # three at once at +1.1 GB (bench/studies/rlp_call_memory.py; the soak's node stepped up
        # ~420 MB after its predictor swap). A caller waits at most its predictor.timeout_s
        # (then the fallback N^).
        self._run_lock = threading.Lock()
        self.session = session
        meta = read_metadata(session)
        self.format = OutputFormat.from_metadata(meta)
        self.model_key = meta.get('model_key', '')
        # Token ids the embedding takes (files exported before it was stored: >= 1000).
        self.vocab_size = int(meta.get('vocab_size') or 1000)
        self.prefill_s = prefill_s
        # Never longer inputs than the training's N_p (its compress_ids cap): the RLP saw none,
        # and a call's activations grow with N_p^2. The embedded model's RLP was trained at 512
        # tokens and read up to 2048 here: +380 MB a call (bench/studies/rlp_call_memory.py).
        self.trained_input_tokens = trained_input_tokens(meta)
        if self.trained_input_tokens:
            max_input_tokens = min(max_input_tokens, self.trained_input_tokens)
            min_input_tokens = min(min_input_tokens, max_input_tokens)
        self.min_input_tokens = min_input_tokens
        self.max_input_tokens = max_input_tokens
        self.timing = timing or self.fit_timing()
        self.last_input_tokens = 0
        self._run_options = None

    @classmethod
    def from_config(cls, predictor_config, model_key='', prefill_s=None, cache_dir=None,
                    log=print):
        """Load ``predictor.model_file`` (or the cache's file of ``model_key``); see base."""
        path = predictor_paths(predictor_config, model_key, cache_dir)['RLP']
        predictor = load_for(cls, path, predictor_config, model_key, prefill_s=prefill_s,
                             min_input_tokens=predictor_config.min_input_tokens,
                             max_input_tokens=predictor_config.max_input_tokens)
        timing = predictor.timing
        log(f'RLP loaded from {path}: t^_Predict(N_p) = {timing.a_p:.3g} N_p^2 + '
            f'{timing.b_p:.3g} N_p + {timing.c_p:.3g} s; reads N_p <= '
            f'{predictor.max_input_tokens} tokens')
        return predictor

    @classmethod
    def load(cls, path, threads: int = 1, provider: str = 'auto', **kwargs):
        """Open the ONNX file at ``path`` with ``threads`` intra-op threads; see __init__."""
        import onnxruntime
        path = pathlib.Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f'no RLP at {path}: build it with `timebill predictor train --export`')
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(str(path), options,
                                               providers=resolve_providers(provider))
        return cls(session, **kwargs)

    def run(self, input_ids: Sequence[int]) -> np.ndarray:
        """Return the raw output (C,) for ids (already compressed)."""
        import onnxruntime
        ids = np.asarray([list(input_ids)], dtype=np.int64)
        # One RunOptions per call, so that abort() ends this call and no later one.
        with self._run_lock:
            options = self._run_options = onnxruntime.RunOptions()
            # Give the CPU arena back after each call: its activations grow with N_p^2, and
            # the arena otherwise keeps the largest call's for good. A 4000-token prompt held
            # 1.7 GB afterwards, 166 MB with this, at the same speed (2026-11-27, the embedded
            # model's RLP; docs/reliability.md).
            options.add_run_config_entry(*ARENA_SHRINKAGE)
            return self.session.run([OUTPUT_NAME], {INPUT_NAME: ids}, options)[0][0]

    def abort(self):
        """Terminate the onnxruntime call in flight (it raises in its own thread).

        Calls run one at a time (:meth:`run`): the one in flight, whichever thread made it.
        """
        options = self._run_options
        if options is not None:
            options.terminate = True

    def expected_time_s(self, n_x):
        """Return t^_Predict(N_p) for the N_p this predictor reads of an n_x-token prompt."""
        return self.timing.predict_s(min(n_x, self.input_cap(n_x)))

    def fit_timing(self, lengths=TIMING_LENGTHS, repeats=TIMING_REPEATS) -> PredictorTiming:
        """Time the session at several N_p and fit t^_Predict (Sec. 5.2); return the fit."""
        rng = np.random.default_rng(0)
        lengths = [n for n in lengths if n <= self.max_input_tokens] or [self.max_input_tokens]
        n_points, t_points = [], []
        high = min(1000, self.vocab_size)  # ids any vocabulary holds
        self.run(rng.integers(high // 10, high, size=8))  # warm-up
        for n_p in sorted(set(lengths) | {2, self.max_input_tokens}):
            ids = rng.integers(high // 10, high, size=n_p)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                self.run(ids)
                times.append(time.perf_counter() - start)
            n_points.append(n_p)
            t_points.append(statistics.median(times))
        return PredictorTiming(*fit_prefill(n_points, t_points))

    def input_cap(self, n_x: int) -> int:
        """Return N_p for a prompt of ``n_x`` tokens (hidden behind t^_prefill if possible)."""
        cap = self.max_input_tokens
        if self.prefill_s is not None:
            cap = min(cap, self.timing.max_tokens_within(self.prefill_s(n_x)))
        return max(self.min_input_tokens, cap)

    def to_tokens(self, output: np.ndarray, n_max: int, q: Optional[float] = None) -> int:
        """Return N^ (or with ``q`` N^_q) of one output, tokens (OutputFormat.to_tokens)."""
        return self.format.to_tokens(output, n_max, q)

    def _output(self, input_ids):
        ids = compress_ids(input_ids, self.input_cap(len(input_ids)))
        self.last_input_tokens = len(ids)
        return self.run(ids)

    def predict(self, prompt, input_ids, n_max):
        """Return N^ for the chat-formatted ``input_ids`` (compressed to input_cap tokens)."""
        return self.to_tokens(self._output(input_ids), n_max)

    def predict_bounds(self, prompt, input_ids, n_max, q):
        """Return (N^, N^_q) from one run: the readout and the q-quantile bucket (Eq. 2 both).

        The regression variant has no distribution: N^_q is None.
        """
        return self.format.bounds(self._output(input_ids), n_max, q)
