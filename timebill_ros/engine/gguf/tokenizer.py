"""The tokenizer a GGUF file describes, built with HF ``tokenizers`` to match llama.cpp's.

Why not transformers' own GGUF conversion: for Gemma 3 it gives wrong ids (no BOS, other
pieces: "The capital of France is" -> 10 ids where llama.cpp gives 6), so the model answers
garbage. This module reads the vocabulary itself and builds the same two tokenizers llama.cpp
runs, with the maintained ``tokenizers`` library doing the merging:

* ``tokenizer.ggml.model = gpt2`` (Llama 3, Qwen 2/3, SmolLM2, Phi-4): byte-level BPE with the
  file's merges, after the pre-tokenizer regexes llama.cpp uses for ``tokenizer.ggml.pre``
  (each regex splits the pieces of the one before it, matches and the text between kept).
* ``tokenizer.ggml.model = llama`` (SentencePiece: Gemma 3, Phi-3, Llama 2): spaces become
  U+2581, an optional leading one (``add_space_prefix``), then the highest-scoring adjacent pair
  whose concatenation is a token merges first, ties leftmost; characters outside the
  vocabulary fall back to byte tokens. That is BPE with one merge per (left, right) split of
  every token, ranked by the merged token's score, which ``tokenizers``' BPE runs (it too takes
  the lowest rank first, ties leftmost).

Control and user-defined tokens (``token_type`` 3 and 4) are matched in the text before the
model runs, as llama.cpp does with special tokens parsed; a BOS is added in front when the file
says ``add_bos_token`` (``tokenizer(text)``; ``add_special_tokens=False`` adds none).
The tests compare the ids with llama-cpp-python's on both real files.
"""

import array
import os
import tempfile
from typing import Dict, List, Sequence, Tuple

import numpy as np

from timebill_ros.engine.gguf.file import chat_template, GgufFile

SPACE = '\u2581'  # SentencePiece's visible space
CONTROL, USER_DEFINED, BYTE = 3, 4, 6  # llama.cpp token types

# llama.cpp's contraction / letters / numbers / punctuation split (GPT-2's).
_GPT2 = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)")
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> the regexes llama.cpp splits with, in order (llama-vocab.cpp's table,
# for the families the engine serves). A pre type not listed is refused.
PRE_TOKENIZERS = {
    'default': (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    'gpt2': (_GPT2,),
    'smollm': (r"\p{N}", _GPT2),
    'starcoder': (r"\p{N}", _GPT2),
    'llama-bpe': (_LLAMA3,),
    'llama3': (_LLAMA3,),
    'qwen2': (_QWEN2,),
    'gpt-4o': (_LLAMA3,),
}
# Pre types whose BPE takes a whole piece that is a token without merging (llama.cpp's
# ignore_merges).
IGNORE_MERGES = ('llama-bpe', 'llama3')


def build_tokenizer(gguf: GgufFile):
    """Return a ``transformers.PreTrainedTokenizerFast`` for ``gguf``'s vocabulary.

    It carries the file's chat template (None when the file has none), BOS / EOS / UNK / PAD.
    ValueError for a tokenizer model or pre-tokenizer this module does not build.
    """
    from transformers import PreTrainedTokenizerFast

    kind = gguf.get('tokenizer.ggml.model')
    tokens: List[str] = list(gguf.get('tokenizer.ggml.tokens') or ())
    if not tokens:
        raise ValueError(f'{gguf.path.name} has no tokenizer.ggml.tokens')
    types = _listed(gguf, 'tokenizer.ggml.token_type', [1] * len(tokens))
    if kind == 'gpt2':
        backend = _byte_level_bpe(gguf, tokens)
    elif kind == 'llama':
        backend = _sentencepiece_bpe(gguf, tokens, types)
    else:
        raise ValueError(f'{gguf.path.name}: tokenizer.ggml.model {kind!r} is not supported '
                         f"(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)")
    _add_special_tokens(backend, tokens, types)
    specials = _special_tokens(gguf, tokens)
    if gguf.get('tokenizer.ggml.add_bos_token', False) and 'bos_token' in specials:
        _add_bos(backend, specials['bos_token'], tokens.index(specials['bos_token']))
    # Through a file: tokenizer_object would be deep-copied (one more vocabulary in memory).
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, 'tokenizer.json')
        backend.save(path)
        del backend
        return PreTrainedTokenizerFast(tokenizer_file=path, chat_template=chat_template(gguf),
                                       clean_up_tokenization_spaces=False, **specials)


def _listed(gguf: GgufFile, key: str, default: list) -> list:
    """Return metadata array ``key`` as a list (``default`` when the file has none)."""
    value = gguf.get(key)
    return default if value is None else list(value.tolist() if hasattr(value, 'tolist')
                                              else value)


def _special_tokens(gguf: GgufFile, tokens: Sequence[str]) -> Dict[str, str]:
    """Return {'bos_token': text, ...} of the ids the file names (ids in range only)."""
    out = {}
    for role in ('bos', 'eos', 'unknown', 'padding'):
        token_id = gguf.get(f'tokenizer.ggml.{role}_token_id')
        if isinstance(token_id, int) and 0 <= token_id < len(tokens):
            name = {'unknown': 'unk', 'padding': 'pad'}.get(role, role)
            out[f'{name}_token'] = tokens[token_id]
    return out


def _byte_level_bpe(gguf: GgufFile, tokens: List[str]):
    """Return the byte-level BPE of a ``gpt2`` tokenizer (vocabulary, merges, regexes)."""
    from tokenizers import decoders, models, pre_tokenizers, Regex, Tokenizer
    pre = gguf.get('tokenizer.ggml.pre', 'default') or 'default'
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f'{gguf.path.name}: tokenizer.ggml.pre {pre!r} is not supported '
                         f'(supported: {", ".join(sorted(PRE_TOKENIZERS))})')
    merges = [tuple(m.split(' ', 1)) for m in gguf.get('tokenizer.ggml.merges') or ()]
    vocab = {token: i for i, token in enumerate(tokens)}
    model = models.BPE(vocab, merges, ignore_merges=pre in IGNORE_MERGES)
    backend = Tokenizer(model)
    splits = [pre_tokenizers.Split(Regex(r), behavior='isolated') for r in PRE_TOKENIZERS[pre]]
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_bpe(gguf: GgufFile, tokens: List[str], types: List[int]):
    """Return the score-ranked BPE of a ``llama`` (SentencePiece) tokenizer."""
    from tokenizers import decoders, models, normalizers, Tokenizer
    scores = _listed(gguf, 'tokenizer.ggml.scores', [0.0] * len(tokens))
    vocab = {token: i for i, token in enumerate(tokens)}
    unk_id = gguf.get('tokenizer.ggml.unknown_token_id')
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    model = models.BPE(vocab, _merges_by_score(tokens, types, scores, vocab), unk_token=unk,
                       byte_fallback=True, fuse_unk=True)
    backend = Tokenizer(model)
    prefix = bool(gguf.get('tokenizer.ggml.add_space_prefix', True))
    steps = [normalizers.Prepend(SPACE)] if prefix else []
    backend.normalizer = normalizers.Sequence(steps + [normalizers.Replace(' ', SPACE)])
    decode = [decoders.Replace(SPACE, ' '), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        decode.append(decoders.Strip(' ', 1, 0))
    backend.decoder = decoders.Sequence(decode)
    return backend


def _merges_by_score(tokens: List[str], types: List[int], scores: List[float],
                     vocab: Dict[str, int]) -> List[Tuple[str, str]]:
    """Return every (left, right) split of every token into two tokens, best score first.

    Control and byte tokens are never merged into (llama.cpp's text never holds them between
    merges: specials are split out first, bytes are only a fallback).
    """
    # (token id, cut) pairs in two compact arrays, ranked with numpy: a list of tuples of the
    # ~515k merges of Gemma 3's vocabulary held ~200 MB more at the peak.
    ids, cuts = array.array('l'), array.array('l')
    for token_id, token in enumerate(tokens):
        if types[token_id] in (CONTROL, BYTE) or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            if token[:cut] in vocab and token[cut:] in vocab:
                ids.append(token_id)
                cuts.append(cut)
    ids, cuts = np.frombuffer(ids, np.int64), np.frombuffer(cuts, np.int64)
    order = np.lexsort((ids, -np.asarray(scores, np.float64)[ids]))  # best score, then id
    ranked = zip(ids[order].tolist(), cuts[order].tolist())
    return [(tokens[i][:c], tokens[i][c:]) for i, c in ranked]


def _add_special_tokens(backend, tokens: Sequence[str], types: Sequence[int]) -> None:
    """Match control and user-defined tokens in the text before the model (llama.cpp's)."""
    from tokenizers import AddedToken
    added = [AddedToken(tokens[i], special=types[i] == CONTROL, normalized=False)
             for i in range(len(tokens)) if types[i] in (CONTROL, USER_DEFINED) and tokens[i]]
    backend.add_tokens(added)


def _add_bos(backend, bos: str, bos_id: int) -> None:
    """Put ``bos`` in front of every sequence encoded with special tokens."""
    from tokenizers import processors
    backend.post_processor = processors.TemplateProcessing(
        single=f'{bos} $A', pair=f'{bos} $A $B', special_tokens=[(bos, bos_id)])


def eos_token_ids(gguf: GgufFile) -> List[int]:
    """Return the file's EOS and end-of-turn ids (``eos_token_id``, ``eot_token_id``)."""
    ids = [gguf.get(f'tokenizer.ggml.{k}_token_id') for k in ('eos', 'eot', 'eom')]
    return sorted({i for i in ids if isinstance(i, int)})
