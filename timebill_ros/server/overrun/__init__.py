"""Overrun policies: what happens when a goal would miss its deadline."""

from timebill_ros.server.overrun.base import OverrunPolicy
from timebill_ros.server.overrun.kill import KillPolicy
from timebill_ros.server.overrun.partial import PartialPolicy
from timebill_ros.server.overrun.skip_next import SkipNextPolicy

POLICIES = {'kill': KillPolicy(), 'skip_next': SkipNextPolicy(), 'partial': PartialPolicy()}


def policy_by_name(name):
    """Return the policy called ``name`` ('kill', 'skip_next' or 'partial')."""
    if name not in POLICIES:
        raise ValueError(f'unknown overrun policy {name!r}; expected one of {sorted(POLICIES)}')
    return POLICIES[name]


__all__ = ['OverrunPolicy', 'KillPolicy', 'SkipNextPolicy', 'PartialPolicy', 'POLICIES',
           'policy_by_name']
