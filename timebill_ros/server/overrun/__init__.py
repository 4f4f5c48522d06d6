"""Overrun policies: what happens when a goal would miss its deadline."""

from timebill_ros.server.overrun.base import OverrunPolicy
from timebill_ros.server.overrun.kill import KillPolicy
from timebill_ros.server.overrun.skip_next import SkipNextPolicy

POLICIES = {'kill': KillPolicy(), 'skip_next': SkipNextPolicy()}


def policy_by_name(name):
    """Return the policy called ``name`` ('kill' or 'skip_next')."""
    if name not in POLICIES:
        raise ValueError(f'unknown overrun policy {name!r}; expected one of {sorted(POLICIES)}')
    return POLICIES[name]


__all__ = ['OverrunPolicy', 'KillPolicy', 'SkipNextPolicy', 'POLICIES', 'policy_by_name']
