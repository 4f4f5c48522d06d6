"""A long prompt with no reuse, through the node, against one unchunked prefill of the engine.

    timebill study long_prefill run --label before|after [--out DIR] [--model FILE]
    timebill study long_prefill report [--out DIR]
    timebill study long_prefill units [--model FILE]   # the longest stretch between checks

``run`` (one process, one machine state):
1. **The engine here**, loaded as the node loads it: each prompt (a robot log of ~3.6k tokens,
   a different one each, so nothing is reused) prefilled in one pass (unchunked), REPEATS
   times, median: the reference. One decoder layer of it: that / layers. Then cancel latency
   in the engine: a cancel set by a timer at 30 / 60 / 90 % of a prefill in 128-token chunks
   (about the node's chunks here), from the set to the raise.
2. **``timebill serve``** (prefix store off), from a planner-like ROS client:
   - each prompt once, ``max_new_tokens`` 1, a generous budget: the node's prefill time
     (``prefill_time``) against the unchunked one;
   - each prompt again, cancelled by the client at half its node prefill time: the latency
     from the cancel request to the terminal result (a ROS round trip included).
Rows are appended to DIR/long_prefill.json under the label; ``report`` writes
long_prefill.md with the labels side by side. ``units`` times the stretches between two stop
checks of the first prompt's prefill in 128-token chunks (one decoder layer of one chunk
each): the longest is the most a cancel or a deadline can wait for.
"""

import argparse
import json
import pathlib
import platform
import statistics
import sys
import threading
import time

LINES = (208, 209, 210)   # robot-log lines: ~3.6k tokens of the embedded tokenizer each
REPEATS = 3
CANCEL_AT = (0.3, 0.6, 0.9)
ENGINE_CHUNK = 128


def _engine_part(model_path):
    import torch
    from timebill_ros import prompts
    from timebill_ros.config import EngineConfig, EvictionConfig
    from timebill_ros.engine import GenerationStopped, LlmEngine, fixed_chunks
    from timebill_ros.engine.stopping import CancelStop, StopCriteria
    engine = LlmEngine.load(EngineConfig(model_path=model_path), EvictionConfig())
    texts = [prompts.long_prompt(n, seed=n) for n in LINES]
    rows = []
    with torch.inference_mode():
        engine.prefill(engine.encode(texts[0])[:256], StopCriteria())  # warm-up
        for text in texts:
            ids = engine.encode(text)
            seconds = statistics.median(
                engine.prefill(ids, StopCriteria(), chunk_plan=fixed_chunks(len(ids))).prefill_s
                for _ in range(REPEATS))
            rows.append({'what': 'unchunked', 'n_x': len(ids), 'prefill_s': seconds,
                         'layer_s': seconds / engine.n_layers})
            print(rows[-1], flush=True)
        ids = engine.encode(texts[0])
        chunked_s = engine.prefill(ids, StopCriteria(),
                                   chunk_plan=fixed_chunks(ENGINE_CHUNK)).prefill_s
        rows.append({'what': f'{ENGINE_CHUNK}-token chunks', 'n_x': len(ids),
                     'prefill_s': chunked_s})
        for fraction in CANCEL_AT:
            event, marks = threading.Event(), {}
            timer = threading.Timer(fraction * chunked_s,
                                    lambda: (marks.setdefault('set', time.perf_counter()),
                                             event.set()))
            timer.start()
            try:
                engine.prefill(ids, StopCriteria(), chunk_plan=fixed_chunks(ENGINE_CHUNK),
                               interrupt=StopCriteria([CancelStop(event)]))
            except GenerationStopped:
                pass
            raised = time.perf_counter()
            timer.cancel()
            rows.append({'what': 'engine cancel', 'at': fraction,
                         'latency_s': raised - marks['set'] if 'set' in marks else None})
            print(rows[-1], flush=True)
    return texts, rows


def units(args):
    """Print the stretches between stop checks of a 128-token-chunk prefill: p50, max, ms."""
    import torch
    from timebill_ros import prompts
    from timebill_ros.config import EngineConfig, EvictionConfig
    from timebill_ros.engine import LlmEngine, fixed_chunks
    from timebill_ros.engine.stopping import StopCriteria, StopCriterion

    class Stamp(StopCriterion):
        def __init__(self):
            self.times = []

        def should_stop(self, n_generated, last_token_id, n_prefilled=None):
            self.times.append(time.perf_counter())

    engine = LlmEngine.load(EngineConfig(model_path=args.model), EvictionConfig())
    by_layer = type(engine.forward)
    # The chunk-by-chunk order of before, on the same engine: the engine takes it for a
    # forward without run_by_layer (hasattr is False when the attribute raises).
    by_chunk = type('ByChunk', (by_layer,), {'run_by_layer': property(
        lambda self: (_ for _ in ()).throw(AttributeError('run_by_layer')))})
    ids = engine.encode(prompts.long_prompt(LINES[0], seed=LINES[0]))
    with torch.inference_mode():
        engine.prefill(ids[:256], StopCriteria())  # warm-up
        for order in (by_chunk, by_layer, by_chunk, by_layer):
            engine.forward.__class__ = order
            stamp = Stamp()
            start = time.perf_counter()
            engine.prefill(ids, StopCriteria(), chunk_plan=fixed_chunks(ENGINE_CHUNK),
                           interrupt=StopCriteria([stamp]))
            total = time.perf_counter() - start
            gaps = [b - a for a, b in zip(stamp.times, stamp.times[1:])]
            print(f'{"by chunk" if order is by_chunk else "by layer"}: N_x {len(ids)}, '
                  f'{total:.2f} s, {len(gaps) + 1} checks; between two checks p50 '
                  f'{statistics.median(gaps) * 1e3:.1f} ms, max {max(gaps) * 1e3:.1f} ms',
                  flush=True)


def _node_part(texts, model_path, folder):
    from timebill_ros import params
    from timebill_ros.bench.server_process import served
    from timebill_ros.config import (EngineConfig, PrefixCacheConfig, ServerConfig,
                                     TimingConfig)
    from timebill_ros.ros.client import TimebillClient
    from timebill_ros.ros.conversions import duration_to_s
    config = ServerConfig(engine=EngineConfig(model_path=model_path),
                          prefix_cache=PrefixCacheConfig(enabled=False),
                          timing=TimingConfig(state_file=str(folder / 'long_prefill.online.yaml')))
    (folder / 'long_prefill.online.yaml').unlink(missing_ok=True)  # a fresh online state
    params_file = folder / 'long_prefill_params.yaml'
    params_file.write_text(params.to_yaml(config))
    rows = []
    with served(str(params_file), folder / 'long_prefill_node.log') as ros_client:
        client = TimebillClient.attached(ros_client)
        for i, text in enumerate(texts):
            result = client.ask(text, 600.0, max_new_tokens=1, timeout_s=900.0)
            prefill_s = duration_to_s(result.prefill_time)
            rows.append({'what': 'node prefill', 'n_x': result.prompt_tokens,
                         'prefill_s': prefill_s, 'status': result.status})
            print(rows[-1], flush=True)
        for row, text in zip(list(rows), texts):
            pending = client.send(text, 600.0, max_new_tokens=1)
            time.sleep(0.5 * row['prefill_s'])
            asked = time.perf_counter()
            pending.cancel()
            result = pending.result(timeout_s=900.0)
            rows.append({'what': 'node cancel', 'n_x': row['n_x'],
                         'latency_s': time.perf_counter() - asked, 'status': result.status,
                         'stop_phase': getattr(result, 'message', '')})
            print(rows[-1], flush=True)
    return rows


def run(args):
    """Measure both parts and append them to the run file under ``args.label``."""
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    texts, rows = _engine_part(args.model)
    rows += _node_part(texts, args.model, pathlib.Path('log'))
    path = out / 'long_prefill.json'
    runs = json.loads(path.read_text()) if path.exists() else {}
    runs[args.label] = {'host': f'{platform.node()} ({platform.machine()})',
                        'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
                        'model': args.model or 'embedded', 'rows': rows}
    path.write_text(json.dumps(runs, indent=1))
    report(args)


def _median(rows, what, key):
    values = [r[key] for r in rows if r['what'] == what and r.get(key) is not None]
    return statistics.median(values) if values else None


def report(args):
    """Write long_prefill.md: each label's figures side by side."""
    out = pathlib.Path(args.out)
    runs = json.loads((out / 'long_prefill.json').read_text())
    lines = ['# A long prompt through the node, no reuse', '',
             'Command: `timebill study long_prefill run --label LABEL`; '
             + '; '.join(f"{label}: {r['host']}, {r['date']}, {r['model']} model"
                         for label, r in runs.items()) + '.', '',
             '| figure | ' + ' | '.join(runs) + ' |', '|---' * (len(runs) + 1) + '|']

    def row(name, cells):
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')

    figures = {label: _figures(r['rows']) for label, r in runs.items()}
    for key, name, fmt in (
            ('n_x', 'prompt tokens (median)', '{:.0f}'),
            ('unchunked_s', 'engine, one unchunked prefill (s, median)', '{:.2f}'),
            ('node_s', 'node prefill (s, median)', '{:.2f}'),
            ('ratio', 'node / unchunked (median of the prompts)', '{:.2f}x'),
            ('ratio_max', 'node / unchunked (worst prompt)', '{:.2f}x'),
            ('layer_ms', 'one layer of the unchunked pass (ms)', '{:.0f}'),
            ('engine_cancel_ms', f'engine cancel, {ENGINE_CHUNK}-token chunks (ms, max)',
             '{:.1f}'),
            ('chunk_layer_ms', f'one layer of a {ENGINE_CHUNK}-token chunk (ms)', '{:.1f}'),
            ('node_cancel_ms', 'node cancel, client to result (ms, max)', '{:.0f}')):
        row(name, [('-' if f.get(key) is None else fmt.format(f[key]))
                   for f in figures.values()])
    (out / 'long_prefill.md').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))


def _figures(rows):
    unchunked = [r for r in rows if r['what'] == 'unchunked']
    node = [r for r in rows if r['what'] == 'node prefill']
    ratios = [n['prefill_s'] / u['prefill_s'] for n, u in zip(node, unchunked)]
    chunked = next((r for r in rows if r['what'].endswith('chunks')), None)
    cancels = [r['latency_s'] for r in rows if r['what'] == 'engine cancel' and r['latency_s']]
    node_cancels = [r['latency_s'] for r in rows if r['what'] == 'node cancel']
    n_layers = unchunked[0]['prefill_s'] / unchunked[0]['layer_s'] if unchunked else None
    return {'n_x': _median(rows, 'unchunked', 'n_x'),
            'unchunked_s': _median(rows, 'unchunked', 'prefill_s'),
            'node_s': _median(rows, 'node prefill', 'prefill_s'),
            'ratio': statistics.median(ratios) if ratios else None,
            'ratio_max': max(ratios) if ratios else None,
            'layer_ms': _median(rows, 'unchunked', 'layer_s') * 1e3 if unchunked else None,
            'engine_cancel_ms': max(cancels) * 1e3 if cancels else None,
            'chunk_layer_ms': (chunked['prefill_s'] * ENGINE_CHUNK / chunked['n_x'] / n_layers
                               * 1e3 if chunked and n_layers else None),
            'node_cancel_ms': max(node_cancels) * 1e3 if node_cancels else None}


def main(argv=None):
    """Run or report (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('part', choices=('run', 'report', 'units'))
    parser.add_argument('--label', default='after')
    parser.add_argument('--out', default='benchmarks/results/long_prefill')
    parser.add_argument('--model', default='', metavar='FILE.gguf',
                        help='a GGUF file (default: the embedded model)')
    args = parser.parse_args(argv)
    if args.part == 'run':
        run(args)
    elif args.part == 'units':
        units(args)
    else:
        report(args)
    return 0


if __name__ == '__main__':
    sys.exit(main())
