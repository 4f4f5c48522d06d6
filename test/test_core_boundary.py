"""The layout's rules, by folder (docs/architecture.md, "Two wings").

- Every module lives in a known folder of one wing, or is one of the modules below both.
- The robot side (server, engine, timing, predictors, ros) imports nothing of the offline
  side (training, latency, bench, cli); below both imports neither wing.
- Only ``ros/`` imports rclpy or message types; the offline front ends (cli, bench) may reach
  the ROS adapter inside functions, never at module level; training and latency never.
- The package's import graph has no cycle.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / 'timebill_ros'
ROBOT = ('server', 'engine', 'timing', 'predictors', 'ros')
OFFLINE = ('training', 'latency', 'bench', 'cli')
BELOW_BOTH = ('__init__', 'config', 'params', 'checks', 'paths', 'prompts', 'plugins')
ROS_MODULES = ('rclpy', 'builtin_interfaces', 'diagnostic_msgs', 'std_msgs', 'action_msgs',
               'rcl_interfaces', 'lifecycle_msgs', 'timebill_ros.msg', 'timebill_ros.action',
               'timebill_ros.ros')
LAZY_ROS_ALLOWED = ('cli', 'bench')

FILES = sorted(p for p in PACKAGE.rglob('*.py')
               if p.relative_to(PACKAGE).parts[0] not in ('msg', 'action'))


def _module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix('').parts)
    if parts[-1] == '__init__':
        parts = parts[:-1]
    return '.'.join(parts)


MODULES = {_module_name(p): p for p in FILES}


def _wing(path):
    """Return 'robot', 'offline' or 'below' for a module file, or None if it fits no wing."""
    top = path.relative_to(PACKAGE).parts
    if len(top) == 1:
        return 'below' if path.stem in BELOW_BOTH else None
    if top[0] in ROBOT:
        return 'robot'
    return 'offline' if top[0] in OFFLINE else None


def _imports(path, top_level_only=False):
    """Yield (absolute module name, node) of each import in ``path``; relative ones resolved."""
    tree = ast.parse(path.read_text(encoding='utf-8'))
    nodes = tree.body if top_level_only else ast.walk(tree)
    package = _module_name(path).split('.')
    if path.name != '__init__.py':
        package = package[:-1]
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                stem = package[:len(package) - (node.level - 1)]
                base = '.'.join(stem + ([node.module] if node.module else []))
            for alias in node.names:
                # ``from pkg import submodule`` imports the submodule, else the module itself.
                child = f'{base}.{alias.name}'
                yield (child if child in MODULES else base), node


def _resolve(name):
    """Return the package module ``name`` refers to (longest known prefix), or None."""
    while name and name not in MODULES:
        name = name.rpartition('.')[0]
    return name or None


def _wing_of_name(name):
    module = _resolve(name)
    return None if module is None else _wing(MODULES[module])


def _is_ros(name):
    return any(name == m or name.startswith(m + '.') for m in ROS_MODULES)


def _edges():
    """Return {module: set of package modules it imports} (anywhere in the file)."""
    graph = {}
    for name, path in MODULES.items():
        targets = {_resolve(imported) for imported, _ in _imports(path)
                   if imported.startswith('timebill_ros')}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def _cycle(graph):
    """Return one import cycle of ``graph`` as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = 'open'
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 'open':
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 'done'
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_modules_found_in_both_wings():
    wings = {_wing(p) for p in FILES}
    assert {'robot', 'offline', 'below'} <= wings
    assert len(FILES) > 100


@pytest.mark.parametrize('path', FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_lives_in_a_wing(path):
    assert _wing(path) is not None, (
        f'{path.relative_to(PACKAGE)} is in no wing: robot side {ROBOT}, offline side '
        f'{OFFLINE}, or below both {BELOW_BOTH} (docs/architecture.md)')


@pytest.mark.parametrize('path', FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_wing_imports_follow_the_rule(path):
    wing = _wing(path)
    allowed = {'robot': {'robot', 'below'}, 'below': {'below'},
               'offline': {'robot', 'offline', 'below'}}[wing]
    bad = sorted({name for name, _ in _imports(path) if name.startswith('timebill_ros')
                  and not _is_ros(name) and _wing_of_name(name) not in allowed | {None}})
    assert not bad, f'{path.relative_to(PACKAGE)} ({wing}) imports {bad}'


@pytest.mark.parametrize('path', FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_ros_imports_ros(path):
    top = path.relative_to(PACKAGE).parts[0]
    if top == 'ros':
        return
    lazy_ok = top in LAZY_ROS_ALLOWED
    names = _imports(path, top_level_only=lazy_ok)
    bad = sorted({name for name, _ in names if _is_ros(name)})
    where = 'at module level' if lazy_ok else 'at all'
    assert not bad, f'{path.relative_to(PACKAGE)} may not import {bad} {where}'


def test_no_import_cycle():
    cycle = _cycle(_edges())
    assert cycle is None, 'import cycle: ' + ' -> '.join(cycle)


def test_cycle_finder_finds_a_planted_cycle():
    graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}
    assert _cycle(graph) == ['a', 'b', 'c', 'a']
    assert _cycle({'a': {'b'}, 'b': set()}) is None


def test_import_resolution_sees_submodules_and_relative_imports(tmp_path):
    edges = _edges()
    assert 'timebill_ros.engine.model_source' in edges['timebill_ros.engine.llm_engine']
    assert 'timebill_ros.checks' in edges['timebill_ros.config']


def _dev_imports():
    """Return the import names of the packages requirements-dev.txt adds (tests, benchmarks)."""
    names = set()
    for line in (PACKAGE.parent / 'requirements-dev.txt').read_text().splitlines():
        requirement = line.split('#')[0].strip()
        if requirement:
            name = requirement.split('==')[0].lower().replace('-', '_')
            names.add(name[:-3] if name.endswith('_py') else name)  # rpds-py imports rpds
    return names | {'attr'}  # attrs is imported as attr too


@pytest.mark.parametrize('path', FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_runtime_install_imports_every_module(path):
    """A test / benchmark package is imported inside functions only; never on the robot side.

    `make run` installs requirements.txt only (requirements-dev.txt is for the tests).
    """
    dev = _dev_imports()
    robot = _wing(path) == 'robot'
    for name, node in _imports(path, top_level_only=not robot):
        assert name.split('.')[0] not in dev, (
            f'{_module_name(path)} imports {name} (requirements-dev.txt) at line {node.lineno}')


def test_the_dev_imports_are_read_from_the_file():
    assert {'matplotlib', 'rouge_score', 'sentence_transformers', 'pytest', 'rpds'} <= (
        _dev_imports())
