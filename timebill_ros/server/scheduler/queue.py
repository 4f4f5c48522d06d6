"""A bounded, thread-safe queue of admitted jobs; jobs carry the time they expire."""

import threading
import time

ACCEPT_POLL_S = 0.02  # seconds between re-checks while only other executors' jobs wait


class QueueFull(RuntimeError):
    """The queue holds ``max_depth`` goals already."""


class JobQueue:
    """Jobs waiting for an executor, in arrival order; ``policy`` picks the next one."""

    def __init__(self, max_depth, policy, clock=time.monotonic):
        self.max_depth = max_depth
        self.policy = policy
        self.clock = clock
        self._jobs = []
        self._closed = False
        self.cond = threading.Condition()

    def __len__(self):
        """Return the number of waiting jobs."""
        with self.cond:
            return len(self._jobs)

    def check_room(self):
        """Raise QueueFull when max_depth jobs wait, RuntimeError when closed."""
        with self.cond:
            if self._closed:
                raise RuntimeError('server is shutting down')
            if len(self._jobs) >= self.max_depth:
                raise QueueFull(f'queue full: {len(self._jobs)} goals waiting '
                                f'(queue.max_depth={self.max_depth})')

    def push(self, job):
        """Append a job; raise QueueFull when max_depth jobs wait, RuntimeError when closed."""
        with self.cond:
            self.check_room()
            self._jobs.append(job)
            self.cond.notify_all()

    def pop(self, timeout_s=None, accept=None):
        """Remove and return the next job, waiting up to timeout_s; None if none or closed.

        accept(job) -> bool: which waiting jobs the caller may take (an executor's share);
        the policy chooses among those. While jobs wait but none is acceptable, acceptance
        is re-checked every ACCEPT_POLL_S (it may depend on another executor getting busy).
        """
        jobs = self.pop_batch(timeout_s, accept)
        return jobs[0] if jobs else None

    def pop_batch(self, timeout_s=None, accept=None, cut=None):
        """As :meth:`pop`, but return a list of jobs (empty if none or closed).

        cut(jobs, now_s) -> indices: which of the acceptable jobs run together (a
        consolidation rule, highest priority first; none: nothing is taken); None: the
        policy's one choice.
        The time of the choice is the scheduling overhead of the first job returned.
        """
        with self.cond:
            end = None if timeout_s is None else self.clock() + timeout_s
            while True:
                if self._closed:
                    return []
                jobs = [job for job in self._jobs if accept is None or accept(job)]
                if jobs:
                    break
                remaining = None if end is None else end - self.clock()
                if remaining is not None and remaining <= 0:
                    return []
                if self._jobs:
                    remaining = min(remaining or ACCEPT_POLL_S, ACCEPT_POLL_S)
                self.cond.wait(remaining)
            start = time.perf_counter()
            if cut is None:
                chosen = [jobs[self.policy.select(jobs, self.clock())]]
            else:
                chosen = [jobs[i] for i in cut(jobs, self.clock())]
                if not chosen:  # the rule takes none of them (continuous batching)
                    return []
            # The overhead of choosing, wall time (the queue clock may be a test's fake).
            chosen[0].schedule_s += time.perf_counter() - start
            for job in chosen:
                self._jobs.remove(job)
            return chosen

    def waiting(self):
        """Return a snapshot list of the waiting jobs, in arrival order."""
        with self.cond:
            return list(self._jobs)

    def remove(self, job):
        """Remove a waiting job; return True if it was waiting."""
        with self.cond:
            if job in self._jobs:
                self._jobs.remove(job)
                return True
            return False

    def expired(self, now_s):
        """Return (without removing) the waiting jobs whose ``expires_s`` is <= now_s."""
        with self.cond:
            return [job for job in self._jobs if job.expires_s <= now_s]

    def next_expiry(self):
        """Return the earliest ``expires_s`` of the waiting jobs, or None."""
        with self.cond:
            return min((job.expires_s for job in self._jobs), default=None)

    def close(self):
        """Refuse new jobs, wake all waiters and return the jobs still waiting."""
        with self.cond:
            self._closed = True
            jobs, self._jobs = self._jobs, []
            self.cond.notify_all()
            return jobs
