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


# category -> (generator, count)
CATEGORIES = {
    'plan': (_plan, 90), 'explain': (_explain, 90), 'navigate': (_navigate, 90),
    'manipulate': (_manipulate, 90), 'yes_no': (_yes_no, 90), 'log_qa': (_log_qa, 70),
    'map_qa': (_map_qa, 60), 'summary': (_summary, 40), 'chat': (_chat, 60),
}
CATEGORIES.update({f'u_{k}': (_uncertainty(k), 40) for k in UNCERTAINTY})


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
