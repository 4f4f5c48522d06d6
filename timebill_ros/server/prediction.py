"""A length-predictor call timed on the service's clock (N^, N^_q: tokens), its thread, the wait.

Both pipelines (the local goal run, the remote one) wait for a prediction the same way:
:func:`await_prediction` polls it while the goal's own stop checks run.
"""

import concurrent.futures
import dataclasses
from typing import Optional

POLL_S = 0.005  # a wait re-checks cancel and the deadline this often, seconds


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One predictor call: N^ and N^_q (None: not asked or not known), tokens; its times, s."""

    n_hat: int
    n_upper: Optional[int]
    start_s: float
    end_s: float


def timed_predict(predictor, prompt, input_ids, n_max, clock, upper_quantile=0.0):
    """Return the :class:`Prediction` of one predictor call, service-clock seconds.

    upper_quantile: q > 0 also asks for N^_q (``budget.upper_quantile``), from the same run.
    """
    start = clock()
    if upper_quantile > 0:
        n_hat, n_upper = predictor.predict_bounds(prompt, input_ids, n_max, upper_quantile)
    else:
        n_hat, n_upper = predictor.predict(prompt, input_ids, n_max), None
    return Prediction(int(n_hat), None if n_upper is None else int(n_upper), start, clock())


class PredictorThread:
    """One thread that runs length-predictor calls one at a time; each returns a future.

    The local and remote runs (a goal's N^) and the queue (a waiting goal's u_J) each own
    one. name: the thread's name prefix (``timebill-predict``, ``timebill-uncertainty``:
    profiles and logs show it). clock: the service's monotonic seconds, the Prediction's
    times. upper_quantile: q > 0 also asks for N^_q (``budget.upper_quantile``).
    """

    def __init__(self, name, clock, upper_quantile=0.0):
        self.clock = clock
        self.upper_quantile = upper_quantile
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                          thread_name_prefix=name)

    def submit(self, predictor, prompt, input_ids, n_max):
        """Queue one call of ``predictor`` (the one serving now); return its future."""
        return self.pool.submit(timed_predict, predictor, prompt, input_ids, n_max,
                                self.clock, self.upper_quantile)

    def close(self):
        """Stop the thread once its call ends; calls not started are dropped."""
        self.pool.shutdown(wait=True, cancel_futures=True)


@dataclasses.dataclass(frozen=True)
class Waited:
    """How a wait for a prediction ended: exactly one field is set (or ``late``)."""

    prediction: Optional[Prediction] = None  # the call's result
    stop_reason: Optional[str] = None  # the goal stopped meanwhile (a stopping.py reason)
    late: bool = False  # the call had not ended by the wait's limit
    error: Optional[BaseException] = None  # the call raised


def await_prediction(future, limit_s, should_stop, clock, poll_s=POLL_S) -> Waited:
    """Wait for ``future`` (a Prediction) until ``limit_s`` (clock seconds); never raises.

    should_stop() -> a stop reason or None, checked every ``poll_s`` seconds; the caller
    cancels or aborts the call when the wait ends without its result. A call that ended is
    taken even when the limit passed meanwhile.
    """
    while True:
        reason = should_stop()
        if reason is not None:
            return Waited(stop_reason=reason)
        if clock() >= limit_s and not future.done():
            return Waited(late=True)
        try:
            done = future.result(timeout=max(0.0, min(poll_s, limit_s - clock())))
        except concurrent.futures.TimeoutError:
            continue
        except Exception as exc:
            return Waited(error=exc)
        return Waited(prediction=done)
