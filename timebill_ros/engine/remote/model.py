"""The robot's side of a remotely served model: its tokenizer, its context, its cached head.

The model runs on an existing serving engine (engine/remote/client.py); what admission, the
length predictor and the time model need runs here: N_x from the model's own tokenizer and
chat template (``engine.model_path``: the model's GGUF or a transformers directory; empty:
the embedded SmolLM2 GGUF), the context length, and the prompt head the engine still holds
from the last request this node sent (its prompt cache: llama.cpp keeps the tokens of its
last request and prefills only what differs; vLLM's prefix caching does the same per block).
"""

import pathlib
import threading

from timebill_ros.engine import model_source
from timebill_ros.engine.chat import chat_text, chat_turns, encode_chat
from timebill_ros.engine.prefix_store import PrefixMatch


def load_tokenizer(engine_config):
    """Return ``(tokenizer, context_tokens)`` of ``engine.model_path``, without its weights.

    A ``.gguf`` file (or the embedded GGUF) gives the tokenizer and chat template it holds
    and its ``context_length``; a transformers directory its tokenizer and
    ``max_position_embeddings``.
    """
    path = engine_config.model_path
    if not path or model_source.is_gguf_file(path):
        from timebill_ros.engine.gguf.file import GgufFile
        from timebill_ros.engine.gguf.tokenizer import build_tokenizer
        gguf_path = (pathlib.Path(path).expanduser() if path
                     else model_source.embedded_gguf_path())
        gguf = GgufFile(gguf_path)
        return build_tokenizer(gguf), int(gguf.arch_get('context_length', 4096))
    from transformers import AutoConfig, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    return tokenizer, int(getattr(config, 'max_position_embeddings', 4096))


def common_head(a, b) -> int:
    """Return how many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for index in range(n):
        if a[index] != b[index]:
            return index
    return n


class RemoteModel:
    """What the service reads from an engine, for a model served remotely.

    tokenizer: the model's (load_tokenizer). context_tokens: the engine's context, tokens.
    model_key: keys the predictor files (the tokenizer model's key). name: the model id sent
    with each request. There is no prefix store here (``prefix_store`` None): the engine
    caches, and :meth:`match_prefix` estimates its cached head as the head this goal shares
    with the last prompt this node sent.
    """

    prefix_store = None

    def __init__(self, tokenizer, context_tokens: int, model_key: str, name: str):
        self.tokenizer = tokenizer
        self.context_tokens = int(context_tokens)
        self.model_key = model_key
        self.name = name
        self._last_sent = ()
        self._lock = threading.Lock()

    @classmethod
    def load(cls, engine_config, name: str) -> 'RemoteModel':
        """Return the RemoteModel of ``engine_config`` (tokenizer only) serving ``name``."""
        tokenizer, context = load_tokenizer(engine_config)
        context = engine_config.remote_context_tokens or context
        return cls(tokenizer, context, model_source.model_key(engine_config), name)

    @property
    def schemas(self):
        """Refuse json_schema goals: the remote engine's grammars are not this package's."""
        raise ValueError('json_schema is not supported with engine.backend openai: the remote '
                         'engine would have to constrain the answer itself')

    def encode(self, prompt: str, system_prompt: str = '', messages=()) -> list:
        """Return the token ids of the chat-formatted prompt (engine/chat.py)."""
        return encode_chat(self.tokenizer, prompt, system_prompt, messages)

    def prompt_text(self, prompt: str, system_prompt: str = '', messages=()) -> str:
        """Return the templated prompt text sent to ``/completions``."""
        return chat_text(self.tokenizer, prompt, system_prompt, messages)

    @staticmethod
    def chat_messages(prompt: str, system_prompt: str = '', messages=()) -> list:
        """Return the turns sent to ``/chat/completions`` (the engine applies its template)."""
        return chat_turns(prompt, system_prompt, messages)

    def match_prefix(self, input_ids, count: bool = True) -> PrefixMatch:
        """Return the head of ``input_ids`` the engine is expected to hold (tokens).

        The head shared with the last prompt sent, less its last token (the engines
        recompute the last token of a fully matched prompt). count: unused (the local store's
        hit-rate flag).
        """
        with self._lock:
            last = self._last_sent
        return PrefixMatch(n_tokens=max(0, min(common_head(input_ids, last),
                                               len(input_ids) - 1)))

    def sent(self, input_ids) -> None:
        """Record ``input_ids`` as the prompt the engine now holds."""
        with self._lock:
            self._last_sent = tuple(input_ids)

    def forget(self) -> None:
        """Assume nothing is cached (a failed request, a restarted engine)."""
        self.sent(())

    def synchronize(self) -> None:
        """Nothing queued here: timings are read at the reader thread's arrivals."""
