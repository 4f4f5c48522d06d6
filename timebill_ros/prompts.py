"""Robot-stack prompts for the demo and the benchmark, including long ones (KV size matters).

Long prompts are built from templates with a seeded generator, so they are the same on every
machine and nothing is downloaded.
"""

import random

SHORT = [
    ('nav', 'The robot is in the kitchen and must reach the charging dock in the hallway. '
            'Give a short step-by-step navigation plan.'),
    ('yesno', 'A pallet blocks aisle 3. Can the forklift take aisle 4 instead? '
              'Answer yes or no and one reason.'),
    ('explain', 'Explain in two sentences why a mobile robot slows down near people.'),
    ('grasp', 'List the steps for a robot arm to pick up a cup from a table and place it '
              'in a sink.'),
    ('safety', 'The lidar reports an obstacle 0.4 m ahead while moving at 1 m/s. '
               'What should the robot do?'),
    ('chat', 'Write a friendly one-line greeting a delivery robot says to a customer.'),
]

_EVENTS = [
    'battery at {b}%', 'localization confidence {c:.2f}', 'obstacle detected at {d:.1f} m',
    'replanning path around aisle {a}', 'gripper closed on object {o}',
    'wheel odometry drift {d:.2f} m', 'door {a} opened', 'human detected in zone {a}',
    'speed limited to {s:.1f} m/s', 'goal {o} reached', 'motor temperature {t} C',
]


def robot_log(n_lines, seed=0):
    """Return a deterministic synthetic robot log of ``n_lines`` lines."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        event = rng.choice(_EVENTS).format(
            b=rng.randint(5, 100), c=rng.random(), d=rng.uniform(0.1, 9.0),
            a=rng.randint(1, 12), o=rng.randint(100, 999), s=rng.uniform(0.1, 1.5),
            t=rng.randint(30, 90))
        lines.append(f'[{i * 1.7:8.1f} s] {event}')
    return '\n'.join(lines)


def long_prompt(n_lines, seed=0):
    """Return a log-summary instruction over a log of ``n_lines`` lines (~14 tokens a line)."""
    return ('Here is the robot log of the last mission:\n' + robot_log(n_lines, seed)
            + '\n\nSummarize the mission in three bullet points and name the main problem.')


def benchmark_prompts(quick=False):
    """Return [(name, prompt)] of varied lengths, short to a few thousand tokens."""
    sizes = (20, 150) if quick else (20, 60, 150)
    items = list(SHORT[:2] if quick else SHORT[:4])
    items += [(f'log{n}', long_prompt(n, seed=n)) for n in sizes]
    return items
