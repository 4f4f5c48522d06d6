"""N^_rem read again at a checkpoint: the exported decode readout, run with onnxruntime.

The head (training/models/decode_readout.py) reads the prompt's pooled states and the
answer's (the last layer's output of every decoding step, engine.PrefillState.answer_pool)
as one pool of L + 1 layers, and gives the answer's length distribution; conditioned on the
answer not having ended after k tokens it bounds the rest (OutputFormat.rest_bounds). A
checkpoint runs it once (its time, measured at load, is ``time_s``).
"""

import numpy as np

from timebill_ros.engine.forward import HiddenPool
from timebill_ros.predictors.prefill_readout import PrefillReadout


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
        """Return the input (1, 2 (L + 1) hidden): prompt and answer pools laid out as one.

        None while the answer pool is empty (no step has run yet).
        """
        answer = answer_pool.features() if answer_pool is not None else None
        if answer is None:
            return None
        prompt = np.asarray(prompt_pooled.cpu() if hasattr(prompt_pooled, 'cpu')
                            else prompt_pooled, dtype=np.float32).reshape(1, -1)
        answer = np.asarray(answer.cpu(), dtype=np.float32).reshape(1, -1)
        half, hidden = prompt.shape[1] // 2, answer.shape[1] // 2
        return np.concatenate([prompt[:, :half], answer[:, :hidden], prompt[:, half:],
                               answer[:, hidden:]], axis=1)

    def rest_bounds(self, prompt_pooled, answer_pool, n_done: int, n_max: int, q: float):
        """Return (N^_rem, N^_rem,q) after ``n_done`` tokens, or None (no answer states yet).

        The length distribution read from both pools, conditioned on N > n_done.
        """
        values = self.features(prompt_pooled, answer_pool)
        if values is None:
            return None
        return self.format.rest_bounds(self.run(values), n_max, n_done, q)
