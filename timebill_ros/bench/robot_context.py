"""The "robot context" workload of ``timebill bench`` (issue 42): questions over long contexts.

A robot sends the same long context with every question - its mission log, the fleet's log,
the site map, its tool list, a sensor snapshot, the conversation so far - and asks follow-up
questions about it. With the context warm in the prefix store, decoding over a long KV is where
the time goes: TimeBill's regime. Each context is built from the corpus's robot material
(training/corpus.py's places, objects and vehicles; prompts.robot_log's events), grown line by
line to a target size in tokens, deterministic per seed. Each question asks for an answer of
about 64-256 tokens (a list, a summary, a plan, a report); where the context's own facts give
the answer (the errors of a log, the restricted rooms of a map, the faulty motors), the item
carries that reference answer, so a model strong enough to be scored by task success can be,
without changing the workload.

:func:`build_workload` returns the items; a goal's prompt is the context, a blank line and the
question (the context at the head of the user turn, as the prefix store reuses it).
"""

import dataclasses
import random
from typing import Callable, List, Optional, Tuple

from timebill_ros import prompts
from timebill_ros.training.corpus import OBJECTS, PLACES, SURFACES

KINDS = ('mission_log', 'fleet_log', 'site_map', 'tools', 'sensors', 'conversation')
# Two contexts of each kind, one short and one long, tokens (the 1-4k range).
SIZES = (1200, 3200)
WORKLOAD_SEED = 20261127


@dataclasses.dataclass(frozen=True)
class Item:
    """One question over one context.

    item_id: ``<context_id>/q<k>``; context_id: ``<kind>-<size>``; n_context: the context's
    tokens; reference: the answer the context's facts give, or '' where none does.
    """

    item_id: str
    context_id: str
    context: str
    question: str
    n_context: int
    reference: str = ''

    @property
    def prompt(self) -> str:
        """Return the goal's prompt: the context, a blank line, the question."""
        return f'{self.context}\n\n{self.question}'


def _grow(head: str, make_line: Callable[[int], str], n_tokens: int,
          count_tokens: Callable[[str], int]) -> Tuple[str, int]:
    """Return (text, lines): ``head`` and lines ``make_line(i)`` until ``n_tokens`` tokens."""
    lines = [head]
    step = 16
    while count_tokens('\n'.join(lines)) < n_tokens:
        lines += [make_line(len(lines) - 1 + i) for i in range(step)]
    while len(lines) > 2 and count_tokens('\n'.join(lines[:-1])) >= n_tokens:
        lines.pop()
    return '\n'.join(lines), len(lines) - 1


def _mission_log(rng, n_tokens, count_tokens):
    seed = rng.randrange(10 ** 6)
    events = prompts.robot_log(4000, seed=seed).split('\n')
    text, _ = _grow('Robot log of the current mission (time since start, event):',
                    lambda i: events[i], n_tokens, count_tokens)
    questions = [
        'Summarize this mission in five bullet points, with the time of each.',
        'Write a timeline of the ten most important events, one line each, with times.',
        'What went wrong during this mission? Explain each problem and its likely cause.',
        'Write a short maintenance report for the technician based on this log.',
        'Describe how the battery level changed over the mission and what the robot should '
        'do about it.',
        'Explain every replanning event: where it happened and what probably caused it.']
    return text, [(q, '') for q in questions]


ROBOTS = ('AMR-1', 'AMR-2', 'AMR-3', 'AMR-4')


def _fleet_log(rng, n_tokens, count_tokens):
    state = {'minute': 0, 'errors': []}

    def line(i):
        state['minute'] += rng.randint(1, 3)
        minute = state['minute']
        stamp = f'{8 + minute // 60:02d}:{minute % 60:02d}'
        robot = rng.choice(ROBOTS)
        kind = rng.random()
        if kind < 0.06:
            what = rng.choice(['wheel slip', 'lidar timeout', 'gripper jam', 'low voltage'])
            error = f'error E{rng.randint(10, 99)}: {what}'
            state['errors'].append((i, f'{stamp} {robot} {error}'))
            return f'{stamp} {robot} reported {error}'
        event = rng.choice([f'reached dock {rng.randint(1, 9)}',
                            f'picked the {rng.choice(OBJECTS)} at the {rng.choice(PLACES)}',
                            f'dropped a tote at dock {rng.randint(1, 9)}',
                            f'started charging at {rng.randint(8, 60)} % battery',
                            f'waited {rng.randint(2, 90)} s for a door at the '
                            f'{rng.choice(PLACES)}'])
        return f'{stamp} {robot} {event}'

    text, n_lines = _grow('Fleet log of the warehouse robots (time, robot, event):', line,
                          n_tokens, count_tokens)
    errors = '\n'.join(f'- {e}' for i, e in state['errors'] if i < n_lines) or '- none'
    questions = [
        ('List every error reported in the log, with its time and robot, one per line.',
         errors),
        ('For each robot, summarize what it did in two sentences.', ''),
        ('Which robot worked the most and which the least? Explain with examples from the '
         'log.', ''),
        ('Describe the charging pattern of the fleet and suggest a better charging schedule.',
         ''),
        ('Write a shift report for the supervisor in five bullet points.', ''),
        ('Which doors caused the longest waits? Suggest how to reduce them.', '')]
    return text, questions


def _site_map(rng, n_tokens, count_tokens):
    rooms = []

    def line(i):
        place = f'{rng.choice(PLACES)} {i + 1}'
        access = rng.choice(['open', 'open', 'closed', 'restricted'])
        rooms.append((place, access))
        return (f'- {place}: x={rng.uniform(-80, 80):.1f} m, y={rng.uniform(-80, 80):.1f} m, '
                f'{access}, floor {rng.choice(["concrete", "tiles", "carpet", "ramp"])}, '
                f'{rng.choice(["wide", "narrow"])} door')

    text, n_lines = _grow('Map of the site (room: position, access, floor, door):', line,
                          n_tokens, count_tokens)
    kept = rooms[:n_lines]
    restricted = '\n'.join(f'- {p}' for p, a in kept if a == 'restricted') or '- none'
    a, b = rng.sample([p for p, _ in kept], 2)
    questions = [
        ('List the restricted rooms of the site, one per line.', restricted),
        (f'Plan a route from the {a} to the {b}, step by step, and explain each step.', ''),
        ('Describe the layout of the site for a new robot, in one paragraph per area.', ''),
        ('Which rooms would be hard for a wheeled robot to reach, and why?', ''),
        (f'A delivery must go from the {b} to three rooms near it. Choose them and plan the '
         'tour.', ''),
        ('Write safety rules for a robot driving through this site.', '')]
    return text, questions


TOOL_VERBS = ('navigate_to', 'pick', 'place', 'open_door', 'scan_area', 'report', 'charge',
              'follow_person', 'inspect', 'wait', 'call_elevator', 'measure')


def _tools(rng, n_tokens, count_tokens):
    def line(i):
        verb = TOOL_VERBS[i % len(TOOL_VERBS)]
        return (f'- {verb}_{i}(target: str, speed_mps: float = {rng.uniform(0.2, 1.5):.1f}, '
                f'timeout_s: int = {rng.randint(5, 120)}): {verb.replace("_", " ")} the '
                f'{rng.choice(OBJECTS + PLACES)} on the {rng.choice(SURFACES)}; fails when '
                f'the {rng.choice(["battery", "path", "gripper", "camera"])} is not ready.')

    text, _ = _grow('Tools you can call (name(arguments): what it does):', line, n_tokens,
                    count_tokens)
    obj, place = rng.choice(OBJECTS), rng.choice(PLACES)
    questions = [
        (f'Bring the {obj} to the {place}. Write the tool calls in order, with arguments, '
         'and explain each one.', ''),
        ('Group the tools by what they are for and describe each group.', ''),
        ('Which tools can fail because of the battery? List them and say what to do when '
         'they fail.', ''),
        (f'Plan an inspection of the {place} with these tools, step by step.', ''),
        ('Explain to a new operator how to use the navigation tools safely.', ''),
        ('Write a recovery plan using these tools for when the robot gets stuck.', '')]
    return text, questions


def _sensors(rng, n_tokens, count_tokens):
    readings = []

    def line(i):
        status = rng.choice(['ok', 'ok', 'ok', 'ok', 'warn', 'fault'])
        temp = rng.uniform(20, 95)
        readings.append((f'motor_{i}', status, temp))
        return (f'motor_{i}: temp={temp:.1f} C, current={rng.uniform(0, 8):.2f} A, '
                f'vibration={rng.uniform(0, 3):.2f} g, status={status}')

    text, n_lines = _grow('Sensor snapshot of the robot (motor: readings, status):', line,
                          n_tokens, count_tokens)
    kept = readings[:n_lines]
    faults = '\n'.join(f'- {m}: {t:.1f} C' for m, s, t in kept if s == 'fault') or '- none'
    questions = [
        ('List every motor with status fault and its temperature, one per line.', faults),
        ('Explain what the warnings and faults could mean for the mission.', ''),
        ('Write a maintenance report: what to check first, second and third, and why.', ''),
        ('Which motors run hottest? Discuss possible causes and fixes.', ''),
        ('Should the robot continue its mission? Give a reasoned recommendation.', ''),
        ('Summarize the state of the drive system for the operator in five bullet points.',
         '')]
    return text, questions


OPERATORS = ('Operator', 'Planner', 'Supervisor')


def _conversation(rng, n_tokens, count_tokens):
    tasks = []

    def line(i):
        who = rng.choice(OPERATORS)
        if i % 2 == 0:
            task = f'bring the {rng.choice(OBJECTS)} to the {rng.choice(PLACES)}'
            tasks.append(task)
            return f'{who}: Please {task}.'
        return rng.choice([f'Robot: Done, the item is on the {rng.choice(SURFACES)}.',
                           f'Robot: On my way. ETA {rng.randint(1, 15)} minutes.',
                           'Robot: The door was closed, I waited and went through.',
                           f'Robot: I could not find it, I checked the {rng.choice(PLACES)}.'])

    text, n_lines = _grow('Conversation so far between the operators and the robot:', line,
                          n_tokens, count_tokens)
    asked = tasks[:(n_lines + 1) // 2]
    listed = '\n'.join(f'{k + 1}. {t}' for k, t in enumerate(asked[:8]))
    questions = [
        ('List the first eight tasks the operators gave, in order, one per line.', listed),
        ('Summarize the conversation so far in one paragraph.', ''),
        ('Which tasks failed or were delayed? Explain why for each.', ''),
        ('What should the robot do next? Explain your reasoning.', ''),
        ('Write a short report of the robot\'s work for the supervisor.', ''),
        ('Suggest three ways the operators could give clearer instructions, with examples '
         'from the conversation.', '')]
    return text, questions


BUILDERS = {'mission_log': _mission_log, 'fleet_log': _fleet_log, 'site_map': _site_map,
            'tools': _tools, 'sensors': _sensors, 'conversation': _conversation}


def build_workload(count_tokens: Callable[[str], int], sizes=SIZES, kinds=KINDS,
                   seed: int = WORKLOAD_SEED, questions: Optional[int] = None) -> List[Item]:
    """Return the workload's items: every kind at every size, six questions each.

    count_tokens: text -> tokens (the served model's tokenizer); sizes: context sizes, tokens;
    questions: keep the first this many questions of each context (None: all six).
    12 contexts x 6 questions = 72 items by default. Deterministic per seed.
    """
    if not callable(count_tokens):
        raise TypeError(f'count_tokens must be callable, got {count_tokens!r}')
    unknown = sorted(set(kinds) - set(BUILDERS))
    if unknown:
        raise ValueError(f'unknown context kinds {unknown}; known: {list(BUILDERS)}')
    items = []
    for kind in kinds:
        for size in sizes:
            if not isinstance(size, int) or size < 64:
                raise ValueError(f'a context size must be an int >= 64 tokens, got {size!r}')
            rng = random.Random(f'{seed}/{kind}/{size}')
            context, qs = BUILDERS[kind](rng, size, count_tokens)
            n_context = count_tokens(context)
            context_id = f'{kind}-{size}'
            for k, (question, reference) in enumerate(qs[:questions]):
                items.append(Item(f'{context_id}/q{k}', context_id, context, question,
                                  n_context, reference))
    return items
