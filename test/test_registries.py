"""Each plugin family has one registry; config's name tuples and the action agree with it."""

import pathlib

import pytest

from timebill_ros import config
from timebill_ros.action import Instruct
from timebill_ros.engine import eviction
from timebill_ros.server import admission, overrun, scheduler, status
from timebill_ros.server.goals import GoalRejected, GoalRequest, resolve_policy

FAMILIES = [
    (overrun.POLICIES, config.POLICY_NAMES),
    (admission.POLICIES, config.ADMISSION_POLICIES),
    (scheduler.POLICIES, config.SCHEDULER_POLICIES),
    (eviction.SCORERS, config.SCORER_NAMES),
]


@pytest.mark.parametrize('registry, names', FAMILIES)
def test_config_names_are_the_registry(registry, names):
    assert tuple(registry) == names
    assert all(entry.name == name for name, entry in registry.items())


def test_overrun_codes_are_the_action_constants():
    for name, policy in overrun.POLICIES.items():
        constant = f'POLICY_{name.upper()}'
        assert policy.code == getattr(Instruct.Goal, constant)
        # status mirrors the codes code in the package uses by name (a new policy needs none)
        assert getattr(status, constant, policy.code) == policy.code
    assert overrun.POLICY_BY_CODE == {p.code: n for n, p in overrun.POLICIES.items()}
    assert status.POLICY_DEFAULT == Instruct.Goal.POLICY_DEFAULT == 0


def test_an_unknown_code_names_every_known_one():
    with pytest.raises(GoalRejected) as caught:
        resolve_policy(GoalRequest('x', budget_s=1.0, overrun_policy=9), 'kill')
    message = str(caught.value)
    assert '0 (default)' in message
    assert all(f'{p.code} ({n})' in message for n, p in overrun.POLICIES.items())


@pytest.mark.parametrize('make, family', [
    (overrun.policy_by_name, 'overrun policy'),
    (lambda name: admission.make_admission(name, None), 'admission policy'),
])
def test_unknown_names_read_alike(make, family):
    with pytest.raises(ValueError, match=f"unknown {family} 'nope'; expected one of"):
        make('nope')


def test_no_policy_is_told_apart_by_its_name_outside_its_family():
    """Behaviour lives in the policy (its flags and methods), not in name checks."""
    root = pathlib.Path(overrun.__file__).parents[2]
    offenders = []
    for path in (root / 'timebill_ros').rglob('*.py'):
        if 'overrun' in path.parts or 'bench' in path.parts or 'cli' in path.parts:
            continue
        text = path.read_text(encoding='utf-8')
        offenders += [f'{path.name}: {name}' for name in overrun.POLICIES
                      if f"policy.name == '{name}'" in text]
    assert offenders == []
