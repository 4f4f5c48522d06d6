"""``timebill enginebench``: decoding and prefill speed of each engine format, side by side.

Every engine format shares one loaded model (the lean forward reads its weights; 16-bit decode
weights are copies) and the measurements alternate between formats round by round, so a drift
of the machine's speed hits all formats alike. Rows:
- ``transformers fp32``: transformers' modules on a DynamicCache (the engine before the lean
  forward; kept for non-Llama models), the reference;
- ``lean <decode weights>``: the lean forward on the preallocated KV cache, the prefill in the
  model's dtype, one-token steps in the named format.
Decode: seconds per token of the engine's own decode loop (stop checks, text streaming and a
feedback callback included) after a prefill of N_KV random tokens; each round continues the
same cache (it grows by the round's steps, a few percent of N_KV at most).
Greedy agreement: held-out prompts (RLP test split) answered greedily by each format; tokens
identical until the first difference, and ROUGE-L F1 against the transformers fp32 answer.
Floor: weight bytes a one-token step reads / measured copy bandwidth.
``llama.cpp Q4_1``: the same model file on llama.cpp (enginebench_llama_cpp.py), when
llama-cpp-python is installed (``make bench-deps``); its decode is the bare model step.

``--model FILE.gguf``: any GGUF file the engine serves (engine/models). Rows: ``timebill
gguf`` (the engine on the file's blocks, its prefill in ``engine.prefill_dtype: auto``'s
choice), ``timebill gguf, fp32 prefill`` (prefill and agreement only, when auto chose bf16),
``llama.cpp <file>`` (same file, same threads) and,
for the greedy agreement only, ``transformers fp32`` (transformers' model dequantized from
the same file, fed the engine's token ids: the fp32 reference; transformers' own GGUF
tokenizer is not used, it is wrong for Gemma 3).
"""

import dataclasses
import json
import pathlib
import statistics
import time

import torch

from timebill_ros.bench.prefill_parts import prefill_parts_s
from timebill_ros.config import EngineConfig, EvictionConfig
from timebill_ros.engine.forward import synchronize
from timebill_ros.engine.stopping import StopCriteria
from timebill_ros.timing.probes import EngineProbes

FORMATS = (('transformers fp32', 'transformers', 'float32'), ('lean fp32', 'lean', 'float32'),
           ('lean fp16', 'lean', 'float16'), ('lean int8', 'lean', 'int8'),
           ('lean gguf', 'lean', 'gguf'))
# ``--device cuda``: the GGUF kernels run on the CPU only (EngineConfig refuses them there).
GPU_FORMATS = tuple(f for f in FORMATS if f[2] != 'gguf')
DECODE_KV = (100, 1000, 3000)
BATCH_SIZES = (1, 2, 4, 8)
BATCH_KV = 100  # prompt tokens of every row of a batch
PREFILL_TOKENS = (128, 512, 2048, 4096)
AGREEMENT_PROMPTS = 6
AGREEMENT_TOKENS = 64
# Rows of ``--model`` that only answer (the fp32 reference: too slow to time usefully).
AGREEMENT_ONLY = ('transformers fp32 (reference)',)
# A row of ``--model`` that only prefills and answers: the engine with the exact fp32 prefill
# beside the default one (engine.prefill_dtype auto), decoding as the default row does.
PREFILL_ONLY = 'timebill gguf, fp32 prefill'


@dataclasses.dataclass
class Row:
    """One engine format's measurements (seconds, tokens)."""

    name: str
    decode_s: dict = dataclasses.field(default_factory=dict)   # n_kv -> [s/token per round]
    prefill_s: dict = dataclasses.field(default_factory=dict)  # n_x -> [s per round]
    agreement: list = dataclasses.field(default_factory=list)  # per prompt (same, rouge_l)
    batch_s: dict = dataclasses.field(default_factory=dict)    # B -> [s/token per round]
    prefill_parts: dict = dataclasses.field(default_factory=dict)  # n_x -> {part: s}, one run


def _file_engines(model_path, threads, memory):
    """Return the engines of ``--model``: ours on the file, transformers' fp32 reference.

    memory: filled with the file's size and this process's resident MiB before and right
    after loading ours (before anything else is loaded).
    """
    from timebill_ros.engine import LlmEngine
    from timebill_ros.server.heap import resident_mb
    from timebill_ros.training.target import transformers_model_of
    memory.update(file_mb=pathlib.Path(model_path).stat().st_size / 2 ** 20,
                  before_load_mb=resident_mb())
    ours = LlmEngine.load(EngineConfig(model_path=str(model_path), threads=threads),
                          EvictionConfig())
    memory['after_load_mb'] = resident_mb()
    engines = {'timebill gguf': ours}
    if ours.engine_config.prefill_dtype != 'float32':
        engines[PREFILL_ONLY] = LlmEngine.load(EngineConfig(
            model_path=str(model_path), threads=threads, prefill_dtype='float32'),
            EvictionConfig())
    model = transformers_model_of(model_path)
    reference = LlmEngine(EngineConfig(threads=threads, forward='transformers'),
                          EvictionConfig(), model=model, tokenizer=ours.tokenizer)
    return {AGREEMENT_ONLY[0]: reference, **engines}


def _engines(formats, threads, device='cpu'):
    from timebill_ros.engine import LlmEngine
    first = LlmEngine.load(EngineConfig(threads=threads, forward='transformers', device=device),
                           EvictionConfig())
    engines = {}
    for name, forward, decode_weights in formats:
        config = EngineConfig(threads=threads, forward=forward, decode_weights=decode_weights,
                              device=device)
        engines[name] = LlmEngine(config, EvictionConfig(), model=first.model,
                                  tokenizer=first.tokenizer)
    return engines


def _measure_decode(engines, rows, n_kv_values, rounds, steps, progress, llama=None):
    engines = _decoding(engines)
    for n_kv in n_kv_values:
        states = {name: engine.prefill(engine.random_ids(n_kv), StopCriteria())
                  for name, engine in engines.items()}
        if llama is not None:
            llama.start_decode(n_kv)
        for _ in range(rounds):
            times = {}
            for name, engine in engines.items():
                out = engine.decode(states[name], steps + 1, StopCriteria(),
                                    on_tokens=lambda n, text: None, feedback_every=4)
                times[name] = out.decode_s / (len(out.token_ids) - 1)
            if llama is not None:
                times[llama.name] = llama.decode_s(steps)
            for name, per_token in times.items():
                rows[name].decode_s.setdefault(n_kv, []).append(per_token)
                progress(f'decode  {name:18s} N_kv={n_kv:5d}: {per_token * 1e3:6.1f} ms/token')


def _measure_batches(engines, rows, batch_sizes, rounds, steps, progress):
    """Aggregate seconds per token of B goals decoding together (lean forward only)."""
    lean = {name: e for name, e in _decoding(engines).items()
            if e.forward.max_batch >= max(batch_sizes)}
    for size in batch_sizes:
        states = {name: [engine.prefill(engine.random_ids(BATCH_KV + row), StopCriteria())
                         for row in range(size)] for name, engine in lean.items()}
        for _ in range(rounds):
            for name, engine in lean.items():
                batch = engine.new_batch()
                for state in states[name]:
                    batch.join(state, steps + 2, StopCriteria())
                batch.step()  # the first step: not timed
                engine.synchronize()
                start = time.perf_counter()
                for _ in range(steps):
                    batch.step()
                engine.synchronize()  # a GPU's steps: their work, not their launches
                per_token = (time.perf_counter() - start) / (steps * size)
                rows[name].batch_s.setdefault(size, []).append(per_token)
                progress(f'batch   {name:18s} B={size}: {per_token * 1e3:6.1f} ms/token '
                         f'(aggregate)')


def _timed(engines):
    """Return the engines whose speed is measured (not the agreement-only reference)."""
    return {name: engine for name, engine in engines.items() if name not in AGREEMENT_ONLY}


def _decoding(engines):
    """Return the engines whose decoding speed is measured."""
    return {name: engine for name, engine in _timed(engines).items() if name != PREFILL_ONLY}


def _measure_prefill(engines, rows, n_x_values, rounds, progress, llama=None):
    engines = _timed(engines)
    for n_x in n_x_values:
        for _ in range(rounds):
            times = {name: EngineProbes(engine).measure_prefill_s(n_x)
                     for name, engine in engines.items()
                     # other decode weights: the same prefill as the fp32 row of their forward
                     if engine.engine_config.decode_weights in ('float32', 'gguf')
                     and (engine.gguf_file is not None or name != 'lean gguf')}
            if llama is not None:
                times[llama.name] = llama.prefill_s(n_x)
            for name, seconds in times.items():
                rows[name].prefill_s.setdefault(n_x, []).append(seconds)
                progress(f'prefill {name:18s} N_x={n_x:5d}: {seconds:6.2f} s')


def _llama_answer(llama, reference_engine, input_ids, n_tokens):
    """Return llama.cpp's greedy answer as (token_ids, text), cut before the first EOS.

    As the engine's answers: the EOS that ends an answer is not part of it.
    """
    from timebill_ros.training.collect import response_length
    token_ids = llama.greedy(input_ids, n_tokens)
    n_steps, capped = response_length(token_ids, set(reference_engine.eos_token_ids),
                                      len(token_ids))
    if not capped:
        token_ids = token_ids[:n_steps - 1]
    text = reference_engine.tokenizer.decode(token_ids, skip_special_tokens=True)
    return token_ids, text


def _measure_agreement(engines, rows, n_prompts, n_tokens, progress, llama=None):
    from timebill_ros.bench.timebill import _rouge_l_scorer, rlp_test_prompts
    try:
        rouge = _rouge_l_scorer()
    except ImportError as exc:  # a robot install (requirements-robot.txt) has no rouge-score
        progress(f'agreement: no ROUGE-L ({exc}); token agreement only')
        rouge = None
    reference_name = next(iter(engines))
    reference_engine = engines[reference_name]
    for prompt_id, prompt in rlp_test_prompts(n_prompts):
        answers = {}
        for name, engine in engines.items():
            state = engine.prefill(engine.encode(prompt), StopCriteria())
            out = engine.decode(state, n_tokens, StopCriteria())
            answers[name] = (out.token_ids, out.text)
        if llama is not None:
            answers[llama.name] = _llama_answer(llama, reference_engine,
                                                reference_engine.encode(prompt), n_tokens)
        reference_ids, reference_text = answers[reference_name]
        for name, (token_ids, text) in answers.items():
            same = 0
            for a, b in zip(token_ids, reference_ids):
                if a != b:
                    break
                same += 1
            rows[name].agreement.append(
                {'prompt_id': prompt_id, 'identical': token_ids == reference_ids,
                 'same_prefix': same, 'tokens': len(token_ids),
                 'rouge_l': rouge(reference_text, text) if rouge else None})
        progress(f'agreement {prompt_id}: ' + ', '.join(
            f'{n}: {rows[n].agreement[-1]["same_prefix"]}' for n in answers))


def copy_bandwidth_gbs(megabytes=256, repeats=5, device='cpu') -> float:
    """Return the best of ``repeats`` copies of a ``megabytes`` buffer: read + write, GB/s."""
    source = torch.empty(megabytes * 2 ** 20 // 4, dtype=torch.float32,
                         device=device).uniform_()
    target = torch.empty_like(source)
    best = float('inf')
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        target.copy_(source)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * source.numel() * 4 / best / 1e9


def step_weight_bytes(engine) -> int:
    """Bytes of weights one decoding step reads: every linear layer and the LM head."""
    forward = engine.forward
    if not hasattr(forward, 'layers'):
        return 0
    linears = [forward.lm_head]
    for layer in forward.layers:
        linears += [layer.qkv, layer.out, layer.gate_up, layer.down]
    return sum(linear.step_bytes for linear in linears)


def _measure_prefill_parts(engine, row, n_x_values, progress):
    for n_x in n_x_values:
        row.prefill_parts[n_x] = parts = prefill_parts_s(engine, n_x)
        progress(f'prefill parts N_x={n_x:5d}: ' + ', '.join(
            f'{name} {seconds:.2f} s' for name, seconds in parts.items()))


def _median_ms(values):
    return f'{statistics.median(values) * 1e3:.1f}' if values else '-'


def report(rows, meta) -> str:
    """Return the markdown tables of a run."""
    kvs = sorted({n for row in rows.values() for n in row.decode_s})
    xs = sorted({n for row in rows.values() for n in row.prefill_s})
    reference = next(iter(rows.values()))  # of the greedy agreement
    timed = {name: row for name, row in rows.items() if row.decode_s or row.prefill_s}
    speed_reference = next(row for row in timed.values() if row.decode_s)
    where = (f'{meta["threads"]} threads' if meta.get('device', 'cpu') == 'cpu'
             else f'{meta["device"]}, {meta["threads"]} CPU threads')
    lines = [f'# Engine speed ({meta["model"]}, {where})', '',
             f'Command: `{meta["command"]}`; {meta["rounds"]} interleaved rounds, medians; '
             f'copy bandwidth {meta["bandwidth_gbs"]:.1f} GB/s. Raw rows: enginebench.json; '
             'this table, in its folder: `timebill enginebench --from-json enginebench.json '
             '--out .`.', '',
             '| engine | ' + ' | '.join(f'decode ms/token @{n} KV' for n in kvs)
             + ' | speed-up @' + str(kvs[0]) + ' | floor ms/token | '
             + ' | '.join(f'prefill {n} tok (s)' for n in xs) + ' |',
             '|' + '---|' * (len(kvs) + len(xs) + 3)]
    for name, row in timed.items():
        speedup, floor = '-', '-'
        if row.decode_s:
            ratio = (statistics.median(speed_reference.decode_s[kvs[0]])
                     / statistics.median(row.decode_s[kvs[0]]))
            speedup = f'{ratio:.2f}x'
            floor = f'{meta["floor_ms"][name]:.1f}'
        prefill = [f'{statistics.median(row.prefill_s[n]):.2f}' if n in row.prefill_s
                   else '(= fp32)' for n in xs]
        lines.append(f'| {name} | ' + ' | '.join(_median_ms(row.decode_s.get(n)) for n in kvs)
                     + f' | {speedup} | {floor} | ' + ' | '.join(prefill) + ' |')
    sizes = sorted({b for row in rows.values() for b in row.batch_s})
    base = statistics.median(speed_reference.decode_s[kvs[0]])
    lines += ['', f'Batched decoding, {BATCH_KV} prompt tokens a goal: aggregate ms per token '
              f'(throughput vs {speed_reference.name} at B=1, {kvs[0]} KV):', '',
              '| engine | ' + ' | '.join(f'B={b}' for b in sizes) + ' |',
              '|' + '---|' * (len(sizes) + 1)]
    for name, row in rows.items():
        if row.batch_s:
            lines.append(f'| {name} | ' + ' | '.join(
                f'{statistics.median(row.batch_s[b]) * 1e3:.1f} '
                f'({base / statistics.median(row.batch_s[b]):.1f}x)' for b in sizes) + ' |')
    lines += ['', f'Greedy agreement with {reference.name}, {meta["agreement_tokens"]} tokens, '
              'held-out prompts (RLP test split):', '',
              '| engine | answers identical | tokens equal until the first difference (each) '
              '| mean ROUGE-L |', '|---|---|---|---|']
    for name, row in rows.items():
        if not row.agreement:
            continue
        same = ', '.join(str(a['same_prefix']) for a in row.agreement)
        identical = sum(a['identical'] for a in row.agreement)
        scores = [a['rouge_l'] for a in row.agreement if a['rouge_l'] is not None]
        mean_rouge = f'{statistics.mean(scores):.3f}' if scores else '- (no rouge-score)'
        lines.append(f'| {name} | {identical}/{len(row.agreement)} | {same} | {mean_rouge} |')
    lines += _parts_lines(rows)
    lines += ['', 'llama.cpp row: ' + meta['llama_cpp']]
    if meta.get('auto'):
        lines += ['', '`engine.decode_weights: auto` on this machine: ' + meta['auto']]
    if meta.get('prefill_dtype'):
        lines += ['', '`engine.prefill_dtype: auto` on this machine: ' + meta['prefill_dtype']]
    memory = meta.get('memory')
    if memory:
        lines += ['', f"Resident memory after loading the file: {memory['after_load_mb']:.0f} "
                  f"MiB (process before the load: {memory['before_load_mb']:.0f} MiB; the file: "
                  f"{memory['file_mb']:.0f} MiB), before the reference and llama.cpp load."]
    return '\n'.join(lines) + '\n'


def _parts_lines(rows) -> list:
    """Return the report's lines on where the prefill's time went (rows with parts)."""
    lines = []
    for name, row in rows.items():
        if not row.prefill_parts:
            continue
        lines += ['', f'Prefill of {name} by part, one more run of each length (bench/'
                  'prefill_parts.py): the weight matrices (the GEMM on the blocks, their '
                  'dequantization fused into it), the attention, the rest (norms, RoPE, cache, '
                  'activations, Python):', '',
                  '| N tokens | total (s) | matrices | attention | rest |',
                  '|---|---|---|---|---|']
        for n, parts in sorted(row.prefill_parts.items()):
            total = parts['total']
            lines.append(f'| {n} | {total:.2f} | ' + ' | '.join(
                f'{parts[part]:.2f} s ({100 * parts[part] / total:.0f} %)'
                for part in ('matrices', 'attention', 'rest')) + ' |')
    return lines


def plot(rows, path) -> None:
    """Write decode ms/token vs KV length and batched aggregate ms/token vs B to ``path``."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for index, (name, row) in enumerate(rows.items()):
        color = f'C{index}'  # one colour per engine in both panels
        kvs = sorted(row.decode_s)
        left.plot(kvs, [statistics.median(row.decode_s[n]) * 1e3 for n in kvs], marker='o',
                  label=name, color=color)
        if row.batch_s:
            sizes = sorted(row.batch_s)
            right.plot(sizes, [statistics.median(row.batch_s[b]) * 1e3 for b in sizes],
                       marker='o', label=name, color=color)
    left.set(title='decode, one goal', xlabel='KV tokens', ylabel='ms per token')
    right.set(title='batched decode (aggregate)', xlabel='goals per step B',
              ylabel='ms per token')
    for axis in (left, right):
        axis.set_ylim(bottom=0)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _rows_from_json(data) -> dict:
    """Return the rows of a saved enginebench.json (JSON keys back to ints)."""
    rows = {}
    for raw in data['rows']:
        row = Row(raw['name'], agreement=raw['agreement'])
        for field in ('decode_s', 'prefill_s', 'batch_s', 'prefill_parts'):
            setattr(row, field, {int(k): v for k, v in raw.get(field, {}).items()})
        rows[row.name] = row
    return rows


def _write(out, rows, meta, progress):
    out.mkdir(parents=True, exist_ok=True)
    text = report(rows, meta)
    (out / 'enginebench.md').write_text(text)
    plot(rows, out / 'enginebench.png')
    (out / 'enginebench.json').write_text(json.dumps(
        {'meta': meta, 'rows': [dataclasses.asdict(r) for r in rows.values()]}, indent=1))
    progress(text)


def _auto_choice(threads, device='cpu') -> str:
    """Return what ``decode_weights: auto`` chooses on this machine, with its step times.

    An engine of its own, loaded as the server loads it: ``gguf`` competes only on the
    embedded model loaded by the engine itself.
    """
    from timebill_ros.engine import LlmEngine
    auto = LlmEngine.load(EngineConfig(threads=threads, decode_weights='auto', device=device),
                          EvictionConfig())
    probe = ', '.join(f'{name} {seconds * 1e3:.1f} ms/step'
                      for name, seconds in auto.step_format_probe.items())
    return f'{auto.engine_config.decode_weights} ({probe})'


def _prefill_choice(engine) -> str:
    """Return what ``prefill_dtype: auto`` chose for ``engine``, and why."""
    from timebill_ros.engine.models.weights import auto_prefill_dtype
    return f'{engine.engine_config.prefill_dtype} ({auto_prefill_dtype()[1]})'


def agreement_tokens_needed(engine, n_prompts: int, n_tokens: int) -> int:
    """Return the context (tokens) the greedy agreement needs: its longest prompt + answer."""
    from timebill_ros.bench.timebill import rlp_test_prompts
    return max(len(engine.encode(prompt)) for _, prompt in rlp_test_prompts(n_prompts)) \
        + n_tokens


def _llama(args, kvs, xs, agreement_context):
    """Return (the llama.cpp engine or None, the report's note on its row).

    Its context holds the longest of the timed prompts and of the agreement's
    (``agreement_context`` tokens: an RLP log question runs ~3.5k).
    """
    from timebill_ros.bench import llama_cpp as enginebench_llama_cpp
    if not enginebench_llama_cpp.available():
        return None, 'skipped: llama-cpp-python is not installed (`make bench-deps`).'
    context = max(max(xs), max(kvs) + args.rounds * (args.steps + 1), agreement_context) + 16
    llama = enginebench_llama_cpp.LlamaCppEngine(args.threads or torch.get_num_threads(),
                                                 context, args.model or None)
    which = pathlib.Path(args.model).name if args.model else 'the embedded Q4_1 GGUF'
    return llama, (f'llama-cpp-python, {which}, same threads; decode is the '
                   'bare model step (no sampling, stop checks or text streaming).')


def _floors(engines, llama, bandwidth, model_path) -> dict:
    """Return each timed row's decode floor: bytes a step reads / bandwidth, ms."""
    from timebill_ros.engine.model_source import embedded_gguf_path
    engines = _decoding(engines)
    file_bytes = pathlib.Path(model_path or embedded_gguf_path()).stat().st_size
    lean_fp32 = step_weight_bytes(engines['lean fp32']) if 'lean fp32' in engines else 0
    floor_ms = {}
    for name, engine in engines.items():
        size = (engine.forward.weight_bytes if engine.gguf_file is not None
                else step_weight_bytes(engine) or lean_fp32)
        floor_ms[name] = size / (bandwidth * 1e9) * 1e3
    if llama is not None:
        floor_ms[llama.name] = file_bytes / (bandwidth * 1e9) * 1e3
    return floor_ms


def _command(args) -> str:
    """Return the command line of a run (for the report)."""
    parts = ['timebill enginebench']
    if args.model:
        parts.append(f'--model {pathlib.Path(args.model).name}')
    if args.device != 'cpu':
        parts.append(f'--device {args.device}')
    if args.quick:
        parts.append('--quick')
    if args.agreement_prompts:
        parts.append(f'--agreement-prompts {args.agreement_prompts}')
    if args.prefill_tokens:
        parts.append('--prefill-tokens ' + ' '.join(str(n) for n in args.prefill_tokens))
    if args.agreement_tokens != AGREEMENT_TOKENS:
        parts.append(f'--agreement-tokens {args.agreement_tokens}')
    return ' '.join(parts)


def run_enginebench(args, progress=print) -> int:
    """Run the benchmark; write enginebench.md, .png and .json under ``args.out``.

    With ``args.from_json`` only re-make the table and plot from a saved run.
    """
    if args.from_json:
        data = json.loads(pathlib.Path(args.from_json).read_text())
        _write(pathlib.Path(args.out), _rows_from_json(data), data['meta'], progress)
        return 0
    torch.manual_seed(0)
    prefill_dtype, memory = '', {}
    if args.model:
        engines, auto = _file_engines(args.model, args.threads, memory), ''
        prefill_dtype = _prefill_choice(engines['timebill gguf'])
        progress(f'resident after loading the file: {memory["after_load_mb"]:.0f} MiB '
                 f'(before {memory["before_load_mb"]:.0f}; the file {memory["file_mb"]:.0f})')
    else:
        gpu = torch.device(args.device).type != 'cpu'
        engines = _engines(GPU_FORMATS if gpu else FORMATS, args.threads, args.device)
        auto = _auto_choice(args.threads, args.device)
        progress(f'decode_weights auto chooses {auto}')
    rows = {name: Row(name) for name in engines}
    kvs = DECODE_KV[:2] if args.quick else DECODE_KV
    xs = tuple(args.prefill_tokens) or (PREFILL_TOKENS[:2] if args.quick else PREFILL_TOKENS)
    n_prompts = args.agreement_prompts or (2 if args.quick else AGREEMENT_PROMPTS)
    agreement_context = agreement_tokens_needed(next(iter(engines.values())), n_prompts,
                                                args.agreement_tokens)
    llama, llama_note = _llama(args, kvs, xs, agreement_context) if args.device == 'cpu' else (
        None, f'not run: the engine is on {args.device}.')
    if llama is not None:
        rows[llama.name] = Row(llama.name)
    with torch.inference_mode():
        _measure_decode(engines, rows, kvs, args.rounds, args.steps, progress, llama)
        _measure_batches(engines, rows, BATCH_SIZES, args.rounds, args.steps, progress)
        _measure_prefill(engines, rows, xs, args.rounds, progress, llama)
        if args.model:
            _measure_prefill_parts(engines['timebill gguf'], rows['timebill gguf'], xs, progress)
    _measure_agreement(engines, rows, n_prompts, args.agreement_tokens, progress, llama)
    bandwidth = copy_bandwidth_gbs(device=args.device)
    floor_ms = _floors(engines, llama, bandwidth, args.model)
    first = list(engines.values())[-1]
    meta = {'model': first.model_key, 'threads': torch.get_num_threads(), 'device': args.device,
            'rounds': args.rounds, 'bandwidth_gbs': bandwidth, 'floor_ms': floor_ms,
            'agreement_tokens': args.agreement_tokens, 'llama_cpp': llama_note, 'auto': auto,
            'prefill_dtype': prefill_dtype, 'memory': memory,
            'command': _command(args)}
    _write(pathlib.Path(args.out), rows, meta, progress)
    return 0


def add_arguments(parser):
    """Add the flags of ``timebill enginebench`` to the argparse ``parser``."""
    parser.add_argument('--out', default='benchmarks/results/engine')
    parser.add_argument('--threads', type=int, default=0, help='0 = torch default')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--steps', type=int, default=16, help='decoding steps a round')
    parser.add_argument('--quick', action='store_true',
                        help='KV 100/1000, prefill 128/512, 2 prompts')
    parser.add_argument('--prefill-tokens', type=int, nargs='+', default=[], metavar='N',
                        help='prefill lengths timed (default 128 512 2048 4096; --quick: '
                        '128 512)')
    parser.add_argument('--agreement-prompts', type=int, default=0,
                        help=f'held-out prompts of the greedy agreement (0: {AGREEMENT_PROMPTS}, '
                        '2 with --quick)')
    parser.add_argument('--model', default='', metavar='FILE.gguf',
                        help='a GGUF file: the engine on it, llama.cpp on it, and transformers '
                        "fp32 on its weights as the agreement's reference")
    parser.add_argument('--agreement-tokens', type=int, default=AGREEMENT_TOKENS,
                        help='tokens of each greedy answer compared')
    parser.add_argument('--device', default='cpu',
                        help='torch device of the embedded model (cuda: no gguf row, no '
                        'llama.cpp row; not with --model, whose kernels run on the CPU)')
    parser.add_argument('--from-json', default='', metavar='JSON',
                        help='only re-make the table and plot of a saved run')
