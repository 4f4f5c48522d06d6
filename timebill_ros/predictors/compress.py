"""Prompt compression for the length predictor (TimeBill Sec. 5.2).

The predictor must answer before the prefill ends, so its input x_p is capped at N_p tokens
(``max_predictor_tokens`` in the server, solved from the fitted t^_Predict(N_p) <=
t^_prefill(N_x)). We compress by keeping the head and the tail of the token ids and dropping
the middle. Why this and not a learned compressor (LLMLingua-style token dropping): a learned
compressor is itself an LM pass over the whole prompt, which costs the time we are trying to
save; robot prompts put the instruction at the start or the end (question after a log, "answer
yes or no" last, "Summarize ..." first), and the chat template's final assistant header, which
the RLP pools, is always in the tail. The same function is used in training, so the RLP learns
on what it sees in service.
"""

from typing import List, Sequence


def compress_ids(input_ids: Sequence[int], max_tokens: int) -> List[int]:
    """Return at most ``max_tokens`` ids: the first half and the last half of the prompt.

    Args:
        input_ids: chat-formatted prompt token ids, length N_x.
        max_tokens: N_p, the most ids the predictor may read, >= 2.

    Returns:
        ``input_ids`` unchanged when N_x <= N_p, else head ``N_p // 2`` + tail ids.

    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 2:
        raise ValueError(f'max_tokens must be an int >= 2, got {max_tokens!r}')
    ids = list(input_ids)
    if len(ids) <= max_tokens:
        return ids
    head = max_tokens // 2
    return ids[:head] + ids[len(ids) - (max_tokens - head):]
