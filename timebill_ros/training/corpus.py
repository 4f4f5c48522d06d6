"""The prompt corpus the response-length predictors learn from, built from templates.

Nothing is downloaded: every prompt is generated here from word lists and templates with a
seeded ``random.Random``, so the corpus (ids, texts, splits) is identical on every machine.
Categories cover what a robot or vehicle stack sends (task plans, explanations, navigation and
manipulation instructions, Q&A over logs and maps, summaries, yes/no checks), general chat,
and RT-LM's six linguistic-uncertainty types (Table I). Many prompts carry an explicit length
instruction ("in one word", "in detail"), as planners do; that is what makes length learnable.

The split of each prompt (train / val / test) is fixed by a seeded hash of its id, never by
its position, so adding prompts later does not move old ones between splits.
"""

import dataclasses
import hashlib
import random
from typing import Iterator, List

from timebill_ros import prompts as robot_prompts

CORPUS_SEED = 20261121
SPLITS = ('train', 'val', 'test')
SPLIT_FRACTIONS = (0.70, 0.15, 0.15)
# The family-held-out view: whole categories (template families) go to val or test by a
# seeded hash of the category name, so its test prompts come from families never trained on.
FAMILY_SEED = 20261124
FAMILY_FRACTIONS = (0.65, 0.15, 0.20)
# Prompts longer than this are dropped (after generation, so no other prompt changes): the
# longest kept are about 3,600 tokens; 7,000-token summaries cost too much collection time.
MAX_PROMPT_CHARS = 8000

PLACES = ['kitchen', 'hallway', 'warehouse aisle 4', 'loading dock', 'charging station',
          'lab', 'office 12', 'parking lot', 'garage', 'elevator lobby', 'greenhouse',
          'server room', 'assembly line 2', 'cafeteria', 'storage room B', 'front entrance']
OBJECTS = ['red cup', 'screwdriver', 'cardboard box', 'medicine bottle', 'tennis ball',
           'laptop', 'wrench', 'water bottle', 'apple', 'pallet', 'toolbox', 'book',
           'plastic crate', 'sensor module', 'battery pack', 'cable reel']
SURFACES = ['table', 'shelf', 'conveyor belt', 'floor', 'counter', 'workbench', 'cart',
            'top drawer', 'tray']
VEHICLES = ['forklift', 'delivery robot', 'drone', 'autonomous car', 'mobile manipulator',
            'cleaning robot', 'quadruped']
TOPICS = ['lidar', 'SLAM', 'PID control', 'path planning', 'battery management',
          'object detection', 'inverse kinematics', 'sensor fusion', 'ROS 2 actions',
          'collision avoidance', 'odometry', 'GPS', 'torque control', 'computer vision',
          'reinforcement learning', 'Kalman filters']
LENGTH_HINTS = [
    ('one_word', 'Answer in one word.'), ('yes_no', 'Answer only yes or no.'),
    ('one_sentence', 'Answer in one sentence.'), ('short', 'Keep it short.'),
    ('three_bullets', 'Answer in three bullet points.'), ('', ''), ('', ''),
    ('detail', 'Explain in detail.'), ('long', 'Give a thorough, step-by-step answer.'),
]
CHAT = ['Hi! How are you today?', 'Tell me a joke about robots.', 'What is your name?',
        'Write a short poem about the ocean.', 'What is the capital of France?',
        'Recommend a good book for a long trip.', 'How do I boil an egg?',
        'What is 17 times 23?', 'Say good morning in Spanish.',
        'Write a haiku about autumn.', 'Who invented the telephone?',
        'Give me three tips to sleep better.', 'What does a bee do?',
        'Describe your favourite color.', 'Why is the sky blue?',
        'Write a story about a lost dog.', 'What is the boiling point of water?',
        'Translate "thank you" into German.', 'Thanks, that was helpful!',
        'Count from one to ten.', 'What is photosynthesis?', 'Name four planets.',
        'Write an email to a colleague asking for a meeting tomorrow.',
        'What should I cook for dinner tonight?', 'How many legs does a spider have?']
# RT-LM Table I: six linguistic-uncertainty types, each with templates of our own.
UNCERTAINTY = {
    'structural': ['The robot saw the worker on the platform with the camera. What happened?',
                   'The operator hit the box with the cart. Describe the scene.',
                   'Move the crate near the door with the red label.',
                   'I watched the drone over the field with binoculars. Who had them?',
                   'The engineer tested the arm in the lab with the new sensor. Explain.'],
    'syntactic': ['Time flies like an arrow; fruit flies like a banana. What does it mean?',
                  'The old man the boats. Is this sentence correct?',
                  'Robot lifts box drops. What happened?',
                  'Visiting engineers can be tiring. Who is tired?',
                  'Flying drones can be dangerous. Why?'],
    'semantic': ['What is the best way to deal with a bug?', 'How do I check the bank?',
                 'What should I do about the mouse?', 'How do I fix the trunk?',
                 'Where can I find a good monitor?', 'How do I handle the pitch?',
                 'What is a good way to charge?'],
    'vague': ['Tell me about robots.', 'Tell me about the history of {topic}.',
              'What do you know about {topic}?', 'Talk about {place}s.',
              'Say something about technology.', 'Tell me about science.'],
    'open_ended': ['What are the causes and consequences of traffic accidents?',
                   'How will robots change the way people work?',
                   'What makes a good robot design?',
                   'Why do some projects in {topic} fail?',
                   'What is the future of {topic}?',
                   'How should society regulate autonomous vehicles?'],
    'multi_part': ['How do a {vehicle} and a {vehicle2} differ in speed, sensors and cost?',
                   'What is {topic}, how does it work, and where is it used?',
                   'Compare {topic} and {topic2}: strengths, weaknesses and use cases.',
                   'Who builds robots, what do they cost, and how long do they last?',
                   'Explain {topic}, give an example, and list two common mistakes.'],
}


@dataclasses.dataclass(frozen=True)
class CorpusItem:
    """One prompt of the corpus.

    prompt_id: stable id (category + index). category: template family.
    split: ``train`` / ``val`` / ``test``. prompt: the user message (no chat template).
    """

    prompt_id: str
    category: str
    split: str
    prompt: str


def split_of(prompt_id: str, seed: int = CORPUS_SEED) -> str:
    """Return the split of ``prompt_id``: a seeded hash, 70 / 15 / 15 percent."""
    digest = hashlib.sha256(f'{seed}:{prompt_id}'.encode()).digest()
    u = int.from_bytes(digest[:8], 'big') / 2.0 ** 64
    if u < SPLIT_FRACTIONS[0]:
        return SPLITS[0]
    if u < SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]:
        return SPLITS[1]
    return SPLITS[2]


def family_splits(categories=None, seed: int = FAMILY_SEED) -> dict:
    """Return {category: split} of the family-held-out view.

    Categories are ordered by a seeded hash of their names; the first FAMILY_FRACTIONS[2] of
    them (rounded) go to test, the next FAMILY_FRACTIONS[1] to val, the rest to train: a
    neutral choice with a fixed number of families in each split (a hash per category alone
    leaves 2 of 22 in test).
    """
    names = sorted(CATEGORIES if categories is None else categories,
                   key=lambda c: hashlib.sha256(f'{seed}:{c}'.encode()).digest())
    n_test = round(FAMILY_FRACTIONS[2] * len(names))
    n_val = round(FAMILY_FRACTIONS[1] * len(names))
    return {name: (SPLITS[2] if i < n_test else SPLITS[1] if i < n_test + n_val else SPLITS[0])
            for i, name in enumerate(names)}


def _hint(rng) -> str:
    return rng.choice(LENGTH_HINTS)[1]


def _join(*parts) -> str:
    return ' '.join(p for p in parts if p)


def _plan(rng):
    return _join(f'Make a step-by-step plan for the {rng.choice(VEHICLES)} to '
                 f'{rng.choice(["clean", "inspect", "map", "patrol", "restock"])} the '
                 f'{rng.choice(PLACES)}.', _hint(rng))


def _explain(rng):
    topic, vehicle = rng.choice(TOPICS), rng.choice(VEHICLES)
    goal = rng.choice(['avoid obstacles', 'save energy', 'localize', 'grasp objects',
                       'stay on schedule'])
    return _join(f'Explain how {topic} helps a {vehicle} {goal}.', _hint(rng))


def _navigate(rng):
    a, b = rng.sample(PLACES, 2)
    vehicle = rng.choice(VEHICLES)
    how = rng.choice(['avoiding people', 'at low speed', 'by the shortest path',
                      'without using the elevator'])
    return _join(f'You are a {vehicle} in the {a}. Navigate to the {b} {how}. '
                 'Describe the route you take.', _hint(rng))


def _manipulate(rng):
    return _join(f'Pick up the {rng.choice(OBJECTS)} from the {rng.choice(SURFACES)} and put '
                 f'it on the {rng.choice(SURFACES)}. What grasp and motions do you use?',
                 _hint(rng))


def _yes_no(rng):
    checks = [f'Is the {rng.choice(OBJECTS)} on the {rng.choice(SURFACES)}?',
              f'Is the {rng.choice(PLACES)} free of people right now?',
              f'Can the {rng.choice(VEHICLES)} carry the {rng.choice(OBJECTS)}?',
              f'Is the battery above {rng.randint(5, 95)} percent if the last reading was '
              f'{rng.randint(5, 95)} percent?',
              f'Should the {rng.choice(VEHICLES)} stop if a person is {rng.uniform(0.2, 5):.1f} '
              'm ahead?']
    return _join(rng.choice(checks), rng.choice(['Answer yes or no.', 'Yes or no?', '']))


def _log_qa(rng):
    n_lines = rng.choice([8, 15, 30, 60, 120, 200])
    log = robot_prompts.robot_log(n_lines, seed=rng.randrange(10 ** 6))
    question = rng.choice(['What was the lowest battery level?',
                           'Did the robot detect any humans? Answer yes or no.',
                           'List every door that opened.', 'Which goals were reached?',
                           'What went wrong during this mission? Explain.',
                           'How many obstacles were detected?'])
    return f'Robot log:\n{log}\n\n{question} {_hint(rng)}'.strip()


def _map_qa(rng):
    rooms = rng.sample(PLACES, rng.randint(4, len(PLACES)))
    lines = [f'- {r}: x={rng.uniform(-50, 50):.1f} m, y={rng.uniform(-50, 50):.1f} m, '
             f'{rng.choice(["open", "closed", "restricted"])}' for r in rooms]
    a, b = rng.sample(rooms, 2)
    question = rng.choice([f'Which room is closest to the {a}?',
                           f'Is the {b} open? Answer yes or no.',
                           f'Plan a route from the {a} to the {b}.',
                           'List the restricted rooms.'])
    return 'Map of the site:\n' + '\n'.join(lines) + f'\n\n{question}'


def _summary(rng):
    n_lines = rng.choice([20, 60, 120, 250, 400])
    log = robot_prompts.robot_log(n_lines, seed=rng.randrange(10 ** 6))
    what = rng.choice(['in one sentence', 'in three bullet points', 'for the operator',
                       'in detail, with a timeline', 'in under twenty words'])
    return f'Summarize this mission report {what}:\n{log}'


def _chat(rng):
    return rng.choice(CHAT)


def _uncertainty(kind):
    def make(rng):
        v1, v2 = rng.sample(VEHICLES, 2)
        t1, t2 = rng.sample(TOPICS, 2)
        text = rng.choice(UNCERTAINTY[kind]).format(
            topic=t1, topic2=t2, vehicle=v1, vehicle2=v2, place=rng.choice(PLACES))
        return _join(text, rng.choice(['', '', _hint(rng)]))
    return make


# --- Families added for issue 14: what robot stacks send beyond one-shot questions ---------
OPERATORS = ['Operator', 'Planner', 'Supervisor', 'Maintenance']
ITEMS_TO_LIST = ['safety checks before a mission', 'tools a maintenance robot carries',
                 'failure modes of a lidar', 'steps to calibrate a camera',
                 'things to inspect on a forklift', 'ways a delivery robot can get stuck',
                 'rules for working next to people', 'parts of a robot arm']


def _dialogue(rng):
    """Return a multi-turn-style context (an earlier exchange) and a new question."""
    vehicle, place, obj = rng.choice(VEHICLES), rng.choice(PLACES), rng.choice(OBJECTS)
    who = rng.choice(OPERATORS)
    turns = [f'{who}: Send the {vehicle} to the {place}.',
             f'Robot: On my way to the {place}. ETA {rng.randint(1, 15)} minutes.',
             f'{who}: Did you see the {obj}?',
             f'Robot: Yes, the {obj} is on the {rng.choice(SURFACES)}.']
    turns = turns[:rng.choice([2, 4])]
    question = rng.choice([f'Now bring it to the {rng.choice(PLACES)}. Confirm.',
                           'What should you do next? Explain your reasoning.',
                           'Summarize what happened so far.', 'Are you done? Yes or no.',
                           f'Why did the {vehicle} take so long?'])
    return 'Conversation so far:\n' + '\n'.join(turns) + f'\n{who}: {question}'


def _sensor_qa(rng):
    """Return a long sensor snapshot and a short, exact question."""
    n = rng.choice([6, 12, 24, 48, 96])
    lines = [f'motor_{i}: temp={rng.uniform(20, 90):.1f} C, current={rng.uniform(0, 8):.2f} A, '
             f'status={rng.choice(["ok", "ok", "ok", "warn", "fault"])}' for i in range(n)]
    i = rng.randrange(n)
    question = rng.choice([f'What is the temperature of motor_{i}? Give the number only.',
                           'Which motors report a fault? List their names only.',
                           f'Is motor_{i} ok? Answer yes or no.',
                           'Explain what the warnings could mean for the mission.'])
    return 'Sensor snapshot:\n' + '\n'.join(lines) + f'\n\n{question}'


def _long_request(rng):
    """Return a short request that asks for a long answer."""
    topic, vehicle = rng.choice(TOPICS), rng.choice(VEHICLES)
    return rng.choice([
        f'Write a complete operations manual for a {vehicle}, with every section in full.',
        f'Write a long, detailed tutorial on {topic} for new engineers.',
        f'Describe a full day of work of a {vehicle} in the {rng.choice(PLACES)}, hour by hour.',
        f'Write a story of at least five paragraphs about a {vehicle} that learns {topic}.',
        f'Give a detailed comparison of ten different {vehicle}s.'])


def _length_instruction(rng):
    """Return a request with an explicit length (items, words, sentences)."""
    n = rng.choice([1, 2, 3, 5, 8, 10, 15, 20, 30, 50])
    topic = rng.choice(TOPICS)
    return rng.choice([
        f'List {n} {rng.choice(ITEMS_TO_LIST)}.',
        f'Explain {topic} in exactly {n} sentences.',
        f'Describe {topic} in about {n * 10} words.',
        f'Give {n} numbered steps to set up {topic} on a {rng.choice(VEHICLES)}.'])


def _ramble(rng):
    """Return a prompt that makes a small model ramble or loop (count, repeat, list)."""
    a = rng.randint(1, 50)
    return rng.choice([
        f'Count from {a} to {a + rng.choice([20, 50, 100, 200])}.',
        f'Repeat the word "{rng.choice(["robot", "stop", "battery", "ok"])}" '
        f'{rng.choice([10, 30, 100])} times.',
        f'Keep listing {rng.choice(ITEMS_TO_LIST)} until you run out of ideas.',
        f'Write every {rng.choice(["even", "odd"])} number below {rng.choice([40, 100, 300])}.',
        f'Say everything you know about {rng.choice(TOPICS)}, then about '
        f'{rng.choice(TOPICS)}, then about {rng.choice(TOPICS)}.'])


def _to_json(rng):
    """Return a request to turn a list into JSON: the answer grows with the input."""
    n = rng.choice([2, 4, 8, 16, 32])
    points = [f'{rng.choice(PLACES)} ({rng.uniform(-50, 50):.1f}, {rng.uniform(-50, 50):.1f})'
              for _ in range(n)]
    return ('Convert these waypoints to a JSON list of objects with keys name, x and y:\n'
            + '\n'.join(points))


def _plan_paraphrase(rng):
    """Return a plan request in other words (a planner's phrasing, not ours)."""
    task = rng.choice(['clean', 'inspect', 'map', 'patrol', 'restock'])
    return _join(rng.choice([
        f'I need the {rng.choice(VEHICLES)} to {task} the {rng.choice(PLACES)}. How should it '
        'go about it?',
        f'Could you outline what a {rng.choice(VEHICLES)} must do to {task} the '
        f'{rng.choice(PLACES)}?',
        f'Task: {task} {rng.choice(PLACES)}. Robot: {rng.choice(VEHICLES)}. Output the plan.',
        f'What are the steps for {task}ing the {rng.choice(PLACES)} with a '
        f'{rng.choice(VEHICLES)}?']), _hint(rng))


# category -> (generator, count)
CATEGORIES = {
    'plan': (_plan, 90), 'explain': (_explain, 90), 'navigate': (_navigate, 90),
    'manipulate': (_manipulate, 90), 'yes_no': (_yes_no, 90), 'log_qa': (_log_qa, 70),
    'map_qa': (_map_qa, 60), 'summary': (_summary, 40), 'chat': (_chat, 60),
}
CATEGORIES.update({f'u_{k}': (_uncertainty(k), 40) for k in UNCERTAINTY})
CATEGORIES.update({
    'dialogue': (_dialogue, 50), 'sensor_qa': (_sensor_qa, 50),
    'long_request': (_long_request, 40), 'length_instruction': (_length_instruction, 60),
    'ramble': (_ramble, 40), 'to_json': (_to_json, 40), 'plan_paraphrase': (_plan_paraphrase, 50),
})


def build_corpus(seed: int = CORPUS_SEED) -> List[CorpusItem]:
    """Return every corpus item, deterministic for ``seed``; duplicates texts are dropped."""
    items, seen = [], set()
    for category, (make, count) in CATEGORIES.items():
        rng = random.Random(f'{seed}:{category}')
        for index in range(count * 3):
            if sum(1 for it in items if it.category == category) >= count:
                break
            text = make(rng)
            if text in seen or len(text) > MAX_PROMPT_CHARS:
                continue
            seen.add(text)
            prompt_id = f'{category}-{index:04d}'
            items.append(CorpusItem(prompt_id, category, split_of(prompt_id, seed), text))
    return items


def iter_split(items, split: str) -> Iterator[CorpusItem]:
    """Yield the items of ``split``."""
    if split not in SPLITS:
        raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
    return (it for it in items if it.split == split)


def quick_subset(items, n_prompts: int) -> List[CorpusItem]:
    """Return ``n_prompts`` train and val items spread evenly over the corpus order.

    What ``timebill predictor build --prompts N`` collects for a quick start: every category
    (the corpus is ordered by category) in its share, the test split kept out, so the quick
    build and the full one are judged on the same held-out prompts. The full corpus resumes
    from these.
    """
    if isinstance(n_prompts, bool) or not isinstance(n_prompts, int) or n_prompts < 1:
        raise ValueError(f'n_prompts must be an int >= 1, got {n_prompts!r}')
    pool = [it for it in items if it.split != 'test']
    if n_prompts >= len(pool):
        return pool
    return [pool[round(i * len(pool) / n_prompts)] for i in range(n_prompts)]
