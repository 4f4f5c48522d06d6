"""N^_rem read again at a checkpoint: the exported decode readout, run with onnxruntime.

The head (training/heads/decode_readout.py) reads the prompt's pooled states and the
answer's (the last layer's output of every decoding step, engine.PrefillState.answer_pool)
as one pool of L + 1 layers, and gives the answer's length distribution; conditioned on the
answer not having ended after k tokens it bounds the rest (OutputFormat.rest_bounds). A
checkpoint runs it once (its time, measured at load, is ``time_s``).
"""

import numpy as np
import torch

from timebill_ros.engine.forward import HiddenPool
from timebill_ros.predictors.prefill_readout import PrefillReadout


def decode_input(prompt_pooled: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """Return one pool of L + 1 layers from the prompt's (1, 2 L H) and the answer's (1, 2 H).

    [last_1..last_L, last_answer, mean_1..mean_L, mean_answer], (1, 2 (L + 1) H) fp32.
    """
    hidden = answer.shape[-1] // 2
    if answer.shape != (1, 2 * hidden) or prompt_pooled.shape[-1] % (2 * hidden):
        raise ValueError(f'pooled states {tuple(prompt_pooled.shape)} and answer states '
                         f'{tuple(answer.shape)} do not share a hidden size')
    half = prompt_pooled.shape[-1] // 2
    prompt = prompt_pooled.reshape(1, -1).float()
    return torch.cat([prompt[:, :half], answer[:, :hidden], prompt[:, half:],
                      answer[:, hidden:]], dim=1)


class DecodeReadout(PrefillReadout):
    """(N^_rem, N^_rem,q) from the prompt's and the answer's pooled states at a checkpoint."""

    name = 'decode readout'
    reads_answer = True
    build_command = 'timebill predictor decode-readout --export'

    def __init__(self, session):
        """Use ``session`` (onnxruntime) of a ``timebill predictor decode-readout`` export."""
        super().__init__(session)
        if self.n_features % (2 * (len(self.pool_layers) + 1)):
            raise ValueError(f'a decode readout of {len(self.pool_layers)} prompt layers '
                             f'cannot take {self.n_features} inputs')

    def start(self, engine, state) -> None:
        """Make ``state``'s decoding pool its answer states (before it joins a batch)."""
        state.answer_pool = HiddenPool(engine.forward.norm_eps, (engine.n_layers,))

    def features(self, prompt_pooled, answer_pool) -> np.ndarray:
        """Return the input (1, 2 (L + 1) hidden) of :func:`decode_input`, numpy fp32.

        None while the answer pool is empty (no step has run yet).
        """
        answer = answer_pool.features() if answer_pool is not None else None
        if answer is None:
            return None
        return decode_input(prompt_pooled.cpu(), answer.cpu()).numpy()

    def rest_bounds(self, prompt_pooled, answer_pool, n_done: int, n_max: int, q: float):
        """Return (N^_rem, N^_rem,q) after ``n_done`` tokens, or None (no answer states yet).

        The length distribution read from both pools, conditioned on N > n_done.
        """
        values = self.features(prompt_pooled, answer_pool)
        if values is None:
            return None
        return self.format.rest_bounds(self.run(values), n_max, n_done, q)
