"""``timebill soak``: the real node under hours of seeded mixed load, sent from another process.

The node runs as ``timebill serve`` (its own process, continuous batching of 4, offload, the
``up`` scheduler, the prefix store on); this process plans the load from one
``random.Random(seed)`` (:func:`make_plan`) and plays it through ROS
(``timebill_ros.ros.stream_client``):

- Poisson arrivals at ``--rate`` goals/s, and a burst of BURST_GOALS goals every
  BURST_PERIOD_S seconds;
- budgets log-uniform from 0.02 s (impossible) to 30 s (generous); each overrun policy, or
  the server default, drawn uniformly;
- ~10 % canceled 0-2 s after sending; ~8 % bad inputs; ~10 % json_schema and ~10 % chat
  goals; ~30 % follow-up questions on 4 shared long contexts (the prefix store fills and
  evicts); the rest short robot instructions;
- at 1/3 of the run the node is deactivated for LIFECYCLE_PAUSE_S seconds (goals sent then
  end REJECTED, INACTIVE); at 2/3 the predictor files, when this machine has them, appear
  where the node looks for them (:func:`swap_predictor`), which is how the node swaps
  predictors.

Every SAMPLE_S seconds it samples the node process (RSS, threads, fds). At the end it stops
the node (SIGINT; SIGKILL after STOP_WAIT_S) and writes soak.md, soak.png and the kept run
(``timebill_ros.bench.soak_report``). Exit status 1 when a goal was lost, a result had no
terminal status, or the node died.
"""

import dataclasses
import datetime
import heapq
import json
import math
import os
import pathlib
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

from timebill_ros.server.status import (POLICY_DEFAULT, POLICY_KILL, POLICY_PARTIAL,
                                        POLICY_SKIP_NEXT)

DEFAULT_OUT = 'benchmarks/results/soak'
NODE_NAME = 'timebill_soak'  # the served node's name; its action is /<name>_<pid>/instruct
GRACE_S = 60.0  # a goal with no result by sent + budget + GRACE_S is lost, s
SAMPLE_S = 5.0  # how often the node process is sampled, s
READY_WAIT_S = 900.0  # longest wait for the action server (first start calibrates), s
STOP_WAIT_S = 20.0  # SIGINT, then SIGKILL after this long, s
DRAIN_MAX_S = 120.0  # after the load, longest wait for the last results, s
LIFECYCLE_PAUSE_S = 10.0  # deactivated this long at 1/3 of the run, s
BURST_GOALS = 6
BURST_PERIOD_S = 60.0
BURST_OFFSET_S = 30.0  # bursts at 30, 90, 150 ... s (not on the lifecycle's 1/3 mark)
BUDGET_RANGE_S = (0.02, 30.0)  # log-uniform, s
CANCEL_SHARE = 0.10
CANCEL_DELAY_S = (0.0, 2.0)
# What a goal is, drawn in this order with these shares (the rest: plain instructions).
KIND_SHARES = (('bad', 0.08), ('json', 0.10), ('chat', 0.10), ('followup', 0.30))
BAD_KINDS = ('empty_prompt', 'negative_budget', 'zero_budget', 'nan_temperature',
             'bad_schema', 'long_prompt', 'unknown_policy')
POLICIES = (POLICY_DEFAULT, POLICY_KILL, POLICY_SKIP_NEXT, POLICY_PARTIAL)
MAX_NEW_TOKENS = (0, 32, 64, 128)  # 0 = the server's default
N_CONTEXTS = 4
CONTEXT_CHARS = (1500, 3000)
LONG_PROMPT_CHARS = 70_000  # over queue.max_prompt_chars (65,536)
UNKNOWN_POLICY = 7
NODE_PARAMS = {'engine.model_path': '', 'scheduler.continuous': True,
               'scheduler.batch_size': 4, 'scheduler.policy': 'up', 'offload.enabled': True,
               'prefix_cache.enabled': True}

INSTRUCTIONS = (
    'Drive to the charging dock and report the battery level.',
    'Is the door to room 4 open? Answer yes or no.',
    'Pick up the red cup from the kitchen table.',
    'Plan a route from the lobby to the loading bay avoiding stairs.',
    'Name three reasons to slow down near people.',
    'Summarise the last patrol in one sentence.',
    'Which shelf holds the spare wheels?',
    'Give two steps to recover after a wheel slips.',
    'Greet the visitor at the front desk politely.',
    'Check whether aisle 3 is blocked and say what to do.',
    'List the tools needed to change a gripper finger.',
    'Explain how to back out of a dead-end corridor.',
    'Say which charger is free: A, B or C.',
    'Describe the safest way to carry a full glass.',
    'What should the robot do when the lidar fails?',
    'Write a short status message for the operator.',
    'Count the boxes on pallet 7 from the last scan.',
    'Suggest a waiting spot near the elevator.',
    'How long to wait before retrying a closed door?',
    'Tell the nurse the medicine cart has arrived.',
    'Rank these tasks by urgency: clean, charge, deliver.',
    'Give one sentence on why the map needs an update.',
    'Stop and explain why the bumper was pressed.',
    'Move the package from bay 2 to bay 5.',
    'Announce that the floor is wet near the entrance.',
    'Is it safe to cross the hall now? One reason.',
    'Plan the order to visit rooms 1, 5, 3 and 2.',
    'Report what the camera saw at the last waypoint.',
    'Write a two-line maintenance note for the left wheel.',
    'Decide whether to charge now or after the delivery.',
    'Find the fastest way to the fire exit.',
    'Describe the object on the table in five words.',
)
QUESTIONS = (
    'What happened last?', 'Which item is closest to the dock?', 'Summarise it in one line.',
    'Was there any error? Name it.', 'Which room was visited most?',
    'What should the robot do next?', 'List two risks in it.', 'How many entries are there?',
    'Which object is heaviest?', 'Where is the robot now?', 'What changed since the start?',
    'Give the main problem and a fix.',
)
CHATS = (
    (('user', 'Where is the dock?'), ('assistant', 'At the north wall, next to room 2.')),
    (('user', 'Is the lift working?'), ('assistant', 'Yes, it was serviced this morning.')),
    (('user', 'Pick up the box.'), ('assistant', 'Which box: the blue or the green one?')),
)
CHAT_FOLLOW_UPS = ('How far is it?', 'Go there now.', 'The blue one.', 'Thanks, what next?')
JSON_SCHEMAS = tuple(json.dumps({
    'type': 'object', 'properties': {'action': {'type': 'string', 'enum': list(actions)},
                                     second: {'type': 'integer'}},
    'required': ['action', second]}) for actions, second in (
        (('go', 'wait', 'stop'), 'distance_m'), (('pick', 'place'), 'slot'),
        (('charge', 'patrol'), 'minutes')))
PLACES = ('lobby', 'kitchen', 'bay 2', 'bay 5', 'room 4', 'corridor B', 'lift', 'dock',
          'workshop', 'entrance')
OBJECTS = ('red cup', 'blue box', 'green box', 'pallet', 'trolley', 'spare wheel', 'chair',
           'medicine cart', 'toolbox', 'ladder')
EVENTS = ('arrived', 'waited for a person', 'door closed, retried', 'battery at {n} %',
          'lidar glitch, recovered', 'wheel slipped', 'picked up an object', 'path replanned',
          'obstacle detected', 'operator message received')


@dataclasses.dataclass(frozen=True)
class GoalSpec:
    """One planned goal. Times in seconds from the start of the load.

    kind: 'plain', 'json', 'chat', 'followup' or 'bad:<what>' (BAD_KINDS). budget_s: the
    time budget sent (negative or zero for some bad goals). cancel_after_s: cancel this long
    after sending, or None. context: index of the shared context of a follow-up, else -1.
    """

    index: int
    at_s: float
    kind: str
    prompt: str
    budget_s: float
    policy: int
    max_new_tokens: int
    system_prompt: str = ''
    messages: tuple = ()
    json_schema: str = ''
    temperature: float = 0.0
    cancel_after_s: object = None
    context: int = -1

    def fields(self):
        """Return the fields as a dict (what ``stream_client.goal_message`` reads)."""
        return dataclasses.asdict(self)


def make_contexts(rng, count=N_CONTEXTS):
    """Return ``count`` synthetic long contexts (robot log, map, object list), 1.5-3 k chars."""
    makers = (_robot_log, _map_text, _object_list)
    return [makers[i % len(makers)](rng, rng.randint(*CONTEXT_CHARS), i) for i in range(count)]


def _grow(lines_of, target_chars, header):
    text = header
    line_no = 0
    while len(text) < target_chars:
        text += lines_of(line_no) + '\n'
        line_no += 1
    return text[:target_chars]


def _robot_log(rng, chars, index):
    def line(n):
        event = rng.choice(EVENTS).format(n=rng.randint(5, 99))
        return f'[{n * 7 // 60:02d}:{n * 7 % 60:02d}] {rng.choice(PLACES)}: {event}'
    return _grow(line, chars, f'Robot log {index} of the last shift:\n')


def _map_text(rng, chars, index):
    def line(n):
        a, b = rng.sample(PLACES, 2)
        kind = rng.choice(('open', 'narrow', 'ramp', 'door'))
        return f'edge {n}: {a} -> {b}, {rng.randint(2, 80)} m, {kind}'
    return _grow(line, chars, f'Map {index} of the building (edges between places):\n')


def _object_list(rng, chars, index):
    def line(n):
        return (f'object {n}: {rng.choice(OBJECTS)} at {rng.choice(PLACES)}, '
                f'{rng.randint(1, 40)} kg, seen {rng.randint(1, 59)} min ago')
    return _grow(line, chars, f'Object list {index} from the last scan:\n')


def _draw_kind(rng):
    u, edge = rng.random(), 0.0
    for kind, share in KIND_SHARES:
        edge += share
        if u < edge:
            return kind
    return 'plain'


def draw_goal(rng, index, at_s, contexts):
    """Return one GoalSpec sent at ``at_s`` seconds, drawn from ``rng``."""
    low, high = BUDGET_RANGE_S
    spec = dict(index=index, at_s=at_s, kind=_draw_kind(rng),
                budget_s=math.exp(rng.uniform(math.log(low), math.log(high))),
                policy=rng.choice(POLICIES), max_new_tokens=rng.choice(MAX_NEW_TOKENS),
                prompt=rng.choice(INSTRUCTIONS))
    if rng.random() < CANCEL_SHARE:
        spec['cancel_after_s'] = rng.uniform(*CANCEL_DELAY_S)
    if spec['kind'] == 'json':
        spec['json_schema'] = rng.choice(JSON_SCHEMAS)
    elif spec['kind'] == 'chat':
        chat = rng.choice(CHATS)
        spec.update(messages=chat, prompt=rng.choice(CHAT_FOLLOW_UPS))
    elif spec['kind'] == 'followup':
        spec['context'] = rng.randrange(len(contexts))
        spec['prompt'] = f'{contexts[spec["context"]]}\n\nQuestion: {rng.choice(QUESTIONS)}'
    elif spec['kind'] == 'bad':
        _make_bad(rng, spec)
    return GoalSpec(**spec)


def _make_bad(rng, spec):
    """Turn the goal dict ``spec`` into one bad input (its kind becomes 'bad:<what>')."""
    what = rng.choice(BAD_KINDS)
    spec['kind'] = f'bad:{what}'
    if what == 'empty_prompt':
        spec['prompt'] = rng.choice(('', '   '))
    elif what == 'negative_budget':
        spec['budget_s'] = -rng.uniform(0.1, 5.0)
    elif what == 'zero_budget':  # neither budget nor deadline
        spec['budget_s'] = 0.0
    elif what == 'nan_temperature':  # a Duration holds integers: the NaN goes in a float
        spec['temperature'] = float('nan')
    elif what == 'bad_schema':
        spec['json_schema'] = rng.choice(('{"type": "object", "properties": ',
                                          '{"type": "no-such-type"}', 'not json'))
    elif what == 'long_prompt':
        spec['prompt'] = ('Summarise: ' + 'the robot drove on. ' * LONG_PROMPT_CHARS)[
            :LONG_PROMPT_CHARS]
    elif what == 'unknown_policy':
        spec['policy'] = UNKNOWN_POLICY


def arrival_times(rng, duration_s, rate):
    """Return the send times (s) of one run: Poisson at ``rate`` /s, plus the bursts."""
    times, now = [], rng.expovariate(rate)
    while now < duration_s:
        times.append(now)
        now += rng.expovariate(rate)
    burst = BURST_OFFSET_S
    while burst < duration_s:
        times.extend([burst] * BURST_GOALS)
        burst += BURST_PERIOD_S
    return sorted(times)


def make_plan(seed, duration_s, rate):
    """Return (contexts, [GoalSpec] in send order): the whole load, from Random(seed) alone."""
    if not (isinstance(duration_s, (int, float)) and duration_s > 0):
        raise ValueError(f'duration_s must be > 0, got {duration_s!r}')
    if not (isinstance(rate, (int, float)) and rate > 0 and math.isfinite(rate)):
        raise ValueError(f'rate must be a finite number > 0 goals/s, got {rate!r}')
    rng = random.Random(seed)
    contexts = make_contexts(rng)
    times = arrival_times(rng, duration_s, rate)
    return contexts, [draw_goal(rng, i, t, contexts) for i, t in enumerate(times)]


# --- the node ------------------------------------------------------------------------------
def predictor_paths(folder, config):
    """Return [(source in the cache, path the soak's node reads)] of the predictor files.

    The RLP's offload sample (``<rlp>.lengths.json``, the offload threshold's input) comes
    first, so it is in place when the node sees the RLP; then the RLP and the readout. The
    node is pointed at ``folder``/predictors, where nothing is at the start: it serves with
    the fallback and looks for the files every ``predictor.reload_check_s``.
    """
    from timebill_ros.engine import model_source
    from timebill_ros.predictors.contract import default_onnx_path, default_readout_path
    from timebill_ros.predictors.threshold import lengths_path
    key = model_source.model_key(config.engine)
    cache = config.engine.model_cache_dir or None
    rlp = default_onnx_path(key, cache)
    sources = (lengths_path(rlp), rlp, default_readout_path(key, cache))
    target = pathlib.Path(folder) / 'predictors'
    return [(pathlib.Path(src), target / pathlib.Path(src).name) for src in sources]


def write_node_params(folder):
    """Write the node's params YAML into ``folder``; return (its path, the ServerConfig)."""
    from timebill_ros import params
    folder = pathlib.Path(folder)
    flat = dict(NODE_PARAMS, **{'timing.state_file': str(folder / 'online.yaml')})
    base = params.config_from_flat(flat)
    (_, rlp, readout) = [target for _, target in predictor_paths(folder, base)]
    config = params.config_from_flat(dict(flat, **{'predictor.model_file': str(rlp),
                                                   'predictor.readout_file': str(readout)}))
    path = folder / 'soak_params.yaml'
    path.write_text(params.to_yaml(config))
    return path, config


def start_node(params_file, log_path, node_name):
    """Start ``python -m timebill_ros.cli serve`` (the node itself, no shell); return Popen."""
    cmd = [sys.executable, '-m', 'timebill_ros.cli', 'serve', '--node-name', node_name,
           '--params', str(params_file)]
    log = open(log_path, 'w', encoding='utf-8')
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def stop_node(proc, wait_s=STOP_WAIT_S):
    """SIGINT the node, SIGKILL it after ``wait_s`` s; return (exit code, killed, seconds)."""
    start = time.monotonic()
    killed = False
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            killed = True
    return proc.returncode, killed, time.monotonic() - start


def sample_process(pid, t_s):
    """Return {t_s, rss_mb, threads, fds} of process ``pid`` (None when it is gone)."""
    import psutil
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return {'t_s': t_s, 'rss_mb': proc.memory_info().rss / 1e6,
                    'threads': proc.num_threads(), 'fds': proc.num_fds()}
    except psutil.Error:
        return None


def process_cmdline(pid):
    """Return the command line of process ``pid`` as one string ('' when it is gone)."""
    import psutil
    try:
        return ' '.join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ''


def swap_predictor(pairs):
    """Make the cached predictor files appear where the node looks; return what happened.

    pairs: :func:`predictor_paths`. Each file is copied beside its target and renamed into
    place, so the node never reads half a file. Returns {'copied': [paths], 'why': text}.
    """
    copied = []
    for source, target in pairs:
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + '.part')
            shutil.copyfile(source, partial)
            os.replace(partial, target)
            copied.append(str(target))
    if copied:
        return {'copied': copied, 'why': 'the predictor files appeared where the node looks'}
    names = ', '.join(str(source) for source, _ in pairs)
    return {'copied': [], 'why': f'no predictor swap: none of {names} exists on this machine '
            '(`make predictor` builds them), and the node swaps only when predictor files '
            'it lacks appear'}


def swap_log_lines(log_path):
    """Return the node log's lines about building or switching to a new service."""
    keys = ('is ready: building', 'switched to a service', 'not switched',
            'building a service with')
    try:
        text = pathlib.Path(log_path).read_text(encoding='utf-8', errors='replace')
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if any(k in line for k in keys)]


# --- playing the load ----------------------------------------------------------------------
class Recorder:
    """The goals' records, filled from the client's callbacks (times: s from the load start)."""

    def __init__(self, t0):
        self.t0 = t0
        self.records = []
        self.lock = threading.Lock()

    def new(self, spec, sent_s):
        """Add and return the record of ``spec``, sent at ``sent_s``."""
        record = {'index': spec.index, 'kind': spec.kind, 'at_s': spec.at_s, 'sent_s': sent_s,
                  'budget_s': spec.budget_s, 'policy': spec.policy,
                  'cancel_after_s': spec.cancel_after_s, 'response_s': None,
                  'accepted': None, 'ended_s': None, 'status': None}
        with self.lock:
            self.records.append(record)
        return record

    def on_response(self, record, now, accepted):
        """Record the goal response, which arrived at monotonic ``now`` (s)."""
        with self.lock:
            record['response_s'] = now - self.t0
            record['accepted'] = accepted

    def on_result(self, record, now, result, goal_status):
        """Record the result, which arrived at monotonic ``now`` (s)."""
        from timebill_ros.bench.rows import result_fields
        fields = result_fields(result)
        with self.lock:
            record.update(
                ended_s=now - self.t0, status=fields['status'], status_name=fields['status_name'],
                error_code=int(result.error_code), goal_status=goal_status,
                deadline_met=fields['deadline_met'], total_s=fields['total_s'],
                queue_s=fields['queue_s'], predicted_wcet_s=fields['predicted_wcet_s'],
                truncated=fields['truncated'], executor=fields['executor'],
                cached_tokens=int(result.cached_tokens), message=fields['message'][:200])

    def unresolved(self):
        """Return how many goals have neither a result nor a refused goal response."""
        with self.lock:
            return sum(1 for r in self.records
                       if r['ended_s'] is None and r['accepted'] is not False)

    def snapshot(self):
        """Return a copy of the records."""
        with self.lock:
            return [dict(r) for r in self.records]


class LoadPlayer:
    """Plays a plan against the node: sends, cancels, lifecycle, predictor swap, samples."""

    def __init__(self, client, proc, plan, duration_s, swap_pairs, say=print):
        self.client, self.proc, self.plan = client, proc, plan
        self.duration_s, self.swap_pairs, self.say = duration_s, swap_pairs, say
        self.t0 = time.monotonic()
        self.recorder = Recorder(self.t0)
        self.samples, self.events = [], []
        self._heap, self._seq = [], 0
        self.node_died_s = None

    def now_s(self):
        """Return seconds since the load started."""
        return time.monotonic() - self.t0

    def _at(self, t_s, action, *args):
        self._seq += 1
        heapq.heappush(self._heap, (t_s, self._seq, action, args))

    def play(self):
        """Run the load for ``duration_s`` seconds (less if the node dies)."""
        for spec in self.plan:
            self._at(spec.at_s, self._send, spec)
        self._at(self.duration_s / 3, self._lifecycle, 'deactivate')
        self._at(self.duration_s / 3 + LIFECYCLE_PAUSE_S, self._lifecycle, 'activate')
        self._at(2 * self.duration_s / 3, self._swap)
        t_s = 0.0
        while t_s <= self.duration_s:
            self._at(t_s, self._sample)
            t_s += SAMPLE_S
        for minute in range(1, int(self.duration_s // 60) + 1):
            self._at(minute * 60.0, self._progress)
        while self._heap and self.node_died_s is None:
            t_s, _, action, args = heapq.heappop(self._heap)
            self._sleep_until(t_s)
            if self.node_died_s is None:
                action(*args)

    def drain(self, max_s):
        """After the load, wait for the last results (at most ``max_s`` s); keep sampling."""
        end = self.now_s() + max_s
        next_sample = self.now_s()
        while self.node_died_s is None and self.now_s() < end and self.recorder.unresolved():
            if self.now_s() >= next_sample:
                self._sample()
                next_sample += SAMPLE_S
            self._sleep_until(min(next_sample, end, self.now_s() + 0.5))
        self._sample()

    def _sleep_until(self, t_s):
        while self.node_died_s is None:
            left = t_s - self.now_s()
            if self.proc.poll() is not None:
                self.node_died_s = self.now_s()
                self.events.append({'t_s': self.node_died_s, 'event': 'node exited',
                                    'code': self.proc.returncode})
                self.say(f'the node exited with code {self.proc.returncode}')
                return
            if left <= 0:
                return
            time.sleep(min(left, 0.25))

    def _send(self, spec):
        from timebill_ros.ros.stream_client import goal_message
        goal = goal_message(spec.fields())
        record = self.recorder.new(spec, self.now_s())
        sent = self.client.send(
            goal, lambda now, ok: self.recorder.on_response(record, now, ok),
            lambda now, result, code: self.recorder.on_result(record, now, result, code))
        if spec.cancel_after_s is not None:
            self._at(self.now_s() + spec.cancel_after_s, self.client.cancel, sent)

    def _lifecycle(self, transition):
        def change():
            start = self.now_s()
            ok = self.client.change_state(transition)
            self.events.append({'t_s': start, 'event': transition, 'ok': ok,
                                'took_s': self.now_s() - start})
            self.say(f'{start:7.1f} s: {transition} {"done" if ok else "FAILED"}')
        threading.Thread(target=change, name=f'soak-{transition}', daemon=True).start()

    def _swap(self):
        outcome = swap_predictor(self.swap_pairs)
        self.events.append(dict(outcome, t_s=self.now_s(), event='predictor swap'))
        self.say(f'{self.now_s():7.1f} s: {outcome["why"]}')

    def _sample(self):
        sample = sample_process(self.proc.pid, self.now_s())
        if sample is not None:
            self.samples.append(sample)

    def _progress(self):
        records = self.recorder.snapshot()
        ended = sum(r['ended_s'] is not None for r in records)
        rss = self.samples[-1]['rss_mb'] if self.samples else float('nan')
        self.say(f'{self.now_s() / 60:5.1f} min: {len(records)} sent, {ended} ended, '
                 f'node RSS {rss:.0f} MB')


def run_soak(args):
    """Run ``timebill soak``; return the exit status (1: a goal lost or the node died)."""
    from timebill_ros.bench import soak_report
    from timebill_ros.ros.stream_client import stream_session
    duration_s = _check_minutes(args.minutes) * 60.0
    out = pathlib.Path(args.out)
    if getattr(args, 'report_only', False):
        return report_again(out)
    out.mkdir(parents=True, exist_ok=True)
    contexts, plan = make_plan(args.seed, duration_s, args.rate)
    params_file, config = write_node_params(out)
    node_name = f'{NODE_NAME}_{os.getpid()}'
    started = datetime.datetime.now().isoformat(timespec='seconds')
    log_path = out / 'node.log'
    print(f'soak: {len(plan)} goals over {args.minutes:g} min (seed {args.seed}, rate '
          f'{args.rate:g}/s); node {node_name}, log {log_path}', flush=True)
    proc = start_node(params_file, log_path, node_name)
    node_cmdline = process_cmdline(proc.pid)
    player = None
    try:
        with stream_session(node_name, f'{node_name}_client') as client:
            ready_s = _wait_ready(client, proc, args.ready_wait_s)
            if ready_s is not None:
                print(f'node ready after {ready_s:.0f} s; load starts', flush=True)
                player = LoadPlayer(client, proc, plan, duration_s,
                                    predictor_paths(out, config),
                                    say=lambda text: print(text, flush=True))
                player.play()
                player.drain(args.drain_s)
    finally:
        exit_code, killed, stop_s = stop_node(proc)
        print(f'node exit code {exit_code}{" (killed)" if killed else ""} after '
              f'{stop_s:.1f} s', flush=True)
    run = {'command': soak_command(args), 'seed': args.seed, 'rate': args.rate,
           'duration_s': duration_s, 'host': platform.node(), 'cpus': os.cpu_count(),
           'date': started, 'grace_s': GRACE_S, 'node_params': str(params_file),
           'node_exit_code': exit_code, 'node_killed': killed, 'node_stop_s': stop_s,
           'ready': player is not None, 'node_pid': proc.pid, 'node_cmdline': node_cmdline,
           'context_chars': [len(c) for c in contexts]}
    if player is None:
        print(f'the node did not come up; see {log_path}', file=sys.stderr)
        run.update(records=[], samples=[], events=[], node_died_s=0.0, end_s=0.0,
                   swap_log=[])
    else:
        run.update(records=player.recorder.snapshot(), samples=player.samples,
                   events=player.events, node_died_s=player.node_died_s,
                   end_s=player.now_s(), swap_log=swap_log_lines(log_path))
    summary = soak_report.write_outputs(run, out)
    return 0 if summary['ok'] else 1


def report_again(out):
    """Rewrite soak.md and soak.png from the run kept in ``out`` (no new run)."""
    from timebill_ros.bench import soak_report
    run = soak_report.read_run(str(out))
    summary = soak_report.write_outputs(run, str(out), keep_run=False)
    return 0 if summary['ok'] else 1


def soak_command(args):
    """Return the ``timebill soak`` command line that repeats this run."""
    return (f'timebill soak --minutes {args.minutes:g} --rate {args.rate:g} --seed {args.seed} '
            f'--out {shlex.quote(str(args.out))}')


def _check_minutes(minutes):
    if not (isinstance(minutes, (int, float)) and math.isfinite(minutes) and minutes > 0):
        raise ValueError(f'--minutes must be a number > 0, got {minutes!r}')
    return float(minutes)


def _wait_ready(client, proc, wait_s):
    """Wait for the action server; return seconds waited, or None (node exited / timeout)."""
    start = time.monotonic()
    while not client.wait_for_server(5.0):
        if proc.poll() is not None or time.monotonic() - start > wait_s:
            return None
    return time.monotonic() - start


def add_arguments(parser):
    """Add ``timebill soak``'s flags."""
    parser.add_argument('--minutes', type=float, default=60.0,
                        help='how long the load runs, minutes (default 60)')
    parser.add_argument('--rate', type=float, default=1.0,
                        help='Poisson arrivals, goals per second (default 1.0; bursts extra)')
    parser.add_argument('--seed', type=int, default=0, help='seed of the whole load')
    parser.add_argument('--out', default=DEFAULT_OUT,
                        help='folder for soak.md, soak.png, the kept run and the node log')
    parser.add_argument('--ready-wait-s', type=float, default=READY_WAIT_S,
                        help='longest wait for the node to come up, s')
    parser.add_argument('--drain-s', type=float, default=DRAIN_MAX_S,
                        help='after the load, longest wait for the last results, s')
    parser.add_argument('--report-only', action='store_true',
                        help="rewrite --out's report from its kept run: soak_run.json and the "
                        'CSV rows (no new run)')
