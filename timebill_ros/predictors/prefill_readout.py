"""N^ read from the goal's own prefill: the exported readout head, run with onnxruntime.

The head (training/heads/prefill_readout.py) reads the decoder layers' states the prefill pooled
(engine.PrefillState.pooled, (1, 2 x layers x hidden); the service makes the engine pool the
layers named in the file), so it runs after the prefill, in well under a millisecond, instead
of beside it as the RLP does. Its time, measured at load, is what the
time model's WCET counts for the prediction phase.
"""

import pathlib
import statistics
import time
import numpy as np

from timebill_ros.predictors.onnx_rlp import resolve_providers
from timebill_ros.predictors.contract import OUTPUT_NAME, POOLED_NAME, read_metadata
from timebill_ros.predictors.length_distribution import OutputFormat

TIMING_REPEATS = 20  # runs timed at load; the median is time_s


class PrefillReadout:
    """(N^, N^_q) from pooled prefill states; ``time_s`` its measured run time, seconds.

    ``pool_layers``: the decoder layers (1-based) it reads; the engine must pool those
    (LlmEngine.pool_layers), in that order.
    """

    name = 'prefill readout'
    reads_answer = False  # a decode readout's file also reads the answer's pooled states
    build_command = 'timebill predictor readout --export'

    def __init__(self, session):
        """Use ``session`` (onnxruntime) of a ``timebill predictor readout --export`` file."""
        meta = read_metadata(session)
        if meta.get('input') != POOLED_NAME:
            raise ValueError(f'not a prefill readout export (metadata {meta!r})')
        self.format = OutputFormat.from_metadata(meta)
        if (meta.get('answer_pool', '') == '1') != self.reads_answer:
            raise ValueError(f'{meta.get("name", "this export")} is not a {self.name} export')
        self.model_key = meta.get('model_key', '')
        try:
            self.pool_layers = tuple(int(n) for n in meta.get(
                'pool_layers', meta['n_layers']).split(','))
        except (KeyError, ValueError) as exc:
            raise ValueError(f'readout export without its pooled layers ({meta!r})') from exc
        self.session = session
        self.n_features = session.get_inputs()[0].shape[-1]
        if not isinstance(self.n_features, int):
            raise ValueError(f'readout input width must be fixed, got {self.n_features!r}')
        self.time_s = self._measure_s()
        self.decode = None  # a DecodeReadout reading at checkpoints beside it (make_readout)

    @classmethod
    def load(cls, path, threads: int = 1, provider: str = 'auto') -> 'PrefillReadout':
        """Open the ONNX file at ``path`` with ``threads`` intra-op threads."""
        import onnxruntime
        path = pathlib.Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f'no {cls.name} at {path}: build it with '
                                    f'`{cls.build_command}`')
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        return cls(onnxruntime.InferenceSession(str(path), options,
                                                providers=resolve_providers(provider)))

    def run(self, pooled) -> np.ndarray:
        """Return the raw output (C,) for pooled states (1, 2 W) (torch or numpy)."""
        values = np.asarray(pooled.cpu() if hasattr(pooled, 'cpu') else pooled,
                            dtype=np.float32).reshape(1, -1)
        if values.shape[1] != self.n_features:
            raise ValueError(f'pooled states must have {self.n_features} values, got '
                             f'{values.shape[1]}')
        return self.session.run([OUTPUT_NAME], {POOLED_NAME: values})[0][0]

    def predict_bounds(self, pooled, n_max: int, q: float = 0.0) -> tuple:
        """Return (N^, N^_q) in tokens, both <= n_max; N^_q is None for q == 0 or regression."""
        return self.format.bounds(self.run(pooled), n_max, q)

    def _measure_s(self) -> float:
        zeros = np.zeros((1, self.n_features), dtype=np.float32)
        self.run(zeros)  # warm-up
        times = []
        for _ in range(TIMING_REPEATS):
            start = time.perf_counter()
            self.run(zeros)
            times.append(time.perf_counter() - start)
        return statistics.median(times)
