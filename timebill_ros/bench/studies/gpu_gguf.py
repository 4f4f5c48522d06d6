"""The robot's own GGUF files on the GPU: the dense family decoder and its CUDA-graph steps.

    timebill study gpu_gguf reference --models M... --out DIR  # CPU fp32 answers
    timebill study gpu_gguf bare      --models M... --reference DIR --out DIR
    timebill study gpu_gguf serve     --models M... --out DIR
    timebill study gpu_gguf report    --out DIR

M: a .gguf path, or ``embedded`` (the packaged SmolLM2 Q4_1). ``reference`` answers held-out
prompts (the RLP test split) greedily on the CPU's fp32 GGUF kernels, ``N_TOKENS`` tokens, and
writes ``DIR/<file stem>.json`` (input ids and answer ids): the GPU run compares against it
without the CPU kernels. ``bare`` loads each file on the device per dtype (the dense decoder;
on the CPU too, a dry run) and measures greedy agreement with the reference, decoding
ms/token at 100 / 1000 / 3000 KV through the engine's decode loop (graphs on, and the same
static step without graphs), the bare step (the graph replay alone) and one-pass prefill of
512 / 2048 / 4096 tokens. ``serve`` starts the core service the node runs
(config/jetson_orin.yaml with the file as model_path, no offload) and sends ``N_GOALS``
held-out goals under Kill with budgets from ``BUDGETS_S``, then one 64-token goal at each KV
size and one ~4k-token prompt: t^_WCET coverage, Kill lateness, decode speed and prefill time
through the service. Every part
appends rows to ``DIR/gpu_gguf.jsonl``; ``report`` writes ``DIR/gpu_gguf.md``.
"""

import argparse
import dataclasses
import json
import pathlib
import platform
import statistics
import sys
import threading
import time

import torch

from timebill_ros.config import EngineConfig, EvictionConfig
from timebill_ros.engine import LlmEngine, model_source
from timebill_ros.engine.forward import PassHooks
from timebill_ros.engine.stopping import StopCriteria
from timebill_ros.timing.probes import EngineProbes

N_TOKENS = 32          # answer tokens compared with the CPU reference
N_PROMPTS = 30         # held-out prompts of the agreement
KV_SIZES = (100, 1000, 3000)
PREFILL_SIZES = (512, 2048, 4096)
N_GOALS = 50
BUDGETS_S = (2.0, 1.0, 0.5, 0.2, 0.08)
GOAL_TOKENS = 96       # N_max of the held-out goals
STEPS = 64             # decoding steps a timing


def _path(model: str) -> pathlib.Path:
    return model_source.embedded_gguf_path() if model == 'embedded' else pathlib.Path(model)


def _append(out: pathlib.Path, rows) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / 'gpu_gguf.jsonl', 'a', encoding='utf-8') as f:
        for row in rows:
            f.write(json.dumps(row) + '\n')
            print({k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()},
                  flush=True)


def _engine(model: str, device: str, dtype: str = 'float32', dense=True) -> LlmEngine:
    """Return the engine of ``model`` on ``device`` (the dense decoder in ``dtype``).

    dense False: the CPU's GGUF kernels with fp32 prefill GEMMs (the reference).
    """
    if dense:
        config = EngineConfig(model_path=str(_path(model)), device=device, dtype=dtype,
                              decode_weights=dtype, prefill_chunk_tokens=4096)
    else:
        config = EngineConfig(model_path=str(_path(model)), prefill_dtype='float32',
                              prefill_chunk_tokens=4096)
    return LlmEngine(config, EvictionConfig())


# --- reference (CPU) -----------------------------------------------------------------------
def run_reference(models, out: pathlib.Path, n_prompts=N_PROMPTS) -> None:
    """Write each model's greedy fp32 answers on the CPU's GGUF kernels (the reference)."""
    from timebill_ros.bench.timebill import rlp_test_prompts
    out.mkdir(parents=True, exist_ok=True)
    for model in models:
        engine = _engine(model, 'cpu', dense=False)
        items = []
        for prompt_id, prompt in rlp_test_prompts(n_prompts):
            ids = engine.encode(prompt)
            with torch.inference_mode():
                answer = engine.decode(engine.prefill(ids, StopCriteria()), N_TOKENS,
                                       StopCriteria())
            items.append({'prompt_id': prompt_id, 'input_ids': ids,
                          'answer_ids': answer.token_ids})
        path = out / f'{_path(model).stem}.json'
        path.write_text(json.dumps({
            'model': _path(model).name, 'n_tokens': N_TOKENS, 'device': 'cpu',
            'prefill_dtype': engine.engine_config.prefill_dtype, 'host': platform.node(),
            'date': time.strftime('%Y-%m-%d'),
            'command': 'timebill study gpu_gguf reference --models ' + ' '.join(models),
            'items': items}))
        print(f'{path}: {len(items)} answers', flush=True)


# --- bare engine (device) ------------------------------------------------------------------
def run_bare(models, reference: pathlib.Path, out: pathlib.Path, device: str, dtypes,
             quick=False) -> None:
    """Measure each model on ``device`` per dtype (the full grid for the first dtype)."""
    _append(out, [{'part': 'env', 'torch': torch.__version__, 'cuda': torch.version.cuda,
                   'gpu': (torch.cuda.get_device_name(0) if device == 'cuda' else 'none'),
                   'python': platform.python_version(), 'host': platform.node(),
                   'date': time.strftime('%Y-%m-%d %H:%M:%S')}])
    for model in models:
        for index, dtype in enumerate(dtypes):
            _bare_one(model, reference, out, device, dtype, full=index == 0 and not quick,
                      quick=quick)


def _bare_one(model, reference, out, device, dtype, full, quick) -> None:
    name = _path(model).name
    if device == 'cuda':
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    engine = _engine(model, device, dtype)
    row = {'part': 'load', 'model': name, 'dtype': dtype, 'load_s': time.perf_counter() - start,
           'weights_mb': engine.forward.weight_bytes / 1e6}
    if device == 'cuda':
        row['device_mb'] = (torch.cuda.memory_allocated() - before) / 1e6
    rows = [row]
    rows += _agreement(engine, name, dtype, reference, 8 if quick else None)
    kv_sizes = (KV_SIZES[:2] if quick else KV_SIZES) if full or quick else (1000,)
    for n_kv in kv_sizes:
        rows.append(_decode_row(engine, name, dtype, n_kv))
    if full:
        for n_x in PREFILL_SIZES:
            with torch.inference_mode():
                seconds = [EngineProbes(engine).measure_prefill_s(n_x) for _ in range(3)]
            rows.append({'part': 'prefill', 'model': name, 'dtype': dtype, 'n_x': n_x,
                         'seconds': statistics.median(seconds), 'all_s': seconds})
    if device == 'cuda':
        rows.append({'part': 'memory', 'model': name, 'dtype': dtype,
                     'peak_mb': torch.cuda.max_memory_allocated() / 1e6,
                     'buckets_mb': engine.forward.static_steps.held_bytes / 1e6,
                     'captures': engine.forward.static_steps.n_captures})
    _append(out, rows)
    del engine


def _agreement(engine, name, dtype, reference, limit):
    path = reference / f'{_path_stem(name)}.json'
    if not path.is_file():
        return [{'part': 'agreement', 'model': name, 'dtype': dtype, 'error': f'no {path}'}]
    items = json.loads(path.read_text())['items'][:limit]
    same, prefixes = 0, []
    for item in items:
        with torch.inference_mode():
            answer = engine.decode(engine.prefill(item['input_ids'], StopCriteria()),
                                   N_TOKENS, StopCriteria())
        same += answer.token_ids == item['answer_ids']
        prefix = 0
        for a, b in zip(answer.token_ids, item['answer_ids']):
            if a != b:
                break
            prefix += 1
        prefixes.append(prefix)
    return [{'part': 'agreement', 'model': name, 'dtype': dtype, 'prompts': len(items),
             'identical': int(same), 'share': same / max(1, len(items)),
             'same_prefix': prefixes}]


def _path_stem(name: str) -> str:
    return pathlib.Path(name).stem


def _decode_row(engine, name, dtype, n_kv):
    """ms/token through engine.decode with graphs (3 runs) and without (1), and the bare step."""
    steps = engine.forward.static_steps
    with torch.inference_mode():
        graphs = [EngineProbes(engine).measure_decode_step_s(n_kv, STEPS) for _ in range(3)]
        row = {'part': 'decode', 'model': name, 'dtype': dtype, 'n_kv': n_kv,
               'ms_per_token': 1e3 * statistics.median(graphs),
               'all_ms': [1e3 * s for s in graphs], 'step_ms': 1e3 * _bare_step_s(engine, n_kv)}
        if steps is not None and steps.graphs:
            steps.graphs = False
            row['eager_ms_per_token'] = 1e3 * EngineProbes(engine).measure_decode_step_s(
                n_kv, STEPS // 4)
            steps.graphs = True
    return row


def _bare_step_s(engine, n_kv) -> float:
    """Return the seconds of one forward step alone (run_step, argmax read), median of STEPS."""
    state = engine.prefill(engine.random_ids(n_kv), StopCriteria())
    token, hooks, times = state.first_token, PassHooks(), []
    for i in range(STEPS + 2):
        engine.synchronize()
        begin = time.perf_counter()
        logits, _ = engine.forward.run_step([token], [n_kv + i], [state.cache], [hooks])
        token = int(logits[0].argmax())
        times.append(time.perf_counter() - begin)
    return statistics.median(times[2:])


# --- through the service (device) ----------------------------------------------------------
def run_serve(models, out: pathlib.Path, device: str, params_file: str, dtype: str,
              n_goals=N_GOALS) -> None:
    """Held-out goals and one 64-token goal per KV size through the core service."""
    for model in models:
        _serve_one(model, out, device, params_file, dtype, n_goals)


def _serve_one(model, out, device, params_file, dtype, n_goals):
    from timebill_ros.bench.timebill import rlp_test_prompts
    from timebill_ros.params import load_config
    from timebill_ros.server.factory import build_service
    name = _path(model).name
    config = load_config(params_file)
    config = dataclasses.replace(
        config, offload=dataclasses.replace(config.offload, enabled=False),
        engine=dataclasses.replace(config.engine, model_path=str(_path(model)), device=device,
                                   dtype=dtype, decode_weights=dtype))
    start = time.perf_counter()
    service = build_service(config)
    service.start()
    rows = [{'part': 'serve start', 'model': name, 'dtype': dtype,
             'seconds': time.perf_counter() - start}]
    try:
        goals = [(f'held-out {i}', prompt, BUDGETS_S[i % len(BUDGETS_S)], GOAL_TOKENS)
                 for i, (_, prompt) in enumerate(rlp_test_prompts(n_goals))]
        for n_kv in KV_SIZES:
            goals.append((f'decode at ~{n_kv} KV', _log_prompt(service.engine, n_kv), 60.0,
                          64))
        goals.append(('prefill of ~4k', _log_prompt(service.engine, 4000), 60.0, 8))
        for label, prompt, budget_s, n_max in goals:
            rows.append(_goal(service, name, label, prompt, budget_s, n_max))
    finally:
        service.shutdown()
    _append(out, rows)


def _log_prompt(engine, n_tokens: int) -> str:
    """Return a robot-log prompt of about ``n_tokens`` tokens asking for a long answer."""
    lines, text = [], ''
    while len(engine.encode(text)) < n_tokens:
        lines.append(f'{len(lines) * 0.5:.1f} s: joint {len(lines) % 7} at '
                     f'{(len(lines) * 37) % 180} deg, battery {90 - len(lines) % 30} %')
        text = '\n'.join(lines) + '\nList every line of the log above, numbered.'
    return text


def _goal(service, name, label, prompt, budget_s, n_max):
    from timebill_ros.server.goals import GoalRejected, GoalRequest
    from timebill_ros.server.status import POLICY_KILL
    done, box = threading.Event(), []
    request = GoalRequest(prompt=prompt, budget_s=budget_s, max_new_tokens=n_max,
                          overrun_policy=POLICY_KILL, goal_id=label)
    row = {'part': 'goal', 'model': name, 'label': label, 'budget_s': budget_s}
    try:
        service.submit(request, lambda feedback: None,
                       lambda result: (box.append(result), done.set()))
    except GoalRejected as exc:
        row.update(status='REJECTED', message=str(exc))
        return row
    if not done.wait(120.0):
        row['status'] = 'no result'
        return row
    result = box[0]
    row.update(status=result.status_name, tokens=result.response_tokens,
               prompt_tokens=result.prompt_tokens, wcet_s=result.predicted_wcet_s,
               execution_s=result.execution_time_s, prefill_s=result.prefill_time_s,
               decode_s=result.decode_time_s, kill_latency_s=result.kill_latency_s,
               alpha=result.eviction_ratio, finish=result.finish_reason,
               message=result.message[:120])
    if result.response_tokens > 1 and result.finish_reason in ('eos', 'length'):
        row['decode_ms_per_token'] = 1e3 * result.decode_time_s / (result.response_tokens - 1)
    return row


# --- report --------------------------------------------------------------------------------
def report(out: pathlib.Path) -> str:
    """Write ``out/gpu_gguf.md`` from ``out/gpu_gguf.jsonl``; return its text."""
    rows = [json.loads(line) for line in (out / 'gpu_gguf.jsonl').read_text().splitlines()]
    lines = ['# The robot\'s own GGUF files on the GPU', '',
             '`timebill study gpu_gguf report --out DIR` of the rows in '
             '`gpu_gguf.jsonl` beside this file.', '']
    envs = {}  # one line per machine set-up, with the start of each part run on it
    for row in (r for r in rows if r['part'] == 'env'):
        key = (f"{row['gpu']}, torch {row['torch']} (CUDA {row['cuda']}), Python "
               f"{row['python']}, host {row['host']}")
        envs.setdefault(key, []).append(row['date'])
    for key, dates in envs.items():
        lines += [f"{key}; parts started {', '.join(dates)}.", '']
    lines += ['| model | dtype | load s | weights MB | device MB | agreement @32 |',
              '|---|---|---|---|---|---|']
    agreement = {(r['model'], r['dtype']): r for r in rows if r['part'] == 'agreement'}
    for row in (r for r in rows if r['part'] == 'load'):
        agree = agreement.get((row['model'], row['dtype']), {})
        text = (f"{agree['identical']}/{agree['prompts']}" if 'prompts' in agree
                else agree.get('error', '-'))
        lines.append(f"| {row['model']} | {row['dtype']} | {row['load_s']:.1f} | "
                     f"{row['weights_mb']:.0f} | {row.get('device_mb', 0):.0f} | {text} |")
    lines += ['', '| model | dtype | KV | ms/token (graphs) | bare step ms | '
              'ms/token (no graphs) |', '|---|---|---|---|---|---|']
    for row in (r for r in rows if r['part'] == 'decode'):
        lines.append(f"| {row['model']} | {row['dtype']} | {row['n_kv']} | "
                     f"{row['ms_per_token']:.2f} | {row['step_ms']:.2f} | "
                     f"{row.get('eager_ms_per_token', float('nan')):.2f} |")
    lines += ['', '| model | dtype | prompt tokens | prefill s (one pass, median of 3) |',
              '|---|---|---|---|']
    for row in (r for r in rows if r['part'] == 'prefill'):
        lines.append(f"| {row['model']} | {row['dtype']} | {row['n_x']} | "
                     f"{row['seconds']:.4f} |")
    lines += _serve_lines(rows)
    text = '\n'.join(lines) + '\n'
    (out / 'gpu_gguf.md').write_text(text)
    return text


def _serve_lines(rows):
    goals = [r for r in rows if r['part'] == 'goal']
    if not goals:
        return []
    lines = ['', 'Through the service (config/jetson_orin.yaml, Kill):', '',
             '| model | goals | completed | t^_WCET covers | killed | Kill late ms (max) | '
             'rejected | decode ms/token (median) |', '|---|---|---|---|---|---|---|---|']
    for name in dict.fromkeys(r['model'] for r in goals):
        mine = [r for r in goals if r['model'] == name]
        done = [r for r in mine if r.get('status') == 'COMPLETED']
        covered = sum(r['execution_s'] <= r['wcet_s'] for r in done)
        killed = [r for r in mine if r.get('status') == 'KILLED']
        late = max((r['kill_latency_s'] for r in killed if r.get('kill_latency_s') is not None),
                   default=0.0)
        speeds = [r['decode_ms_per_token'] for r in done if 'decode_ms_per_token' in r]
        lines.append(f"| {name} | {len(mine)} | {len(done)} | {covered}/{len(done)} | "
                     f"{len(killed)} | {1e3 * late:.1f} | "
                     f"{sum(r.get('status') == 'REJECTED' for r in mine)} | "
                     f"{statistics.median(speeds) if speeds else float('nan'):.2f} |")
    lines += ['', '| model | goal | prompt tokens | prefill s | decode ms/token |',
              '|---|---|---|---|---|']
    for row in (r for r in goals if r['label'].startswith(('decode at', 'prefill of'))):
        lines.append(f"| {row['model']} | {row['label']} | {row.get('prompt_tokens', '-')} | "
                     f"{row.get('prefill_s', float('nan')):.3f} | "
                     f"{row.get('decode_ms_per_token', float('nan')):.2f} |")
    return lines


def main(argv=None) -> int:
    """Run one part (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('part', choices=('reference', 'bare', 'serve', 'report'))
    parser.add_argument('--models', nargs='*', default=['embedded'])
    parser.add_argument('--out', type=pathlib.Path, required=True)
    parser.add_argument('--reference', type=pathlib.Path,
                        default=pathlib.Path('benchmarks/results/gpu/reference'))
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--dtypes', nargs='*', default=['float16', 'float32'])
    parser.add_argument('--params', default='config/jetson_orin.yaml')
    parser.add_argument('--goals', type=int, default=N_GOALS)
    parser.add_argument('--quick', action='store_true', help='bare: a few prompts and sizes')
    args = parser.parse_args(argv)
    if args.device == 'cuda' and args.part in ('bare', 'serve') and not torch.cuda.is_available():
        sys.exit('gpu_gguf: torch sees no CUDA device')
    if args.part == 'reference':
        run_reference(args.models, args.out)
    elif args.part == 'bare':
        run_bare(args.models, args.reference, args.out, args.device, args.dtypes, args.quick)
    elif args.part == 'serve':
        run_serve(args.models, args.out, args.device, args.params, args.dtypes[0], args.goals)
    else:
        print(report(args.out))
    return 0


if __name__ == '__main__':
    sys.exit(main())
