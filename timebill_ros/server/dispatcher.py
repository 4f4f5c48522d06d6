"""Dispatch: which executor a queued goal belongs to, which goals batch, what expires.

The executors pull from the one queue (server/executor.py); this decides for them: the
route (RT-LM's offload of high-u_J goals), the consolidation cut and the continuous join
(scheduler.consolidation / continuous), and the reaper that ends queued goals that expired.
"""

import threading
import traceback

from timebill_ros.server import status
from timebill_ros.server.goals import JobResult
from timebill_ros.server.scheduler.consolidation import cut_batch, join_batch, keep_on_time
from timebill_ros.timing.online import EXPECTED

PRIMARY = 'primary'
OFFLOAD = 'offload'


class Dispatcher:
    """The executors, the route between them, batching and the queue's reaper.

    config: ServerConfig. queue: the JobQueue. time_model: the primary's. recheck(job,
    now_s) -> JobResult or None: admission again for a queued goal (Admitter.recheck).
    clock: monotonic seconds. log: one line per fault. ``executors``: the primary first,
    then the offload executor once attached (``tau_tokens`` then set).
    """

    def __init__(self, config, queue, time_model, recheck, clock, log):
        self.config = config
        self.queue = queue
        self.time_model = time_model
        self.recheck = recheck
        self.clock = clock
        self.log = log
        self.executors = []
        self.tau_tokens = None
        self._reaper_stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name='timebill-reaper',
                                        daemon=True)

    # --- route and batches -------------------------------------------------------------
    def route(self, job):
        """Return the executor a goal belongs to: OFFLOAD when its u_J is known and > tau.

        A bucketed predictor puts many predictions at its cap (the RLP's top bucket, N_max):
        when tau sits at that cap, no prediction exceeds it, so u_J >= tau counts there
        (the top bucket means "at least this long").
        """
        u_j = job.predicted_tokens
        if len(self.executors) < 2 or u_j is None:
            return PRIMARY
        if u_j > self.tau_tokens or (u_j >= self.tau_tokens >= job.n_max):
            return OFFLOAD
        return PRIMARY

    def accepts(self, name, job):
        """Return True if executor ``name`` may take ``job``.

        Its own goals, and another executor's while that one is busy (RT-LM Sec. IV-D: an
        idle executor takes work rather than wait).
        """
        owner = self.route(job)
        if owner == name:
            return True
        return any(e.name == owner and e.current is not None for e in self.executors)

    def cut(self, jobs, now_s):
        """Consolidation (scheduler.consolidation): the primary's batch among ``jobs``.

        The policy's first choice always runs; goals routed to the offload executor never
        join a batch (RT-LM Sec. IV-D), so when the primary takes one of them (the offload
        executor being busy) it runs alone.
        """
        first = self.queue.policy.select(jobs, now_s)
        own = [i for i, job in enumerate(jobs) if self.route(job) == PRIMARY]
        if first not in own:
            return [first]
        cfg = self.config.scheduler
        picked = [own[i] for i in cut_batch([jobs[i] for i in own], now_s, self.queue.policy,
                                            cfg.batch_size, cfg.b, cfg.length_ratio)]
        if len(picked) == 1:
            return picked
        kept = keep_on_time([jobs[i] for i in picked], now_s, self._prefill_alone_s,
                            self._decode_alone_s, self.executors[0].runner.batch_scale.scale)
        return [picked[i] for i in kept]

    def join(self, jobs, now_s, room, members):
        """Continuous batching (scheduler.continuous): which of ``jobs`` join the batch now.

        None joins a batch that holds a goal routed to the offload executor, and no such
        goal joins one; with consolidation, only goals of similar u_J join.
        """
        if any(self.route(member) != PRIMARY for member in members):
            return []
        own = [i for i, job in enumerate(jobs) if self.route(job) == PRIMARY]
        cfg = self.config.scheduler
        picked = join_batch([jobs[i] for i in own], now_s, self.queue.policy, room, members,
                            cfg.length_ratio if cfg.consolidation else None)
        return [own[i] for i in picked]

    def _prefill_alone_s(self, job):
        """Return the goal's expected prefill, seconds (primary time model)."""
        return self.time_model.prefill_s(job.n_x, EXPECTED, n_cached=job.n_cached)

    def _decode_alone_s(self, job):
        """Return the goal's expected decoding alone, seconds: u_J tokens at alpha 0."""
        tokens = min(job.n_max, max(1, job.uncertainty_tokens))
        return self.time_model.decode_s(job.n_x, 0.0, tokens, EXPECTED)

    # --- the reaper ----------------------------------------------------------------------
    def start_reaper(self):
        """Start the thread that ends queued goals when they expire."""
        self._reaper.start()

    def stop_reaper(self, timeout_s):
        """Stop the reaper and wait for it, at most ``timeout_s`` seconds."""
        self._reaper_stop.set()
        with self.queue.cond:
            self.queue.cond.notify_all()
        if self._reaper.is_alive():
            self._reaper.join(timeout_s)

    @property
    def reaper_alive(self):
        """Return True while the reaper thread runs."""
        return self._reaper.is_alive()

    def _reap_loop(self):
        """End queued goals that expired: can no longer fit (Kill, Partial) or came due.

        A fault in one round is logged and the loop goes on: the reaper must outlive it.
        """
        while not self._reaper_stop.is_set():
            try:
                self._reap_once()
            except Exception:
                self.log(f'reaper: round failed: {traceback.format_exc()}')
                self._reaper_stop.wait(0.1)

    def _reap_once(self):
        """Wait for the next expiry (at most 0.5 s), then end what expired."""
        with self.queue.cond:
            expiry = self.queue.next_expiry()
            wait_s = 0.5 if expiry is None else expiry - self.clock()
            if wait_s > 0:
                self.queue.cond.wait(min(wait_s, 0.5))
        now = self.clock()
        for job in self.queue.expired(now):
            result = self._expired_result(job, now)
            if result is not None and self.queue.remove(job):
                job.finish(result)

    def _expired_result(self, job, now):
        """Return the result of an expired queued goal, or None to keep it queued.

        SKIPPED when it came due while a running goal's policy skips it (Skip-Next overran);
        REJECTED when it can no longer fit before its deadline; KILLED when the deadline
        passed. None: the time model got faster meanwhile and the goal fits again (its
        expiry moves).
        """
        for running in (job for executor in self.executors for job in executor.running):
            if running.policy.skips_queued(running.deadline_s, now):
                return JobResult(
                    status=status.SKIPPED, kill_latency_s=None, stop_phase='queue',
                    message=f'skipped: came due while goal {running.goal_id} overran '
                            'under skip-next')
        if now < job.deadline_s:
            return self.recheck(job, now)
        return JobResult(status=status.KILLED, kill_latency_s=now - job.deadline_s,
                         stop_phase='queue', message='deadline passed while queued; not run')
