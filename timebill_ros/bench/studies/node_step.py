"""Per-token cost through the node against the engine's bare step (issue 29's 1.15x bar).

    timebill study node_step [--prompts 12] [--n-max 96] [--decode-weights gguf]
                                   [--policy kill] [--model FILE.gguf] [--out FILE.md]

One run, rounds interleaved so the machine's drift hits every column alike. For each held-out
prompt (the corpus test split, one per category first: bench.timebill.rlp_test_prompts) the
goal goes through a real ``timebill serve`` (its own process, a 600 s budget so nothing is
evicted, the chosen overrun policy), then the same number of decoding steps runs in this
process at the goal's KV length, twice:

- ``bare``: ``forward.run`` one-token steps only (what enginebench times);
- ``engine``: ``LlmEngine.decode`` with the criteria the server uses (EOS, N_max, cancel and
  deadline checked before every decoder layer, a step timer) and a feedback callback;
- ``node``: the goal's ``decode_time`` over its steps, from the result.

Prints ms/token per goal and the ratios of the medians node/bare and engine/bare.
"""

import argparse
import datetime
import platform
import statistics
import sys
import threading
import time

STEP_POLICIES = {'kill': 1, 'skip_next': 2, 'partial': 3}


def _steps(result, n_max):
    """Return the decoding steps a goal ran: token 1 comes from the prefill.

    An answer shorter than N_max ended on EOS (the step that produced it is not a token of
    the answer); one of N_max tokens stopped before a step.
    """
    n = int(result.response_tokens)
    return n if n < n_max else n - 1


def _bare_ms(engine, ids, steps):
    """Return ms per one-token step of the forward alone after a prefill of ``ids``."""
    import torch
    from timebill_ros.engine.stopping import StopCriteria
    state = engine.prefill(ids, StopCriteria())
    token = state.first_token
    with torch.inference_mode():
        start = time.perf_counter()
        for offset in range(steps):
            logits = engine.forward.run([token], state.n_x + offset, state.cache, True)
            token = int(logits.argmax())
    return (time.perf_counter() - start) / steps * 1e3


def _engine_ms(engine, ids, steps, feedback_every):
    """Return ms per step of LlmEngine.decode with the server's kinds of criteria."""
    from timebill_ros.engine import stopping
    cancel = threading.Event()
    interrupt = stopping.StopCriteria([stopping.CancelStop(cancel),
                                       stopping.DeadlineStop(time.monotonic() + 600.0)])
    state = engine.prefill(ids, stopping.StopCriteria())
    timer = stopping.StepTimer(time.monotonic)
    criteria = stopping.StopCriteria(
        [timer, stopping.MaxTokensStop(steps + 1)] + list(interrupt.criteria))
    out = engine.decode(state, steps + 1, criteria, lambda n, text: None, feedback_every,
                        interrupt=interrupt)
    return out.decode_s / max(1, len(out.token_ids) - 1) * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--prompts', type=int, default=12)
    parser.add_argument('--n-max', type=int, default=96)
    parser.add_argument('--decode-weights', default='gguf')
    parser.add_argument('--policy', choices=sorted(STEP_POLICIES), default='kill')
    parser.add_argument('--model', default='', help='a GGUF file (engine.model_path)')
    parser.add_argument('--no-loop-guard', action='store_true',
                        help="the server's loop guard off: an answer it cuts where its loop "
                        'began reports fewer tokens than the steps it ran (a base model loops)')
    parser.add_argument('--out', default='')
    args = parser.parse_args(argv)

    import pathlib
    import tempfile

    from timebill_ros import params
    from timebill_ros.bench.server_process import served
    from timebill_ros.bench.timebill import rlp_test_prompts
    from timebill_ros.config import EngineConfig, EvictionConfig, ServerConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.ros.client import make_goal

    config = params.config_from_flat({'engine.decode_weights': args.decode_weights,
                                      'engine.max_new_tokens': args.n_max,
                                      'engine.model_path': args.model,
                                      'engine.loop_guard': not args.no_loop_guard})
    folder = pathlib.Path(tempfile.mkdtemp(prefix='node_step_'))
    params_file = folder / 'params.yaml'
    params_file.write_text(params.to_yaml(config))
    engine = LlmEngine.load(EngineConfig(decode_weights=args.decode_weights,
                                         model_path=args.model), EvictionConfig())
    feedback_every = ServerConfig().engine.feedback_every_tokens
    rows = []
    with served(str(params_file), folder / 'server.log') as client:
        for name, prompt in rlp_test_prompts(args.prompts):
            goal = make_goal(prompt, budget_s=600.0, max_new_tokens=args.n_max,
                             policy=STEP_POLICIES[args.policy])
            cpu_start, wall_start = time.process_time(), time.perf_counter()
            result, _ = client.run(goal)
            client_cpu = (time.process_time() - cpu_start) / (time.perf_counter() - wall_start)
            steps = _steps(result, args.n_max)
            decode_s = result.decode_time.sec + result.decode_time.nanosec * 1e-9
            if result.status != 1 or steps < 4 or result.eviction_ratio > 0:
                print(f'{name}: skipped (status {result.status}, {steps} steps, '
                      f'alpha {result.eviction_ratio:.2f})', flush=True)
                continue
            ids = engine.encode(prompt)
            if len(ids) != result.prompt_tokens:
                raise RuntimeError(f'{name}: {len(ids)} prompt tokens here, '
                                   f'{result.prompt_tokens} in the server')
            row = {'prompt': name, 'n_x': len(ids), 'steps': steps,
                   'node': decode_s / steps * 1e3,
                   'bare': _bare_ms(engine, ids, steps),
                   'engine': _engine_ms(engine, ids, steps, feedback_every),
                   'client_cpu': client_cpu}
            rows.append(row)
            print(f"{name:10s} N_x={row['n_x']:4d} steps={steps:3d}  bare {row['bare']:6.2f}  "
                  f"engine {row['engine']:6.2f}  node {row['node']:6.2f} ms/token  "
                  f"(client used {client_cpu:.2f} cores meanwhile)", flush=True)
    report = _report(rows, args, engine.engine_config.decode_weights)
    print(report)
    if args.out:
        pathlib.Path(args.out).write_text(report)
    return 0


def _report(rows, args, decode_weights):
    import pathlib
    med = {col: statistics.median(r[col] for r in rows) for col in ('bare', 'engine', 'node')}
    lines = [
        '# Per-token cost through the node vs the bare step',
        '',
        f'`timebill study node_step --prompts {args.prompts} --n-max {args.n_max} '
        f'--decode-weights {args.decode_weights} --policy {args.policy}'
        + (f' --model {pathlib.Path(args.model).name}' if args.model else '')
        + (' --no-loop-guard' if args.no_loop_guard else '') + '` - '
        f'{platform.node()} ({platform.processor() or platform.machine()}), '
        f'{datetime.date.today().isoformat()}, step format {decode_weights}.',
        '',
        '| prompt | N_x | steps | bare ms/token | engine.decode ms/token | node ms/token |',
        '|---|---|---|---|---|---|']
    for r in rows:
        lines.append(f"| {r['prompt']} | {r['n_x']} | {r['steps']} | {r['bare']:.2f} | "
                     f"{r['engine']:.2f} | {r['node']:.2f} |")
    ratio = statistics.median(r['node'] / r['bare'] for r in rows)
    lines += ['', f"Medians over {len(rows)} goals: bare {med['bare']:.2f}, engine "
              f"{med['engine']:.2f}, node {med['node']:.2f} ms/token; node / bare "
              f"{med['node'] / med['bare']:.3f} (median of the goals' own ratios "
              f"{ratio:.3f}), engine / bare {med['engine'] / med['bare']:.3f}."]
    return '\n'.join(lines) + '\n'


if __name__ == '__main__':
    sys.exit(main())
