"""u_J, the predicted length of a goal that has to wait (RT-LM's uncertainty), at admission.

The length predictor runs on its own CPU thread while the goal waits; the run reuses the
prediction as N^ (goal_run.py) instead of predicting again. It is started only where
something reads u_J (:meth:`Uncertainty.wanted`).
"""


from timebill_ros.server.prediction import PredictorThread


class Uncertainty:
    """Predicts u_J of waiting goals on one thread.

    config: ServerConfig. predictor: the LengthPredictor. readout: the prefill readout or
    None. scheduler: the queue's SchedulerPolicy. estimated_time_s(job) -> s: t^_J once u_J
    is known. clock: monotonic seconds.
    """

    def __init__(self, config, predictor, readout, scheduler, estimated_time_s, clock):
        self.config = config
        self.predictor = predictor
        self.readout = readout
        self.scheduler = scheduler
        self.estimated_time_s = estimated_time_s
        self.clock = clock
        # Its time is the goal's t_Predict (predict_time): the run reuses it.
        self.thread = PredictorThread('timebill-uncertainty', clock,
                                      config.budget.upper_quantile)

    def wanted(self, offloading):
        """Return whether anything reads a waiting goal's u_J (so it is worth predicting).

        The scheduler's order (luf, muf, slack, up), consolidation and continuous batching
        (goals of similar u_J together), the offload route (``offloading``: u_J > tau) and,
        without a prefill readout, the run (u_J is its N^). Otherwise - the default fifo
        with the readout - the prediction would only take the CPU from the goal that runs
        meanwhile: the RLP over a 2-3k-token robot context, queued behind a Skip-Next
        overrun, runs beside that goal's steps on the same cores (docs/benchmark.md).
        """
        cfg = self.config.scheduler
        return (self.scheduler.uses_uncertainty or cfg.consolidation or cfg.continuous
                or offloading or self.readout is None)

    def start(self, job, offloading):
        """Start u_J for a goal that has to wait (``scheduler.uncertainty: predictor``).

        Not started when nothing would read it (:meth:`wanted`).
        """
        if self.config.scheduler.uncertainty != 'predictor' or not self.wanted(offloading):
            return
        future = self.thread.submit(self.predictor, job.request.prompt, job.input_ids,
                                    job.n_max)
        job.prediction = future
        future.add_done_callback(lambda done: self._known(job, done))

    def _known(self, job, future):
        """Record u_J and t^_J once the admission prediction is in (any thread)."""
        if future.cancelled() or future.exception() is not None:
            return  # the run predicts again; u_J stays N_max meanwhile
        n_hat = future.result().n_hat
        if 0 <= n_hat <= job.n_max:
            job.predicted_tokens = n_hat
            job.estimated_time_s = self.estimated_time_s(job)

    def shutdown(self):
        """Stop the thread; predictions not started are dropped."""
        self.thread.close()
