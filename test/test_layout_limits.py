"""Size and coupling limits of the package, as ratchets (issue 61).

- No class over 25 methods or 400 lines. The classes over it today are listed with their
  size; a listed class may shrink, never grow, and leaves the list once under both limits.
- Overrun policies own their behaviour: a policy class sets only its ``name`` and ``code``,
  everything else is a method (server/overrun/base.py), and the flags that once told callers
  what a policy does are read nowhere.
The list is what is left to do, not what is allowed: a new entry fails.
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / 'timebill_ros'
MAX_METHODS = 25
MAX_LINES = 400
# class -> (lines, methods) of a class still over the limits; may only shrink. Empty since
# the engine, the service and the GGUF decoder were split (issue 61).
OVERSIZED = {}
# The flags policies had before they became strategies (issue 61).
OLD_POLICY_FLAGS = ('discards_late_result', 'stops_early', 'keeps_text_at_deadline',
                    'skips_due_goals')


def _files():
    return sorted(p for p in PACKAGE.rglob('*.py')
                  if p.relative_to(PACKAGE).parts[0] not in ('msg', 'action'))


def class_sizes():
    """Return {class name: (lines, methods, 'file:line')} of every class in the package."""
    out = {}
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
            if isinstance(node, ast.ClassDef):
                methods = [b for b in node.body
                           if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))]
                where = f'{path.relative_to(PACKAGE)}:{node.lineno}'
                out[f'{node.name} ({where})'] = (node.end_lineno - node.lineno + 1,
                                                 len(methods), node.name)
    return out


def flag_reads():
    """Return {file: reads} of the old overrun-policy flags (attribute loads) anywhere."""
    out = {}
    for path in _files():
        reads = sum(isinstance(node, ast.Attribute) and node.attr in OLD_POLICY_FLAGS
                    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))))
        if reads:
            out[path.relative_to(PACKAGE).as_posix()] = reads
    return out


def policy_class_attributes():
    """Return {class: names assigned in its body} of the classes of server/overrun/."""
    out = {}
    for path in sorted((PACKAGE / 'server' / 'overrun').glob('*.py')):
        for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
            if isinstance(node, ast.ClassDef):
                out[node.name] = {target.id for stmt in node.body
                                  if isinstance(stmt, ast.Assign) for target in stmt.targets
                                  if isinstance(target, ast.Name)}
    return out


def test_no_class_grows_past_the_limits():
    over = {where: (lines, methods, name)
            for where, (lines, methods, name) in class_sizes().items()
            if lines > MAX_LINES or methods > MAX_METHODS}
    for where, (lines, methods, name) in over.items():
        assert name in OVERSIZED, f'{where}: {lines} lines, {methods} methods (limits '\
            f'{MAX_LINES}, {MAX_METHODS})'
        allowed_lines, allowed_methods = OVERSIZED[name]
        assert lines <= allowed_lines and methods <= allowed_methods, (
            f'{where} grew to {lines} lines, {methods} methods (allowed {allowed_lines}, '
            f'{allowed_methods} until it is split)')
    done = set(OVERSIZED) - {name for _, _, name in over.values()}
    assert not done, f'{sorted(done)} now within the limits: remove from OVERSIZED'


def test_overrun_policies_are_strategies_not_flags():
    assert flag_reads() == {}, 'ask the policy (a method of server/overrun/base.py) instead'
    attributes = policy_class_attributes()
    assert {'OverrunPolicy', 'KillPolicy', 'PartialPolicy', 'SkipNextPolicy'} <= set(attributes)
    for name, assigned in attributes.items():
        assert assigned <= {'name', 'code'}, f'{name} sets {sorted(assigned)}: make it a method'


def test_the_checks_see_what_they_limit():
    sizes = class_sizes()
    assert any(name == 'LlmEngine' for _, _, name in sizes.values())
    assert policy_class_attributes()['KillPolicy'] == {'name', 'code'}


def test_no_text_names_the_rlp_package_that_became_training():
    """``rlp/`` became ``training/`` (and its server half ``predictors/``): no stale paths."""
    import re
    stale = re.compile(r'(?<![\w/])rlp[./](models|readout|corpus|export|prefill_features|'
                       r'compress|dataset)\b')
    found = [f'{path.relative_to(PACKAGE.parent)}: {match.group(0)}'
             for folder in (PACKAGE, PACKAGE.parent / 'benchmarks')
             for path in sorted(folder.rglob('*.py'))
             for match in stale.finditer(path.read_text(encoding='utf-8'))]
    assert found == []
    assert stale.search('see rlp/models/rlp.py') and not stale.search('data/rlp/x.jsonl')
