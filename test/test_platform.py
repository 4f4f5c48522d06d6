"""The robot's platform: Python 3.10 (ROS 2 Humble, JetPack 6) and the robot's install file.

pip's resolver check of requirements-robot.txt for each target needs the package index, so it
runs in .ci/run (scripts/check_robot_install.sh), not here.
"""

import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _vermin(*paths):
    """Run vermin (a console script only, beside this Python) on ``paths``."""
    beside = pathlib.Path(sys.executable).parent / 'vermin'
    command = str(beside) if beside.exists() else shutil.which('vermin')
    if command is None:
        raise FileNotFoundError('vermin is not installed (requirements.txt pins it)')
    return subprocess.run([command, '-t=3.10-', '--violations', '--no-tips',
                           '--eval-annotations', *map(str, paths)],
                          capture_output=True, text=True)


def test_the_code_runs_on_python_3_10():
    """No syntax or standard library newer than 3.10 in the package, scripts, tests."""
    run = _vermin(ROOT / 'timebill_ros', ROOT / 'test', ROOT / 'benchmarks', ROOT / 'launch',
                  ROOT / 'scripts' / 'timebill')
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize('source', ['import tomllib\n',
                                    'try:\n    pass\nexcept* ValueError:\n    pass\n',
                                    'from typing import Self\n'])
def test_the_check_sees_what_3_10_lacks(tmp_path, source):
    """The 3.10 check can fail: 3.11-only syntax and standard library are found."""
    (tmp_path / 'newer.py').write_text(source)
    assert _vermin(tmp_path / 'newer.py').returncode != 0


def _requirements(name):
    lines = (ROOT / name).read_text().splitlines()
    return [Requirement(line.split('#')[0].strip()) for line in lines
            if line.split('#')[0].strip()]


def test_the_robot_file_leaves_torch_and_onnxruntime_to_the_platform():
    names = {r.name.lower() for r in _requirements('requirements-robot.txt')}
    assert not names & {'torch', 'onnxruntime', 'onnxruntime-gpu'}
    assert {'transformers', 'kvpress', 'gguf', 'numpy', 'scipy', 'pyyaml'} <= names


def test_the_ci_pins_lie_inside_the_robot_ranges():
    """What CI tests (requirements.txt, exact pins) is one of the sets the robot file allows."""
    pins = {}
    for requirement in _requirements('requirements.txt'):
        pinned = [s.version for s in requirement.specifier if s.operator == '==']
        if pinned:
            pins[requirement.name.lower()] = pinned[0]
    for requirement in _requirements('requirements-robot.txt'):
        name = requirement.name.lower()
        assert name in pins, f'{name} is in requirements-robot.txt but not pinned for CI'
        assert requirement.specifier.contains(pins[name]), (name, pins[name],
                                                            str(requirement.specifier))


def test_the_readme_installs_the_robot_file():
    readme = (ROOT / 'README.md').read_text()
    robot = readme.split('## On a ROS 2 robot', 1)[1].split('\n## ', 1)[0]
    assert re.search(r'pip install -r \S*requirements-robot\.txt', robot)
    assert 'requirements.txt' not in robot.replace('requirements-robot.txt', '')


def test_the_dev_file_adds_to_the_runtime_file_and_pins_exactly():
    """requirements-dev.txt (tests, benchmarks) names nothing requirements.txt has; all pinned."""
    runtime, dev = _requirements('requirements.txt'), _requirements('requirements-dev.txt')
    assert not {r.name.lower() for r in runtime} & {r.name.lower() for r in dev}
    for requirement in runtime + dev:
        assert [s.operator for s in requirement.specifier] == ['=='], str(requirement)
