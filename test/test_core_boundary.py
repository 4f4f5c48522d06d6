"""The core never imports rclpy or message types; only timebill_ros.ros does."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / 'timebill_ros'
ROS_MODULES = ('rclpy', 'builtin_interfaces', 'diagnostic_msgs', 'std_msgs', 'action_msgs',
               'rcl_interfaces', 'timebill_ros.msg', 'timebill_ros.action', 'timebill_ros.ros')


def _imports(path):
    tree = ast.parse(path.read_text(encoding='utf-8'))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


CORE_FILES = sorted(p for p in PACKAGE.rglob('*.py')
                    if 'ros' not in p.relative_to(PACKAGE).parts[:1]
                    and p.parent.name not in ('msg', 'action'))


def test_core_files_found():
    assert len(CORE_FILES) > 15


@pytest.mark.parametrize('path', CORE_FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_core_module_does_not_import_ros(path):
    bad = [name for name in _imports(path)
           if any(name == m or name.startswith(m + '.') for m in ROS_MODULES)]
    # cli.py / demo.py / bench.py / schedbench.py are front ends: they may reach the ROS
    # adapter lazily, inside functions, but never at module level.
    if path.name in ('cli.py', 'demo.py', 'bench.py', 'schedbench.py'):
        tree = ast.parse(path.read_text(encoding='utf-8'))
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        bad = [getattr(n, 'module', None) or n.names[0].name for n in top
               if any((getattr(n, 'module', None) or n.names[0].name).startswith(m)
                      for m in ROS_MODULES)]
    assert not bad, f'{path.name} imports {bad}'
