"""Overrun policies: what happens when a goal would miss its deadline.

One policy per module, ``<name>.py`` holding the OverrunPolicy subclass called ``name``;
every decision a deadline forces is a method of it (base.py). The registry line is the
policy's name in ``plugins.NAMES['overrun policy']``; the action's ``POLICY_<NAME>``
constant is its code. A new policy is its file plus those two lines.
"""

from timebill_ros import plugins
from timebill_ros.server.overrun.base import OverrunPolicy
from timebill_ros.server.overrun.kill import KillPolicy
from timebill_ros.server.overrun.partial import PartialPolicy
from timebill_ros.server.overrun.skip_next import SkipNextPolicy

# The registry: one instance per policy, by name, in plugins.NAMES' order. The action's
# POLICY_* constants and the ROS conversions agree with it (test/test_registries.py).
POLICIES = {name: kind() for name, kind in plugins.load('overrun policy',
                                                        OverrunPolicy).items()}
# A goal's overrun_policy code <-> policy name (0, POLICY_DEFAULT: the server's default).
POLICY_CODES = {name: policy.code for name, policy in POLICIES.items()}
POLICY_BY_CODE = {code: name for name, code in POLICY_CODES.items()}


def policy_by_name(name):
    """Return the registered policy called ``name`` (a key of POLICIES)."""
    return plugins.choose('overrun policy', POLICIES, name)


def codes_text():
    """Return the accepted overrun_policy codes in words, e.g. "0 (default), 1 (kill), ..."."""
    words = ['0 (default)'] + [f'{code} ({name})' for name, code in POLICY_CODES.items()]
    return ', '.join(words[:-1]) + ' or ' + words[-1]


__all__ = ['OverrunPolicy', 'KillPolicy', 'SkipNextPolicy', 'PartialPolicy', 'POLICIES',
           'POLICY_CODES', 'POLICY_BY_CODE', 'policy_by_name', 'codes_text']
