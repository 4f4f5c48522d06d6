"""Goal validation and the YAML -> dataclass parameter path."""

import dataclasses
import math

import pytest

from timebill_ros import config, params

from timebill_ros.server import goals, status
from timebill_ros.server.goals import GoalRejected, GoalRequest


@pytest.mark.parametrize('budget_s, match', [
    (float('nan'), 'finite'), (math.inf, 'finite'), (0.0, '> 0'), (-1.0, '> 0'),
])
def test_bad_budgets_are_rejected_with_the_cause(budget_s, match):
    with pytest.raises(GoalRejected, match=match):
        goals.resolve_deadline(GoalRequest('hi', budget_s=budget_s), received_s=10.0)


def test_deadline_rules():
    assert goals.resolve_deadline(GoalRequest('hi', budget_s=2.0), 10.0) == 12.0
    assert goals.resolve_deadline(GoalRequest('hi', deadline_s=15.0), 10.0) == 15.0
    with pytest.raises(GoalRejected, match='already past'):
        goals.resolve_deadline(GoalRequest('hi', deadline_s=9.0), 10.0)
    with pytest.raises(GoalRejected, match='both are zero'):
        goals.resolve_deadline(GoalRequest('hi'), 10.0)
    with pytest.raises(GoalRejected, match='only one'):
        goals.resolve_deadline(GoalRequest('hi', budget_s=1.0, deadline_s=12.0), 10.0)


def test_policy_and_max_tokens():
    assert goals.resolve_policy(GoalRequest('x'), 'skip_next') == 'skip_next'
    assert goals.resolve_policy(GoalRequest('x', overrun_policy=1), 'skip_next') == 'kill'
    with pytest.raises(GoalRejected, match='unknown overrun_policy 7'):
        goals.resolve_policy(GoalRequest('x', overrun_policy=7), 'kill')
    assert goals.resolve_max_new_tokens(GoalRequest('x'), 128, 2048) == 128
    assert goals.resolve_max_new_tokens(GoalRequest('x', max_new_tokens=9), 128, 2048) == 9
    with pytest.raises(GoalRejected, match='exceeds the model capacity'):
        goals.resolve_max_new_tokens(GoalRequest('x', max_new_tokens=4096), 128, 2048)


def test_empty_prompt():
    with pytest.raises(GoalRejected, match='empty'):
        goals.check_prompt(GoalRequest(' \n\t'))


def test_status_names_cover_every_code():
    assert set(status.STATUS_NAMES) == set(status.ACTION_OUTCOME)


def test_yaml_round_trip_and_shipped_config(tmp_path):
    cfg = config.ServerConfig(budget=config.BudgetConfig(alpha_max=0.9))
    path = tmp_path / 'p.yaml'
    path.write_text(params.to_yaml(cfg))
    assert params.config_from_flat(params.load_yaml(path)) == cfg
    shipped = params.config_from_flat(params.load_yaml('config/llm.yaml'))
    assert shipped.ros.action_name == '~/instruct'


def test_every_dataclass_field_is_a_parameter():
    names = params.defaults()
    for group, cls in params.groups().items():
        for field in dataclasses.fields(cls):
            assert f'{group}.{field.name}' in names


def test_bad_parameters_name_the_culprit():
    with pytest.raises(ValueError, match='unknown parameter.*engine.thread'):
        params.config_from_flat({'engine.thread': 2})
    with pytest.raises(TypeError, match='engine.threads'):
        params.config_from_flat({'engine.threads': 'two'})
    with pytest.raises(ValueError, match='budget.alpha_max'):
        params.config_from_flat({'budget.alpha_max': 1.5})
    with pytest.raises(ValueError, match='overrun.default_policy'):
        params.config_from_flat({'overrun.default_policy': 'explode'})


@pytest.mark.parametrize('make', [
    lambda: config.EngineConfig(threads=True), lambda: config.EngineConfig(max_new_tokens=True),
    lambda: config.EvictionConfig(window_size=True), lambda: config.StatsConfig(window=True),
    lambda: config.RosConfig(result_timeout_s=True)])
def test_a_bool_is_not_a_count(make):
    # Python's True == 1: a YAML 'true' given for a count must not pass as one.
    with pytest.raises(ValueError, match='must be an int'):
        make()


def test_node_section_matching(tmp_path):
    path = tmp_path / 'p.yaml'
    path.write_text('/**:\n  ros__parameters:\n    engine: {threads: 1}\n'
                    '/robot/timebill:\n  ros__parameters:\n    queue.max_depth: 3\n'
                    'other:\n  ros__parameters:\n    queue.max_depth: 9\n')
    assert params.load_yaml(path) == {'engine.threads': 1, 'queue.max_depth': 3}


@pytest.mark.parametrize('preset', ['config/llm.yaml', 'config/jetson_orin.yaml'])
def test_every_preset_loads_with_known_parameters(preset):
    """A preset names only real parameters, with values their dataclasses accept."""
    names = params.load_yaml(preset)
    assert names and set(names) <= set(params.defaults())
    config = params.load_config(preset)
    if 'jetson' in preset:
        assert config.engine.device == 'cuda' and config.offload.enabled


def test_every_parameter_is_shipped_and_documented():
    """config/llm.yaml sets every parameter; the generated reference has a table row for each."""
    import pathlib
    shipped = params.load_yaml('config/llm.yaml')
    reference = pathlib.Path('docs/parameters.md').read_text(encoding='utf-8')
    for name in params.defaults():
        assert name in shipped, f'{name} missing from config/llm.yaml'
        assert f'| `{name}` |' in reference, f'{name} has no row in docs/parameters.md'


def test_predictor_upgrade_names_the_files_that_appeared(tmp_path):
    """The node's reload check: files the running service lacks that exist now, once each."""
    import os
    import types

    from timebill_ros.config import BudgetConfig, PredictorConfig, ServerConfig
    from timebill_ros.predictors import FallbackPredictor
    from timebill_ros.server.factory import predictor_upgrade
    rlp, readout = tmp_path / 'rlp.onnx', tmp_path / 'readout.onnx'
    config = ServerConfig(predictor=PredictorConfig(model_file=str(rlp),
                                                    readout_file=str(readout)))
    service = types.SimpleNamespace(config=config, engine=types.SimpleNamespace(model_key='m'),
                                    predictor=FallbackPredictor(), readout=None)
    assert predictor_upgrade(service) is None  # nothing built yet
    rlp.write_bytes(b'x')
    what, key = predictor_upgrade(service)
    assert what == 'the RLP'
    readout.write_bytes(b'y')
    assert predictor_upgrade(service)[0] == 'the RLP and the prefill readout'
    os.utime(rlp, (1, 1))
    assert predictor_upgrade(service)[1] != key  # rebuilt files are tried again
    service.predictor, service.readout = object(), object()  # both in use: nothing to gain
    assert predictor_upgrade(service) is None
    # timebill-online with a prefill readout but no decode readout: its file counts once built.
    decode = tmp_path / 'decode.onnx'

    def online(**decode_readout):
        return ServerConfig(
            predictor=PredictorConfig(model_file=str(rlp), readout_file=str(readout),
                                      decode_readout_file=str(decode), **decode_readout),
            budget=BudgetConfig(checkpoint_tokens=16))

    service.config = online(decode_readout=True)
    service.readout = types.SimpleNamespace(decode=None)
    assert predictor_upgrade(service) is None
    decode.write_bytes(b'z')
    assert predictor_upgrade(service)[0] == 'the decode readout'
    service.config = online()  # off by default: its file is not waited for
    assert predictor_upgrade(service) is None
    service.config = online(decode_readout=True)
    service.readout.decode = object()
    assert predictor_upgrade(service) is None
    service.config = ServerConfig(predictor=PredictorConfig(kind='fallback'))
    assert predictor_upgrade(service) is None


def test_predictor_build_reports_built_files_and_sees_a_running_build(tmp_path, capsys):
    """`timebill predictor build`: nothing to do when both files exist; a live lock is seen."""
    import argparse
    import os

    from timebill_ros.cli import predictor as cli_predictor
    from timebill_ros.cli import predictor_build
    rlp, readout = tmp_path / 'rlp.onnx', tmp_path / 'readout.onnx'
    rlp.write_bytes(b'x')
    readout.write_bytes(b'y')
    args = argparse.Namespace(params=None, set=[f'predictor.model_file={rlp}',
                                                f'predictor.readout_file={readout}'],
                              background=True, nice=10, prompts=0, model=None)
    assert cli_predictor.cmd_build(args, []) == 0
    assert 'predictors built' in capsys.readouterr().out
    lock = tmp_path / 'build.lock'
    lock.write_text(str(os.getpid()))  # a live process: a build is running
    assert predictor_build._build_running(lock)
    lock.write_text('999999999')
    assert not predictor_build._build_running(lock)
