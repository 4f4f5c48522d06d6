"""The CUDA path in one command (``make gpu-check``): what a Jetson user's GPU would run.

    timebill study gpu_check refusals --out DIR   # formats the GPU cannot run: refused
    timebill study gpu_check stops    --out DIR   # prefill cost of chunks, stop latency
    timebill study gpu_check demo     --out DIR   # the demo's goals through the core

Each part appends its rows to ``DIR/gpu_check.jsonl`` and prints a short table;
``report`` makes ``DIR/gpu_check.md`` of them. ``scripts/gpu_check.sh`` runs every part and
``timebill enginebench --device cuda``. No ROS here: the node is a thin layer over the core
service the demo part drives (``factory.build_service``, the node's own start-up), and rclpy
never touches the GPU.

``stops``: the embedded model on the GPU in float16 (config/jetson_orin.yaml), a robot-log
prompt of ~4.7k tokens. Its prefill unchunked and in the default chunks; then a cancel set by
a timer at 20 / 50 / 80 % of the prefill (and once mid-decode), with and without the per-layer
synchronize of ``Forward.layer_wait``. Latency: the cancel's set time to the moment the engine
stopped (``raised``) and to the moment the GPU was idle again (``idle``), against one decoder
layer of a chunk (the chunk's time / layers).
"""

import argparse
import collections
import dataclasses
import gc
import json
import os
import pathlib
import platform
import statistics
import sys
import threading
import time
import traceback

import torch

from timebill_ros import prompts
from timebill_ros.config import EngineConfig, EvictionConfig
from timebill_ros.engine import LlmEngine
from timebill_ros.engine.llm_engine import GenerationStopped, fixed_chunks
from timebill_ros.engine.stopping import CancelStop, StopCriteria
from timebill_ros.server.status import POLICY_KILL, POLICY_SKIP_NEXT
from timebill_ros.timing.probes import EngineProbes

LONG_LINES = 260   # robot-log lines: 4,742 tokens with the embedded tokenizer
CANCEL_AT = (0.2, 0.5, 0.8)   # of the prefill's time
REPEATS = 3


def _append(out, part, rows):
    out.mkdir(parents=True, exist_ok=True)
    with open(out / 'gpu_check.jsonl', 'a', encoding='utf-8') as f:
        for row in rows:
            f.write(json.dumps({'part': part, **row}) + '\n')


DEVICE = ['cuda']  # --device: cpu only to try this script out on a machine without a GPU


def _device():
    if DEVICE[0] == 'cuda' and not torch.cuda.is_available():
        sys.exit('gpu_check: torch sees no CUDA device')
    return DEVICE[0]


# --- refusals ------------------------------------------------------------------------------
def run_refusals(out):
    """Check that the formats that would crash on a GPU are refused with a ValueError."""
    gpu = torch.cuda.get_device_name(0) if _device() == 'cuda' else 'no GPU (a dry run)'
    rows = [{'what': 'env', 'torch': torch.__version__, 'cuda': torch.version.cuda,
             'gpu': gpu, 'python': platform.python_version(), 'host': platform.node(),
             'cpus': os.cpu_count(), 'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}]
    # Refused when the config is built, before any device is touched: checked on any machine.
    for name, kwargs in (('decode_weights gguf on cuda', {'decode_weights': 'gguf'}),
                         ('a .gguf model_path on cuda, decode_weights float32 in float16',
                          {'model_path': 'model.gguf', 'dtype': 'float16',
                           'decode_weights': 'float32'})):
        try:
            EngineConfig(device='cuda', **kwargs)
            rows.append({'what': name, 'ok': False, 'error': 'accepted'})
        except ValueError as exc:
            rows.append({'what': name, 'ok': True, 'error': str(exc)})
    _append(out, 'refusals', rows)
    for row in rows:
        print(row)


# --- stops ---------------------------------------------------------------------------------
def _prefill_s(engine, ids, chunk_tokens):
    engine.forward.synchronize()
    start = time.perf_counter()
    state = engine.prefill(ids, StopCriteria(), chunk_plan=fixed_chunks(chunk_tokens))
    engine.forward.synchronize()
    return time.perf_counter() - start, state.n_chunks


def _stop_latency(engine, run, at_s):
    """Return (raised_s, idle_s, stopped) of a cancel set ``at_s`` seconds into ``run``."""
    event, marks = threading.Event(), {}

    def cancel():
        marks['set'] = time.perf_counter()
        event.set()

    timer = threading.Timer(at_s, cancel)
    engine.forward.synchronize()
    timer.start()
    stopped = run(StopCriteria([CancelStop(event)]))
    raised = time.perf_counter()
    engine.forward.synchronize()
    idle = time.perf_counter()
    timer.cancel()
    if 'set' not in marks:
        return None, None, stopped
    return raised - marks['set'], idle - marks['set'], stopped


def _prefill_run(engine, ids, chunk_tokens):
    def run(interrupt):
        try:
            engine.prefill(ids, StopCriteria(), chunk_plan=fixed_chunks(chunk_tokens),
                           interrupt=interrupt)
        except GenerationStopped:
            return True
        return False
    return run


def _decode_run(engine, ids, n_tokens):
    state = engine.prefill(ids, StopCriteria())  # a fresh cache a run

    def run(interrupt):
        out = engine.decode(state, n_tokens, StopCriteria(), interrupt=interrupt)
        return len(out.token_ids) < n_tokens
    return run


def run_stops(out, lines=LONG_LINES, repeats=REPEATS):
    """Prefill cost of chunking and cancel latency on the GPU, with and without layer waits."""
    dtype = 'float16' if _device() == 'cuda' else 'float32'
    # No loop guard: the decode cancel below must find the answer still running.
    engine = LlmEngine.load(EngineConfig(device=_device(), dtype=dtype, loop_guard=False),
                            EvictionConfig())
    ids = engine.encode(prompts.long_prompt(lines, 7))
    chunk = engine.engine_config.prefill_chunk_tokens
    _prefill_s(engine, ids, len(ids))   # warm-up: kernels, allocator
    rows = []
    for chunk_tokens in (len(ids), chunk, 128):
        times = [_prefill_s(engine, ids, chunk_tokens) for _ in range(repeats)]
        seconds = statistics.median(t for t, _ in times)
        rows.append({'what': 'prefill', 'n_x': len(ids), 'chunk_tokens': chunk_tokens,
                     'n_chunks': times[0][1], 'prefill_s': seconds,
                     'layer_of_chunk_s': seconds / times[0][1] / engine.n_layers})
    base = rows[1]
    decode_s = EngineProbes(engine).measure_decode_step_s(512)
    for wait in (True, False):
        if not wait:
            engine.forward.layer_wait = lambda: None
        for fraction in CANCEL_AT:
            raised, idle, stopped = _stop_latency(
                engine, _prefill_run(engine, ids, chunk), fraction * base['prefill_s'])
            rows.append({'what': 'cancel in prefill', 'layer_wait': wait, 'at': fraction,
                         'stopped': stopped, 'raised_s': raised, 'idle_s': idle,
                         'layer_s': base['layer_of_chunk_s']})
        raised, idle, stopped = _stop_latency(engine, _decode_run(engine, ids[:512], 400),
                                              8 * decode_s)
        rows.append({'what': 'cancel in decode', 'layer_wait': wait, 'stopped': stopped,
                     'raised_s': raised, 'idle_s': idle,
                     'layer_s': decode_s / engine.n_layers, 'step_s': decode_s})
        engine.forward.__dict__.pop('layer_wait', None)
    _append(out, 'stops', rows)
    for row in rows:
        print({k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()})


# --- demo ----------------------------------------------------------------------------------
OFFLOAD_WAIT_S = 200.0  # the demo waits this long for the offload executor to attach


def run_demo(out, params_file, offload=False):
    """Send the demo planner's goals through the core service the node runs, on the GPU.

    offload: keep the params file's CPU offload executor (beside a GPU it loads and
    calibrates after the primary serves; the goals wait for it up to OFFLOAD_WAIT_S). Off by
    default: its first start loads and calibrates a second engine on the CPU cores, which did
    not fit the check's time when it came before the primary served (an H200 run timed out
    at 170 s inside it, 2026-11-27).
    """
    from timebill_ros.cli.demo import burst_goals, demo_goals
    from timebill_ros.params import load_config
    from timebill_ros.server.factory import build_service
    from timebill_ros.server.goals import GoalRejected, GoalRequest
    config = load_config(params_file)
    if not offload:
        config = dataclasses.replace(
            config, offload=dataclasses.replace(config.offload, enabled=False))
    start = time.perf_counter()
    service = build_service(config)
    service.start()
    rows = [{'what': 'start-up', 'seconds': time.perf_counter() - start,
             'decode_weights': service.engine.engine_config.decode_weights,
             'device': str(service.engine.device), 'params': params_file,
             'offload': config.offload.enabled}]
    if config.offload.enabled:  # beside a GPU it loads and calibrates while the primary serves
        while (time.perf_counter() - start < OFFLOAD_WAIT_S
               and not any(e.name == 'offload' for e in service.executors)):
            time.sleep(0.5)
        rows[0]['offload_ready_s'] = (time.perf_counter() - start if any(
            e.name == 'offload' for e in service.executors) else None)
    print(rows[0])
    try:
        for together, goals in ((False, demo_goals()), (True, burst_goals())):
            rows += _run_goals(service, goals, together, GoalRequest, GoalRejected)
        rows += run_decode_probe(service, GoalRequest)
    finally:
        service.shutdown()
    _append(out, 'demo', rows)


def _run_goals(service, goals, together, request_type, rejected_type):
    pending = []
    for label, prompt, budget_s, n_max, policy in goals:
        done, box = threading.Event(), []
        request = request_type(prompt=prompt, budget_s=budget_s, max_new_tokens=n_max,
                               overrun_policy=policy, goal_id=label)
        try:
            service.submit(request, lambda feedback: None,
                           lambda result, box=box, done=done: (box.append(result), done.set()))
        except rejected_type as exc:
            box.append(None)
            done.set()
            pending.append((label, budget_s, done, box, f'refused: {exc}'))
            continue
        pending.append((label, budget_s, done, box, ''))
        if not together:
            done.wait(120.0)
    rows = []
    for label, budget_s, done, box, refused in pending:
        finished = done.wait(120.0)
        result = box[0] if box else None
        row = {'what': 'goal', 'label': label, 'budget_s': budget_s, 'finished': finished}
        if result is None:
            row['status'] = refused or 'no result'
        else:
            row.update(status=result.status_name, total_s=result.total_time_s,
                       executor=result.executor,
                       wcet_s=result.predicted_wcet_s, execution_s=result.execution_time_s,
                       kill_latency_s=result.kill_latency_s, tokens=result.response_tokens,
                       deadline_met=result.deadline_met, alpha=result.eviction_ratio,
                       message=result.message)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
        rows.append(row)
    return rows


# --- decode probe: the bare engine's steps against the service's ---------------------------
PROBE_TOKENS = 64


def _task_cpu_s():
    """Return {native thread id: (name, CPU seconds)} of this process's threads (Linux)."""
    tick = os.sysconf('SC_CLK_TCK')
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir('/proc/self/task'):
        try:
            with open(f'/proc/self/task/{tid}/stat', encoding='ascii') as f:
                fields = f.read().rsplit(')', 1)[1].split()
            with open(f'/proc/self/task/{tid}/comm', encoding='ascii') as f:
                comm = f.read().strip()
        except OSError:
            continue
        out[int(tid)] = (names.get(int(tid), comm), (int(fields[11]) + int(fields[12])) / tick)
    return out


class _Sampler:
    """Sample one thread's innermost Python frames every ``period_s`` (where its time goes)."""

    def __init__(self, period_s=0.01):
        self.period_s, self.counts, self.target = period_s, collections.Counter(), None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name='probe-sampler', daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _loop(self):
        while not self._stop.wait(self.period_s):
            frame = sys._current_frames().get(self.target) if self.target else None
            if frame is not None:
                stack = traceback.extract_stack(frame)[-2:]
                self.counts[' < '.join(f'{pathlib.Path(f.filename).name}:{f.lineno} {f.name}'
                                       for f in reversed(stack))] += 1


def _measured(label, run):
    """Run ``run() -> (tokens, primary thread ident or None)``; return the probe's row."""
    gc_pauses, started = [], [0.0]

    def on_gc(phase, info):
        if phase == 'start':
            started[0] = time.perf_counter()
        else:
            gc_pauses.append(time.perf_counter() - started[0])
    gc.callbacks.append(on_gc)
    before, begin = _task_cpu_s(), time.perf_counter()
    try:
        with _Sampler() as sampler:
            tokens = run(sampler)
    finally:
        gc.callbacks.remove(on_gc)
    wall_s = time.perf_counter() - begin
    after = _task_cpu_s()
    busy = sorted(((after[t][1] - before.get(t, ('', 0.0))[1], after[t][0]) for t in after),
                  reverse=True)[:5]
    row = {'what': 'decode probe', 'label': label, 'tokens': tokens, 'wall_s': wall_s,
           'ms_per_token': 1e3 * wall_s / max(1, tokens), 'gc_n': len(gc_pauses),
           'gc_s': sum(gc_pauses), 'busy_threads': [[name, round(s, 3)] for s, name in busy],
           'primary_frames': sampler.counts.most_common(4)}
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    return row


def run_decode_probe(service, request_type):
    """Time the same 64-token answer from the bare engine and through the service's goal path.

    A third H200 run found the service's steps at 4-5x the bare engine's on the GPU. Each
    variant records every thread's CPU seconds (/proc), the gc pauses and where the thread that
    decodes spends its time (frames sampled every 10 ms), so the next GPU run names the cause;
    gc frozen and a 0.5 ms GIL switch interval are tried as remedies in the same process.
    """
    engine = service.engine
    ids = engine.encode(prompts.SHORT[0][1])

    def bare(sampler):
        sampler.target = threading.get_ident()
        with torch.inference_mode():
            state = engine.prefill(list(ids), StopCriteria())
            return len(engine.decode(state, PROBE_TOKENS, StopCriteria()).token_ids)

    def goal(policy):
        def run(sampler):
            done, box = threading.Event(), []
            request = request_type(prompt=prompts.SHORT[0][1], budget_s=60.0,
                                   max_new_tokens=PROBE_TOKENS, overrun_policy=policy,
                                   goal_id='decode probe')
            primary = [t for t in threading.enumerate() if t.name.endswith('primary')]
            sampler.target = primary[0].ident if primary else None
            service.submit(request, lambda feedback: None,
                           lambda result: (box.append(result), done.set()))
            done.wait(120.0)
            return box[0].response_tokens if box else 0
        return run

    rows = [_measured('bare engine, this thread', bare),
            _measured('service goal, Kill', goal(POLICY_KILL)),
            _measured('service goal, Skip-Next', goal(POLICY_SKIP_NEXT))]
    gc.freeze()
    rows.append(_measured('service goal, Kill, gc frozen', goal(POLICY_KILL)))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        rows.append(_measured('service goal, Kill, GIL switch 0.5 ms', goal(POLICY_KILL)))
        rows.append(_measured('bare engine, GIL switch 0.5 ms', bare))
    finally:
        sys.setswitchinterval(interval)
        gc.unfreeze()
    return rows


# --- report --------------------------------------------------------------------------------
def _parts(out):
    """Return the table of the check's parts (scripts/gpu_check.sh's parts.tsv), if written."""
    path = out / 'parts.tsv'
    if not path.exists():
        return []
    lines = ['', '## Parts', '', '| part | exit status | seconds | limit s |', '|---|---|---|---|']
    for line in path.read_text(encoding='utf-8').splitlines():
        command, rc, seconds, limit = line.split('\t')
        part = command.split(' --')[0].replace(sys.executable, 'python')
        lines.append(f'| `{part}` | {rc}{" (time limit)" if rc == "124" else ""} | '
                     f'{seconds} | {limit} |')
    return lines


def report(out):
    """Write ``gpu_check.md`` from ``gpu_check.jsonl``."""
    rows = [json.loads(line) for line in open(out / 'gpu_check.jsonl', encoding='utf-8')]
    lines = ['# The CUDA path', '',
             f'Recompute: `timebill study gpu_check report --out {out}` (reads only '
             'gpu_check.jsonl beside this file, and parts.tsv where there is one).', '']
    for row in rows:
        if row.get('what') == 'env':
            where = (f" Host {row['host']} ({row['cpus']} CPUs), {row['date']}."
                     if 'date' in row else ' Host and date: not in these rows.')
            lines.append(f"{row['gpu']}, torch {row['torch']} (CUDA {row['cuda']}), Python "
                         f"{row['python']}.{where}")
    lines += _parts(out)
    lines += ['', '## Refused formats', '', '| configuration | refused | message |',
              '|---|---|---|']
    lines += [f"| {r['what']} | {'yes' if r['ok'] else 'NO'} | {r['error']} |"
              for r in rows if r['part'] == 'refusals' and 'ok' in r]
    lines += ['', '## Prefill of a long prompt', '',
              '| N_x | chunk tokens | chunks | prefill s | one layer of a chunk, ms |',
              '|---|---|---|---|---|']
    lines += [f"| {r['n_x']} | {r['chunk_tokens']} | {r['n_chunks']} | {r['prefill_s']:.3f} | "
              f"{r['layer_of_chunk_s'] * 1e3:.2f} |" for r in rows if r['what'] == 'prefill']
    lines += ['', '## Cancel latency', '',
              '| where | layer wait | at | stopped | raised ms | GPU idle ms | one layer ms |',
              '|---|---|---|---|---|---|---|']
    for r in rows:
        if r['what'].startswith('cancel'):
            lines.append(f"| {r['what'][10:]} | {'on' if r['layer_wait'] else 'off'} | "
                         f"{r.get('at', '-')} | {r['stopped']} | {_ms(r['raised_s'])} | "
                         f"{_ms(r['idle_s'])} | {r['layer_s'] * 1e3:.2f} |")
    goals = [r for r in rows if r['what'] == 'goal']
    if goals:
        params = next((r.get('params', '') for r in rows if r['what'] == 'start-up'), '')
        lines += ['', f'## The demo goals ({params or "params file: not in these rows"})', '']
        lines += [f"Start-up {r['seconds']:.1f} s, decode_weights {r['decode_weights']} on "
                  f"{r['device']}, CPU offload executor "
                  f"{'on' if r.get('offload', True) else 'off'}."
                  for r in rows if r['what'] == 'start-up']
        lines += ['', '| goal | budget s | status | total s | t^_WCET s | execution s | '
                  'kill latency ms | tokens | met |', '|---|---|---|---|---|---|---|---|---|']
        for r in goals:
            lines.append(f"| {r['label']} | {r['budget_s']} | {r['status']} | "
                         f"{_num(r.get('total_s'))} | {_num(r.get('wcet_s'))} | "
                         f"{_num(r.get('execution_s'))} | {_ms(r.get('kill_latency_s'))} | "
                         f"{r.get('tokens', '-')} | {r.get('deadline_met', '-')} |")
        lines += ['', *_demo_counts(goals)]
    lines += _probe_lines(rows)
    (out / 'gpu_check.md').write_text('\n'.join(lines) + '\n', encoding='utf-8')
    print('\n'.join(lines))


def _demo_counts(goals):
    """Return the lines that count the demo's goals by status and against their t^_WCET.

    Ran: COMPLETED or KILLED with a t^_WCET made. Over t^_WCET by the execution time (the
    run, queue excluded: what t^_WCET bounds) and by the total time (the queue included).
    """
    statuses = collections.Counter(r['status'] for r in goals)
    met = sum(r['status'] == 'COMPLETED' and bool(r.get('deadline_met')) for r in goals)
    ran = [r for r in goals if r['status'] in ('COMPLETED', 'KILLED') and r.get('wcet_s')]
    over = {key: [r for r in ran if r[key] > r['wcet_s']] for key in ('execution_s', 'total_s')}
    names = '; '.join(f"{r['label']} {r['execution_s']:.3f} s (total {r['total_s']:.3f}) > "
                      f"{r['wcet_s']:.3f} s" for r in over['execution_s'])
    return [f"- goals: {len(goals)}; " + ', '.join(f'{name} {n}' for name, n in sorted(
                statuses.items())) + f' ({met} COMPLETED with deadline_met).',
            f"- over t^_WCET, of the {len(ran)} that ran (COMPLETED or KILLED): "
            f"{len(over['execution_s'])} by their execution time (queue excluded, what t^_WCET "
            f"bounds){': ' + names if names else ''}; {len(over['total_s'])} by their total "
            'time (queue included).']


def _probe_lines(rows):
    probes = [r for r in rows if r['what'] == 'decode probe']
    if not probes:
        return []
    lines = ['', '## Decode steps: the bare engine against the service', '',
             f'The same {PROBE_TOKENS}-token answer (the prefill included). Busy threads: CPU '
             'seconds during the run; frames: where the decoding thread was, sampled every '
             '10 ms.', '', '| run | tokens | ms/token | gc pauses (n, ms) | busy threads, CPU s '
             '| decoding thread frames |', '|---|---|---|---|---|---|']
    for r in probes:
        busy = ', '.join(f'{name} {s:.2f}' for name, s in r['busy_threads'])
        frames = '<br>'.join(f'{n} x {where}' for where, n in r['primary_frames'])
        lines.append(f"| {r['label']} | {r['tokens']} | {r['ms_per_token']:.1f} | "
                     f"{r['gc_n']}, {r['gc_s'] * 1e3:.1f} | {busy} | {frames} |")
    return lines


def _ms(seconds):
    return '-' if seconds is None else f'{seconds * 1e3:.1f}'


def _num(value):
    return '-' if value is None else f'{value:.3f}'


def main(argv=None):
    """Run one part of the check (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('part', choices=('refusals', 'stops', 'demo', 'report'))
    parser.add_argument('--out', default='log/gpu_check')
    parser.add_argument('--params', default='',
                        help='demo: the params file (default: config/jetson_orin.yaml on cuda, '
                        'config/llm.yaml on cpu)')
    parser.add_argument('--device', default='cuda',
                        help='cpu: a dry run of the whole check (CI), small sizes')
    parser.add_argument('--offload', action='store_true',
                        help="demo: keep the params file's CPU offload executor (a second "
                        'engine calibrated on the CPU at first start: minutes)')
    parser.add_argument('--lines', type=int, default=LONG_LINES,
                        help="stops: the prompt's log lines")
    args = parser.parse_args(argv)
    DEVICE[0] = args.device
    out = pathlib.Path(args.out)
    if args.part == 'refusals':
        run_refusals(out)
    elif args.part == 'stops':
        with torch.inference_mode():
            run_stops(out, args.lines, 1 if args.device == 'cpu' else REPEATS)
    elif args.part == 'demo':
        run_demo(out, args.params or ('config/jetson_orin.yaml' if args.device == 'cuda'
                                      else 'config/llm.yaml'), args.offload)
    else:
        report(out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
