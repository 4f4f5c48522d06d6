"""Wall time of one scheduler choice among N waiting goals, per policy (timeit).

Run: timebill study choose_cost [--goals 16]
"""

import argparse
import random
import timeit
import types

from timebill_ros.config import SchedulerConfig, ServerConfig
from timebill_ros.plugins import NAMES
from timebill_ros.server.scheduler import make_scheduler_policy


def main(argv=None):
    """Print microseconds per choice for every scheduler.policy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--goals', type=int, default=16)
    args = parser.parse_args(argv)
    rng = random.Random(0)
    jobs = [types.SimpleNamespace(received_s=float(i), deadline_s=10 + 10 * rng.random(),
                                  uncertainty_tokens=rng.randint(1, 128),
                                  estimated_time_s=4 * rng.random())
            for i in range(args.goals)]
    for name in NAMES['scheduler policy']:
        policy = make_scheduler_policy(ServerConfig(scheduler=SchedulerConfig(policy=name)))
        runs = 2000
        seconds = timeit.timeit(lambda: policy.select(jobs, 5.0), number=runs) / runs
        print(f'{name:6s} {seconds * 1e6:6.1f} us per choice among {args.goals} goals')


if __name__ == '__main__':
    main()
