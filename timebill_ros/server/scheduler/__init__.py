"""Scheduling of admitted goals: a bounded queue and the policy that picks the next goal."""

from timebill_ros import plugins
from timebill_ros.server.scheduler.base import SchedulerPolicy
from timebill_ros.server.scheduler.edf import EdfPolicy
from timebill_ros.server.scheduler.fifo import FifoPolicy
from timebill_ros.server.scheduler.queue import JobQueue, QueueFull
from timebill_ros.server.scheduler.slack import SlackPolicy
from timebill_ros.server.scheduler.uncertainty_first import (LeastUncertaintyFirst,
                                                             MostUncertaintyFirst)
from timebill_ros.server.scheduler.up import UncertaintyPriority


# The registry: the classes named in plugins.NAMES['scheduler policy'], in its order.
POLICIES = plugins.load('scheduler policy', SchedulerPolicy)


def make_scheduler_policy(config):
    """Return the SchedulerPolicy of ``config.scheduler.policy`` (a ServerConfig)."""
    return plugins.choose('scheduler policy', POLICIES,
                          config.scheduler.policy).from_config(config)


__all__ = ['SchedulerPolicy', 'FifoPolicy', 'EdfPolicy', 'LeastUncertaintyFirst',
           'MostUncertaintyFirst', 'SlackPolicy', 'UncertaintyPriority', 'JobQueue',
           'QueueFull', 'POLICIES', 'make_scheduler_policy']
