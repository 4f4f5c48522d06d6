"""Scheduling of admitted goals: a bounded queue and the policy that picks the next goal."""

from timebill_ros.server.scheduler.base import SchedulerPolicy
from timebill_ros.server.scheduler.fifo import FifoPolicy
from timebill_ros.server.scheduler.queue import JobQueue, QueueFull

__all__ = ['SchedulerPolicy', 'FifoPolicy', 'JobQueue', 'QueueFull']
