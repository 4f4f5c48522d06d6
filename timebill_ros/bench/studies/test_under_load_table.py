"""The table of benchmarks/test_under_load.sh's runs, from their committed log tails.

    timebill study test_under_load_table DIR

DIR/runs.json lists each run (number, main's commit, date, its log tail's file); pytest's
counts and time, make's exit status and the wall time are read from the tail itself. A log of
pytest alone (no ``rc= wall=`` line, e.g. the GoalSender runs) has no wall column figure.
"""

import argparse
import json
import pathlib
import re


def run_row(entry, tail_text):
    """Return one run's table row from its runs.json entry and its log tail."""
    summary = re.findall(r'^(\d+ passed.*) in [\d.]+s \((\d+:\d+:\d+)\)$', tail_text, re.M)[-1]
    counts = re.findall(r'(\d+) (passed|failed|skipped)', summary[0])
    found = {kind: int(n) for n, kind in counts}
    hours, minutes, seconds = summary[1].split(':')
    end = re.findall(r'^rc=(\d+) wall=(\d+) s', tail_text, re.M)
    wall = f'{end[-1][1]} s (rc {end[-1][0]})' if end else '-'
    return (f"| {entry['run']} | {entry['main_at']} | {entry['date']} | "
            f"{found.get('passed', 0)} passed, {found.get('skipped', 0)} skipped | "
            f"{found.get('failed', 0)} | {int(hours) * 60 + int(minutes)}:{seconds} | {wall} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('dir', type=pathlib.Path)
    args = parser.parse_args(argv)
    print('| run | main at | date | pytest | failures | pytest time | wall (set-up included) |')
    print('|---|---|---|---|---|---|---|')
    for entry in json.loads((args.dir / 'runs.json').read_text()):
        print(run_row(entry, (args.dir / entry['tail']).read_text()))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
