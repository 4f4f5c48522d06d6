"""RT-LM's uncertainty-aware priority (UP, Eq. 3), with consistent units.

As printed, p_J = (1 - alpha u_J) / (d_J - r_J - eta_f u_J) subtracts a token count (u_J)
from a dimensionless 1; with u_J in the tens of tokens the numerator is negative and a larger
slack would *raise* the priority, the opposite of the paper's stated intent ("a task with a
shorter slack window or smaller uncertainty score should have a higher priority"). Here u_J
is normalised by the server's default N_max:

    u~_J = min(1, u_J / N_max)        (dimensionless, in [0, 1])
    p_J  = (1 - alpha u~_J) / zeta_J,  zeta_J = d_J - now - t^_J   (1 / seconds)

With alpha in [0, 1] the numerator lies in [1 - alpha, 1]: a goal's slack is stretched by
1 / (1 - alpha u~_J), so short answers go first unless a longer one is about to miss.
alpha = 0 is least-slack-first (Eq. 2). t^_J is the time model's execution time for u_J
tokens (the paper's eta_f u_J plus the prompt's prefill); ``now`` replaces the arrival r_J
because priorities are recomputed at every choice. Goals with p_J <= 0 (slack <= 0: they are
predicted to miss; or alpha u~_J >= 1) run after all others, earliest deadline first, which
is where Eq. 3's sign puts them; under Kill they end at the latest at their deadline, so no
goal waits forever.
"""

from timebill_ros.server.scheduler.base import SchedulerPolicy, slack_s


class UncertaintyPriority(SchedulerPolicy):
    """Largest p_J of Eq. 3 first (see the module docstring for the units).

    alpha: weight of the normalised uncertainty (RT-LM: 1.0). n_max_tokens: the N_max that
    normalises u_J, tokens.
    """

    name = 'up'

    def __init__(self, alpha=1.0, n_max_tokens=128):
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha < 0:
            raise ValueError(f'up alpha must be a number >= 0, got {alpha!r}')
        if not isinstance(n_max_tokens, int) or isinstance(n_max_tokens, bool) \
                or n_max_tokens < 1:
            raise ValueError(f'n_max_tokens must be an int >= 1, got {n_max_tokens!r}')
        self.alpha = float(alpha)
        self.n_max_tokens = n_max_tokens

    @classmethod
    def from_config(cls, config):
        """Return the policy with ``scheduler.up_alpha``, normalised by engine N_max."""
        return cls(config.scheduler.up_alpha, config.engine.max_new_tokens)

    def priority(self, job, now_s):
        """Return p_J, 1 / seconds (<= 0: the goal runs after every positive one)."""
        zeta = slack_s(job, now_s)
        u_norm = min(1.0, job.uncertainty_tokens / self.n_max_tokens)
        numerator = 1.0 - self.alpha * u_norm
        if zeta <= 0 or numerator <= 0:
            return 0.0
        return numerator / zeta

    def key(self, job, now_s):
        """Return (0, -p_J) for a positive priority, else (1, d_J)."""
        p = self.priority(job, now_s)
        return (0, -p) if p > 0 else (1, job.deadline_s)
