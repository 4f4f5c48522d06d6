"""Base class of scheduler policies."""

import abc


class SchedulerPolicy(abc.ABC):
    """Picks which queued goal an executor runs next."""

    name = 'base'

    @abc.abstractmethod
    def select(self, jobs, now_s):
        """Return the index in ``jobs`` (arrival order, non-empty) of the goal to run next."""
