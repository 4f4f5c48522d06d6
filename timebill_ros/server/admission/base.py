"""Base class of admission policies, and their verdict."""

import abc
import dataclasses


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What admission decided for one goal at one moment.

    admit: run (or keep queued) the goal. infeasible: its least possible time exceeds the
    time left (a Skip-Next goal is admitted all the same). min_time_s: that least time,
    seconds. message: why, with both numbers, for the result when not admitted.
    """

    admit: bool
    infeasible: bool = False
    min_time_s: float = 0.0
    message: str = ''


class AdmissionPolicy(abc.ABC):
    """Decides, before any model work, whether a goal may run."""

    name = 'base'

    @abc.abstractmethod
    def check(self, job, now_s, queued=False):
        """Return the Verdict for ``job`` (a server Job) at ``now_s`` (service clock, s).

        Called at receipt (``queued`` False) and again while the goal waits or leaves the
        queue (``queued`` True); must be cheap (no model work) and must not raise for a
        well-formed job.
        """
