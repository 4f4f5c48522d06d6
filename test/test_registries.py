"""Each plugin family has one registry, loaded from plugins.NAMES; the action agrees with it."""

import pathlib
import types

import pytest

from timebill_ros import plugins, predictors
from timebill_ros.action import Instruct
from timebill_ros.engine import eviction
from timebill_ros.server import admission, backends, overrun, scheduler, status
from timebill_ros.server.goals import GoalRejected, GoalRequest, resolve_policy

FAMILIES = [
    (overrun.POLICIES, 'overrun policy'),
    (admission.POLICIES, 'admission policy'),
    (scheduler.POLICIES, 'scheduler policy'),
    (eviction.SCORERS, 'eviction scorer'),
    (backends.BACKENDS, 'backend'),
    (plugins.load('length predictor', predictors.LengthPredictor), 'length predictor'),
]


@pytest.mark.parametrize('registry, family', FAMILIES)
def test_each_registry_holds_the_named_plugins(registry, family):
    assert tuple(registry) == plugins.NAMES[family]
    assert all(entry.name == name for name, entry in registry.items())
    assert set(plugins.NAMES) == {family for _, family in FAMILIES}


def test_a_name_no_module_defines_fails_the_load(monkeypatch):
    monkeypatch.setitem(plugins.NAMES, 'overrun policy', ('kill', 'nope'))
    with pytest.raises(ImportError, match="one OverrunPolicy named 'nope', found 0"):
        plugins.load('overrun policy', overrun.OverrunPolicy)
    monkeypatch.setitem(plugins.NAMES, 'overrun policy', ('kill',))
    assert list(plugins.load('overrun policy', overrun.OverrunPolicy)) == ['kill']


def test_a_new_scorer_is_its_file_and_its_name(tmp_path, monkeypatch):
    """A plugin's file in the family's package and its name in NAMES: nothing else."""
    package = tmp_path / 'toy_scorers'
    package.mkdir()
    (package / '__init__.py').write_text('')
    (package / 'half.py').write_text(
        'from timebill_ros.engine.eviction.base import EvictionScorer\n\n\n'
        'class HalfScorer(EvictionScorer):\n    name = "half"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(plugins.FAMILIES, 'eviction scorer', 'toy_scorers')
    monkeypatch.setitem(plugins.NAMES, 'eviction scorer', ('half',))
    (kind,) = plugins.load('eviction scorer', eviction.EvictionScorer).values()
    assert kind.__name__ == 'HalfScorer'
    with pytest.raises(ValueError, match="unknown plugin family 'nope'"):
        plugins.load('nope', types.SimpleNamespace)


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
