"""``make reports``: every results path the docs cite is registered; rebuild and check work."""

import json
import pathlib

import pytest

from timebill_ros.bench import reports

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADER = ['| policy | T / t^_e2e(vanilla) | method | completion rate | misses | ROUGE-L | '
          'mean alpha* (jobs that ran) |', '|---|---|---|---|---|---|---|']


def _section(text, title='## Rebuilding these tables'):
    return text.split(title, 1)[1].split('\n## ', 1)[0]


def test_the_parser_finds_links_and_folders():
    text = ('see [t](../benchmarks/results/a/b.md), `--out benchmarks/results/c/`.\n'
            '(`benchmarks/results/c`) and benchmarks/results/d.')
    assert reports.cited_paths(text) == ['benchmarks/results/a/b.md', 'benchmarks/results/c',
                                         'benchmarks/results/d']


def test_every_results_path_the_docs_cite_is_registered():
    assert reports.unregistered(reports.TABLES, ROOT) == []
    cited = [path for doc in reports.DOCS
             for path in reports.cited_paths((ROOT / doc).read_text(encoding='utf-8'))]
    assert 'benchmarks/results/robot_context/robot_bench.md' in cited
    assert 'benchmarks/results/soak/soak.md' in cited
    paths = [table.path for table in reports.TABLES]
    assert len(paths) == len(set(paths))
    sections = ''.join(_section((ROOT / doc).read_text(encoding='utf-8'))
                       for doc in reports.DOCS)
    for table in reports.TABLES:
        # a generator or a named reason, never both; its files are committed
        assert (table.build is None) == bool(table.why), table.path
        for path in (table.path,) + table.reads:
            assert (ROOT / path).is_file(), path
        if table.why:  # the docs list what `make reports` cannot rebuild
            assert table.path[len(reports.RESULTS) + 1:] in sections, table.path


def _bench_run(folder):
    rows = [('vanilla', 'a', 1, True, 'go to the dock', 0.0),
            ('vanilla', 'b', 2, False, '', 0.0),
            ('timebill', 'a', 1, True, 'go to the dock', 0.5),
            ('timebill', 'b', 1, True, 'yes', 0.3)]
    folder.mkdir(parents=True)
    (folder / 'bench_raw.json').write_text(json.dumps({
        'refs': {'a': 'go to the dock', 'b': 'yes'},
        'rows': [{'method': method, 'policy': 'kill', 'fraction': 1.0, 'prompt': prompt,
                  'status': status, 'deadline_met': met, 'response': response,
                  'alpha': alpha, 'decided': True}
                 for method, prompt, status, met, response, alpha in rows]}))
    stale = '| kill | 1.00 | vanilla | 0.00 | 2 | 0.000 | 0.00 |'
    (folder / 'bench.md').write_text('\n'.join(HEADER + [stale]) + '\n\nTime model (ETE) fit:\n'
                                     '```\nthe fit\n  as printed\n```\n')


def test_check_lists_drift_without_writing_and_the_rebuild_fixes_it(tmp_path):
    _bench_run(tmp_path / 'run')
    tables = (reports.bench_table('run'),
              reports.Table('run/other.md', ('run/bench_raw.json',), why='made by hand'))
    committed = (tmp_path / 'run' / 'bench.md').read_text()
    said = []
    assert reports.run(tables, tmp_path, check=True, say=said.append) == 1
    assert 'differs         run/bench.md' in said
    assert 'not rebuildable run/other.md: made by hand' in said
    assert (tmp_path / 'run' / 'bench.md').read_text() == committed
    assert not (tmp_path / 'run' / 'bench.png').exists()

    said.clear()
    assert reports.run(tables, tmp_path, say=said.append) == 0
    assert 'rebuilt         run/bench.md (changed)' in said
    assert (tmp_path / 'run' / 'bench.md').read_text() == '\n'.join(HEADER + [
        '| kill | 1.00 | timebill | 1.00 | 0 | 1.000 | 0.40 |',
        '| kill | 1.00 | vanilla | 0.50 | 1 | 0.500 | 0.00 |']) + (
        '\n\nTime model (ETE) fit:\n```\nthe fit\n  as printed\n```\n')  # the fit kept
    assert (tmp_path / 'run' / 'bench.png').exists()

    said.clear()
    assert reports.run(tables, tmp_path, check=True, say=said.append) == 0
    assert 'same            run/bench.md' in said


def test_a_failing_generator_is_named_and_fails_the_run(tmp_path):
    (tmp_path / 'run').mkdir()
    (tmp_path / 'run' / 'bench.md').write_text('no fit block here\n')
    said = []
    assert reports.run((reports.bench_table('run'),), tmp_path, check=True,
                       say=said.append) == 1
    assert said[0].startswith('failed          run/bench.md: ValueError: ')


def test_a_readme_keeps_its_prose_around_its_rebuilt_runs_table(tmp_path):
    (entry,) = [t for t in reports.TABLES if t.path.endswith('goal_sender_10k/README.md')]
    folder = tmp_path / 'load'
    folder.mkdir()
    (folder / 'runs.json').write_text(json.dumps(
        [{'run': 1, 'main_at': 'abc1234', 'date': '2026-11-29', 'tail': 'run_1.log'}]))
    (folder / 'run_1.log').write_text('....\n2 passed in 543.21s (0:09:03)\n')
    header = ('| run | main at | date | pytest | failures | pytest time | '
              'wall (set-up included) |\n|---|---|---|---|---|---|---|\n')
    (folder / 'README.md').write_text(f'# Runs\n\nprose\n\n{header}| 1 | old |\n\nafter\n')
    entry.build(folder / 'README.md', folder / 'README.md')
    assert (folder / 'README.md').read_text() == (
        f'# Runs\n\nprose\n\n{header}| 1 | abc1234 | 2026-11-29 | 2 passed, 0 skipped | 0 | '
        '9:03 | - |\n\nafter\n')
    with pytest.raises(ValueError, match='no table headed'):
        reports.splice_table('prose only\n', ['| a |', '|---|'])
