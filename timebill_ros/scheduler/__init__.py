"""Scheduling of admitted goals: a bounded queue and the policy that picks the next goal."""

from timebill_ros.scheduler.base import SchedulerPolicy
from timebill_ros.scheduler.fifo import FifoPolicy
from timebill_ros.scheduler.queue import JobQueue, QueueFull

__all__ = ['SchedulerPolicy', 'FifoPolicy', 'JobQueue', 'QueueFull']
