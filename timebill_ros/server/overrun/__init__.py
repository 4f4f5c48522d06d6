"""Overrun policies: what happens when a goal would miss its deadline.

One policy per module, ``<name>.py`` holding the OverrunPolicy subclass called ``name``.
The registry line is the policy's name in ``config.POLICY_NAMES`` (config sits below the
plugins and validates ``overrun.default_policy`` with it); the action's ``POLICY_<NAME>``
constant is its code. A new policy is its file plus those two lines.
"""

import importlib

from timebill_ros.checks import choose
from timebill_ros.config import POLICY_NAMES
from timebill_ros.server.overrun.base import OverrunPolicy
from timebill_ros.server.overrun.kill import KillPolicy
from timebill_ros.server.overrun.partial import PartialPolicy
from timebill_ros.server.overrun.skip_next import SkipNextPolicy


def _policy_of(name):
    """Return an instance of the OverrunPolicy called ``name`` in module ``<name>``."""
    module = importlib.import_module(f'{__name__}.{name}')
    found = [kind for kind in vars(module).values() if isinstance(kind, type)
             and issubclass(kind, OverrunPolicy) and kind.name == name]
    if len(found) != 1:
        raise ImportError(f'{module.__name__} must define one OverrunPolicy named {name!r}, '
                          f'found {len(found)}')
    return found[0]()


# The registry: one instance per policy, by name, in config.POLICY_NAMES' order. The action's
# POLICY_* constants and the ROS conversions agree with it (test/test_registries.py).
POLICIES = {name: _policy_of(name) for name in POLICY_NAMES}
# A goal's overrun_policy code <-> policy name (0, POLICY_DEFAULT: the server's default).
POLICY_CODES = {name: policy.code for name, policy in POLICIES.items()}
POLICY_BY_CODE = {code: name for name, code in POLICY_CODES.items()}


def policy_by_name(name):
    """Return the registered policy called ``name`` (a key of POLICIES)."""
    return choose('overrun policy', POLICIES, name)


def codes_text():
    """Return the accepted overrun_policy codes in words, e.g. "0 (default), 1 (kill), ..."."""
    words = ['0 (default)'] + [f'{code} ({name})' for name, code in POLICY_CODES.items()]
    return ', '.join(words[:-1]) + ' or ' + words[-1]


__all__ = ['OverrunPolicy', 'KillPolicy', 'SkipNextPolicy', 'PartialPolicy', 'POLICIES',
           'POLICY_CODES', 'POLICY_BY_CODE', 'policy_by_name', 'codes_text']
