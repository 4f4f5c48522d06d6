"""``make reports``: rebuild the results tables docs/benchmark.md and docs/reliability.md cite.

    python -m timebill_ros.bench.reports            # rewrite each table from its raw rows
    python -m timebill_ros.bench.reports --check    # rebuild into a temporary folder; list drift

``TABLES`` holds every results table the two docs cite or copy from, each with the committed
raw rows it is made from and either the generator that rebuilds it (called in this process:
the function the benchmark's own report command runs) or why none can from committed rows.
A rebuild rewrites the tables (and the plots their generators draw beside them) in place;
``--check`` writes nothing in the tree, lists the committed tables that differ from their
rebuilt version and exits 1 if one does (or a rebuild fails). Either run first checks that
every ``benchmarks/results/`` path the two docs name is registered. The docs' own tables are
copied or condensed from these by hand.
"""

import argparse
import contextlib
import dataclasses
import difflib
import importlib
import io
import json
import os
import pathlib
import re
import sys
import tempfile
from typing import Callable, Optional, Tuple

DOCS = ('docs/benchmark.md', 'docs/reliability.md')
RESULTS = 'benchmarks/results'
SOAK = f'{RESULTS}/soak'
DIFF_LINES = 30  # at most this many lines of each differing table's diff are printed
CITED = re.compile(r'benchmarks/results/[\w./-]*')


@dataclasses.dataclass(frozen=True)
class Table:
    """A committed results table: the rows it is made from, its generator or why none."""

    path: str  # the table, relative to the tree's root
    reads: Tuple[str, ...]  # the committed raw rows it is made from
    build: Optional[Callable[[pathlib.Path, pathlib.Path], None]] = None  # (committed, out)
    why: str = ''  # why no generator rebuilds it from committed rows
    also: Tuple[str, ...] = ()  # what the generator rewrites beside it (plots)


def _json(path):
    return json.loads(pathlib.Path(path).read_text(encoding='utf-8'))


def _script(name):
    """Import study ``name`` (``timebill_ros/bench/studies/<name>.py``)."""
    return importlib.import_module(f'timebill_ros.bench.studies.{name}')


def splice_table(text, lines):
    """Return ``text`` with the Markdown table headed by ``lines[0]`` replaced by ``lines``."""
    old = text.split('\n')
    if lines[0] not in old:
        raise ValueError(f'no table headed {lines[0]!r} to replace')
    start = old.index(lines[0])
    end = start
    while end < len(old) and old[end].startswith('|'):
        end += 1
    return '\n'.join(old[:start] + list(lines) + old[end:])


def _prompt_bench(committed, out):
    """Rebuild a ``timebill bench`` (prompts workload) bench.md and bench.png.

    From bench_raw.json by ``timebill.summarize`` and ``timebill.write_report``; the raw rows
    keep no calibration, so the time-model fit block is carried over from the committed file.
    """
    from timebill_ros.bench import timebill
    text = committed.read_text(encoding='utf-8')
    marker = 'Time model (ETE) fit:\n```\n'
    if marker not in text:
        raise ValueError(f'{committed} has no time-model fit block to carry over')
    fit = text[text.index(marker) + len(marker):text.rindex('\n```')]
    raw = _json(committed.with_name('bench_raw.json'))
    timebill.write_report(timebill.summarize(raw['rows'], raw['refs']), out.parent, fit)


def prompt_bench_report(raw_path) -> int:
    """Rewrite bench.md and bench.png beside a prompts-workload ``bench_raw.json``, in place."""
    committed = pathlib.Path(raw_path).with_name('bench.md')
    _prompt_bench(committed, committed)
    return 0


def bench_table(folder):
    """Return the entry of a ``timebill bench`` prompts-workload run kept in ``folder``."""
    return Table(f'{folder}/bench.md', (f'{folder}/bench_raw.json',), _prompt_bench,
                 also=(f'{folder}/bench.png',))


def _breakdown(committed, out):
    """Rebuild ``timebill bench --breakdown``'s table from bench_raw.json."""
    from timebill_ros.bench.timebill import breakdown_lines, predictor_breakdown
    raw = _json(committed.with_name('bench_raw.json'))
    out.write_text('\n'.join(breakdown_lines(predictor_breakdown(raw))) + '\n',
                   encoding='utf-8')


def _robot_bench(committed, out):
    """Rebuild a robot-context run's tables and plot (``timebill bench --report RAW.json``)."""
    from timebill_ros.bench import robot_bench
    raw = _json(committed.with_name(committed.stem + '_raw.json'))
    robot_bench.write_report(raw, out.parent, committed.stem)


def _repeats(committed, out):
    """Rebuild a robot-context repeats.md (``timebill bench --repeats RAW...``).

    The raw rows: the folder's own robot_bench_raw.json, else each ``repeat*/`` one's.
    """
    from timebill_ros.bench import robot_repeats
    own = committed.with_name('robot_bench_raw.json')
    raws = [own] if own.is_file() else sorted(committed.parent.glob('repeat*/'
                                                                    'robot_bench_raw.json'))
    robot_repeats.report([os.path.relpath(raw) for raw in raws], out.parent)


def _responsiveness(committed, out):
    """Rebuild responsiveness.md's table (``timebill study responsiveness --report JSON``).

    The notes written under the table by hand (a run's history) stay.
    """
    blocks = _json(committed.with_suffix('.json'))
    table = [line for line in _script('responsiveness')._report(blocks).split('\n')
             if line.startswith('|')]
    out.write_text(splice_table(committed.read_text(encoding='utf-8'), table),
                   encoding='utf-8')


def _rlp_call_memory(committed, out):
    """Rebuild rlp_call_memory.md (``timebill study rlp_call_memory --table DIR``)."""
    script = _script('rlp_call_memory')
    rows = [json.loads(line) for line in committed.with_name(script.ROWS).read_text()
            .splitlines() if line]
    out.write_text(script.table(rows))


def _soak(committed, out):
    """Rebuild soak.md and soak.png (``timebill soak --report-only --out DIR``)."""
    from timebill_ros.bench import soak_report
    run = soak_report.read_run(str(committed.parent))
    soak_report.write_outputs(run, str(out.parent), keep_run=False, named=SOAK)


def _script_report(name):
    """Return the build of a table ``benchmarks/<name>.py --report`` makes from its rows.

    The rows: the JSON beside the table (the script's ``--json``), with the command, host
    and date the table's header names.
    """
    def build(committed, out):
        with contextlib.redirect_stdout(io.StringIO()):
            _script(name).main(['--report', '--json', str(committed.with_suffix('.json')),
                                '--out', str(out)])
    return build


def _under_load_table(committed, out):
    """Rebuild a README's runs table (``timebill study test_under_load_table DIR``)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _script('test_under_load_table').main([str(committed.parent)])
    out.write_text(splice_table(committed.read_text(encoding='utf-8'),
                                printed.getvalue().rstrip('\n').split('\n')), encoding='utf-8')


ROBOT = f'{RESULTS}/robot_context'
ONLINE = f'{RESULTS}/robot_context_online'
GEMMA = f'{RESULTS}/robot_context_gemma'  # the same benchmark on Gemma 3 270M, its own predictors
TABLES = (
    Table(f'{ROBOT}/robot_bench.md', (f'{ROBOT}/robot_bench_raw.json',), _robot_bench,
          also=(f'{ROBOT}/robot_bench.png',)),
    Table(f'{ONLINE}/repeat1/robot_bench.md', (f'{ONLINE}/repeat1/robot_bench_raw.json',),
          _robot_bench, also=(f'{ONLINE}/repeat1/robot_bench.png',)),
    Table(f'{ONLINE}/repeat2/robot_bench.md', (f'{ONLINE}/repeat2/robot_bench_raw.json',),
          _robot_bench, also=(f'{ONLINE}/repeat2/robot_bench.png',)),
    Table(f'{ONLINE}/repeat3/robot_bench.md', (f'{ONLINE}/repeat3/robot_bench_raw.json',),
          _robot_bench, also=(f'{ONLINE}/repeat3/robot_bench.png',)),
    Table(f'{ONLINE}/repeat4/robot_bench.md', (f'{ONLINE}/repeat4/robot_bench_raw.json',),
          _robot_bench, also=(f'{ONLINE}/repeat4/robot_bench.png',)),
    Table(f'{ONLINE}/repeats.md', tuple(f'{ONLINE}/repeat{n}/robot_bench_raw.json'
                                        for n in (1, 2, 3, 4)), _repeats),
    Table(f'{GEMMA}/robot_bench.md', (f'{GEMMA}/robot_bench_raw.json',), _robot_bench,
          also=(f'{GEMMA}/robot_bench.png',)),
    Table(f'{GEMMA}/repeats.md', (f'{GEMMA}/robot_bench_raw.json',), _repeats),
    Table(f'{GEMMA}/repeat2/robot_bench.md', (f'{GEMMA}/repeat2/robot_bench_raw.json',),
          _robot_bench, also=(f'{GEMMA}/repeat2/robot_bench.png',)),
    Table(f'{GEMMA}/repeat2/repeats.md', (f'{GEMMA}/repeat2/robot_bench_raw.json',), _repeats),
    Table(f'{RESULTS}/loop_rest/loop_rest.md', (f'{RESULTS}/loop_rest/loop_rest.json',),
          _script_report('loop_rest')),
    Table(f'{ONLINE}/wcet_check/repeats.md', (f'{ONLINE}/wcet_check/robot_bench_raw.json',),
          _repeats),
    Table(f'{ROBOT}/robot_bench_k.md', (f'{ROBOT}/robot_bench_k_raw.json',), _robot_bench,
          also=(f'{ROBOT}/robot_bench_k.png',)),
    Table(f'{ROBOT}/readout_resolution.md', (f'{ROBOT}/readout_resolution.json',),
          _script_report('readout_resolution')),
    # Its labels: the Vanilla lengths of robot_bench_vanilla.json, read when measuring.
    Table(f'{ROBOT}/readout_in_domain.md', (f'{ROBOT}/readout_in_domain.json',
                                            f'{ROBOT}/robot_bench_vanilla.json'),
          _script_report('readout_in_domain')),
    *(bench_table(f'{RESULTS}/{folder}'.rstrip('/')) for folder in (
        '', 'deadlines/bench_interleaved', 'deadlines/bench_interleaved_run1',
        'deadlines/bench_interleaved_run3', 'deadlines/bench_interleaved_run4',
        'deadlines/bench_seq_before', 'deadlines/bench_seq_after_chunk_bug', 'rlp_bench',
        'rlp_bench_256', 'rlp_bench_256_fractions', 'readout_bench_256',
        'refactor_ab/before/deadlines_bench', 'refactor_ab/head/deadlines_bench')),
    Table(f'{RESULTS}/rlp_bench/breakdown.md', (f'{RESULTS}/rlp_bench/bench_raw.json',),
          _breakdown),
    Table(f'{RESULTS}/reliability/responsiveness.md',
          (f'{RESULTS}/reliability/responsiveness.json',), _responsiveness),
    Table(f'{RESULTS}/reliability/rlp_call_memory.md',
          (f'{RESULTS}/reliability/rlp_call_memory.jsonl',), _rlp_call_memory),
    Table(f'{SOAK}/soak.md', tuple(f'{SOAK}/{name}' for name in (
        'soak_run.json', 'soak_goals.csv', 'soak_samples.csv')), _soak,
        also=(f'{SOAK}/soak.png',)),
    Table(f'{RESULTS}/reliability/goal_sender_10k/README.md',
          (f'{RESULTS}/reliability/goal_sender_10k/runs.json',), _under_load_table),
)


def cited_paths(text):
    """Return the ``benchmarks/results/`` paths a document names, in order, without repeats."""
    found = [match.rstrip('.').rstrip('/') for match in CITED.findall(text)]
    return list(dict.fromkeys(found))


def covers(tables, path):
    """Return whether ``path`` (a file or a folder) is a registered table, rows or plot."""
    return any(path == table.path or path in table.reads or path in table.also
               or table.path.startswith(path + '/') for table in tables)


def unregistered(tables, root):
    """Return ``[(doc, path)]``: results paths the docs under ``root`` cite and none covers."""
    missing = []
    for doc in DOCS:
        text = (pathlib.Path(root) / doc).read_text(encoding='utf-8')
        missing += [(doc, path) for path in cited_paths(text) if not covers(tables, path)]
    return missing


def _build(table, committed, out, say):
    """Run one table's generator quietly; return the error's text, or None."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.redirect_stdout(io.StringIO()):
            table.build(committed, out)
    except Exception as error:  # the other tables are still rebuilt
        say(f'failed          {table.path}: {type(error).__name__}: {error}')
        return str(error)
    return None


def run(tables, root, check=False, say=print):
    """Rebuild (or with ``check``, compare) every table; return the exit status.

    A rebuild writes each table in place; a check writes into a temporary folder and says
    which committed tables differ from their rebuilt version. 1: a table differs (check) or
    its generator failed.
    """
    root = pathlib.Path(root)
    counts = {'same': 0, 'differs': 0, 'rebuilt': 0, 'failed': 0, 'not rebuildable': 0}
    with tempfile.TemporaryDirectory(prefix='timebill_reports_') as tmp:
        for table in tables:
            committed = root / table.path
            if table.build is None:
                counts['not rebuildable'] += 1
                say(f'not rebuildable {table.path}: {table.why}')
                continue
            out = pathlib.Path(tmp) / table.path if check else committed
            before = committed.read_text(encoding='utf-8') if committed.is_file() else ''
            if _build(table, committed, out, say) is not None:
                counts['failed'] += 1
                continue
            after = out.read_text(encoding='utf-8')
            if not check:
                counts['rebuilt'] += 1
                say(f"rebuilt         {table.path}{'' if after == before else ' (changed)'}")
                continue
            if after == before:
                counts['same'] += 1
                say(f'same            {table.path}')
                continue
            counts['differs'] += 1
            say(f'differs         {table.path}')
            diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(),
                                             'committed', 'rebuilt', lineterm='', n=0))
            for line in diff[:DIFF_LINES]:
                say(f'    {line}')
            if len(diff) > DIFF_LINES:
                say(f'    ... {len(diff) - DIFF_LINES} more diff lines')
    say('; '.join(f'{n} {name}' for name, n in counts.items() if n) or 'no tables')
    return 1 if counts['differs'] or counts['failed'] else 0


def main(argv=None):
    """Rebuild or check the results tables (module docstring); return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--check', action='store_true',
                        help='rebuild into a temporary folder and list the committed tables '
                        'that differ (exit 1 if one does); writes nothing in the tree')
    parser.add_argument('--root', default='.', help='the tree (default: here)')
    args = parser.parse_args(argv)
    missing = unregistered(TABLES, args.root)
    for doc, path in missing:
        print(f'not registered  {path} (cited in {doc}): add it to TABLES in '
              'timebill_ros/bench/reports.py')
    status = run(TABLES, args.root, check=args.check)
    return 1 if missing else status


if __name__ == '__main__':
    sys.exit(main())
