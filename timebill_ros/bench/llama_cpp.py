"""The llama.cpp row of ``timebill enginebench`` (needs the optional ``llama-cpp-python``).

llama.cpp runs the embedded model's own file (SmolLM2-135M-Instruct, Q4_1 GGUF: the same
weights our engine de-quantizes to fp32) with the same thread count. Decode: seconds per
token of ``Llama.eval`` of one token at a time after a prompt of N_KV random tokens (no
sampling, stop checks or detokenising: the bare model step). Prefill: ``Llama.eval`` of N_x
random tokens in batches of 512. Greedy agreement: our chat-template token ids fed in, the
argmax of each step's logits fed back. llama.cpp's KV API removes position ranges across all
layers at once (PLATFORM.md), so it could not host our per-layer eviction; the row is here
only for speed.
"""

import pathlib
import time

import numpy as np

N_BATCH = 512  # llama.cpp's prefill batch (its default)


def available() -> bool:
    """Return True when llama-cpp-python imports."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


class LlamaCppEngine:
    """A GGUF file on llama.cpp (the embedded one by default): the calls enginebench times."""

    name = 'llama.cpp Q4_1'

    def __init__(self, threads: int, context_tokens: int, model_path=None):
        """Load ``model_path`` (None: the embedded GGUF) with ``threads`` threads.

        context_tokens: llama.cpp's context size. With a file given, the row is named
        ``llama.cpp <file name>``.
        """
        from llama_cpp import Llama

        from timebill_ros.engine.model_source import embedded_gguf_path
        if model_path is not None:
            self.name = f'llama.cpp {pathlib.Path(model_path).name}'
        self.llm = Llama(model_path=str(model_path or embedded_gguf_path()),
                         n_ctx=context_tokens, n_threads=threads, n_threads_batch=threads,
                         n_batch=N_BATCH, verbose=False)
        self.vocab = self.llm.n_vocab()
        self.rng = np.random.default_rng(0)

    def _fresh(self) -> None:
        """Empty the context: the token count and the KV cache itself.

        ``Llama.reset`` only rewinds the count, and the next ``eval`` removes the positions
        after it; a sliding-window cache (Gemma 3) cannot remove them after a long prompt
        and the next ``eval`` fails (llama_decode returned 1).
        """
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()

    def _random_ids(self, n_tokens: int) -> list:
        return [int(t) for t in self.rng.integers(100, self.vocab - 100, n_tokens)]

    def prefill_s(self, n_x: int) -> float:
        """Return seconds to evaluate ``n_x`` random prompt tokens from an empty context."""
        self._fresh()
        ids = self._random_ids(n_x)
        start = time.perf_counter()
        self.llm.eval(ids)
        return time.perf_counter() - start

    def followup_prefill_s(self, context_ids: list, followup_ids: list) -> float:
        """Return seconds to evaluate ``followup_ids`` after ``context_ids`` (not timed).

        llama.cpp's own cached context: the follow-up's tokens are the only ones evaluated.
        """
        self._fresh()
        if context_ids:
            self.llm.eval(list(context_ids))
        start = time.perf_counter()
        self.llm.eval(list(followup_ids))
        return time.perf_counter() - start

    def start_decode(self, n_kv: int) -> None:
        """Fill the context with ``n_kv`` random tokens (not timed)."""
        self._fresh()
        self.llm.eval(self._random_ids(n_kv))

    def decode_s(self, steps: int) -> float:
        """Return seconds per token of ``steps`` one-token evaluations (context grows)."""
        token = self._random_ids(1)
        start = time.perf_counter()
        for _ in range(steps):
            self.llm.eval(token)
        return (time.perf_counter() - start) / steps

    def greedy(self, input_ids: list, n_tokens: int) -> list:
        """Return ``n_tokens`` greedy token ids after ``input_ids`` (stops at none)."""
        self._fresh()
        self.llm.eval(list(input_ids))
        out = []
        for _ in range(n_tokens):
            # The last evaluated position's logits (Llama.scores is filled only with
            # logits_all, which costs a vocab-sized copy per token).
            logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.vocab,))
            token = int(np.argmax(logits))
            out.append(token)
            self.llm.eval([token])
        return out
