"""Scheduling of admitted goals: a bounded queue and the policy that picks the next goal."""

from timebill_ros.server.scheduler.base import SchedulerPolicy
from timebill_ros.server.scheduler.edf import EdfPolicy
from timebill_ros.server.scheduler.fifo import FifoPolicy
from timebill_ros.server.scheduler.queue import JobQueue, QueueFull
from timebill_ros.server.scheduler.slack import SlackPolicy
from timebill_ros.server.scheduler.uncertainty_first import (LeastUncertaintyFirst,
                                                             MostUncertaintyFirst)
from timebill_ros.server.scheduler.up import UncertaintyPriority


def make_scheduler_policy(config):
    """Return the SchedulerPolicy of ``config.scheduler.policy`` (a ServerConfig)."""
    name = config.scheduler.policy
    if name == 'up':
        return UncertaintyPriority(config.scheduler.up_alpha, config.engine.max_new_tokens)
    policies = {'fifo': FifoPolicy, 'edf': EdfPolicy, 'luf': LeastUncertaintyFirst,
                'muf': MostUncertaintyFirst, 'slack': SlackPolicy}
    if name not in policies:
        raise ValueError(f'unknown scheduler policy {name!r}')
    return policies[name]()


__all__ = ['SchedulerPolicy', 'FifoPolicy', 'EdfPolicy', 'LeastUncertaintyFirst',
           'MostUncertaintyFirst', 'SlackPolicy', 'UncertaintyPriority', 'JobQueue',
           'QueueFull', 'make_scheduler_policy']
