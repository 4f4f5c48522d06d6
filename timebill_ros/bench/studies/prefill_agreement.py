"""Greedy answers after the bf16 prefill against the fp32 prefill, on many held-out prompts.

    timebill study prefill_agreement FILE.gguf [FILE.gguf ...] [--prompts 100]
        [--tokens 32] [--out OUT.md]

For every file: two engines on it, ``engine.prefill_dtype`` float32 (exact against gguf's
dequantization) and bfloat16 (engine/models/weights._split_linear); each prompt of the RLP test
split (as the engine feeds it: chat template where the file has one) is prefilled and decoded
greedily for ``--tokens`` tokens by both (decoding steps are fp32 on the blocks in both). Prints
and writes how many answers are equal, and for the others the first token that differs.
``timebill enginebench --model`` compares against transformers fp32 on 20 prompts; this asks
the same question of the bf16 prefill on more prompts (the fp32 prefill agreed there 20/20).
"""

import argparse
import datetime
import json
import pathlib
import platform
import sys
import time


def agreement(path: pathlib.Path, n_prompts: int, n_tokens: int):
    """Return (prompts, equal answers, [(prompt_id, tokens equal before the first change)])."""
    from timebill_ros.bench.timebill import rlp_test_prompts
    from timebill_ros.config import EngineConfig, EvictionConfig
    from timebill_ros.engine.llm_engine import LlmEngine
    from timebill_ros.engine.stopping import StopCriteria

    engines = [LlmEngine(EngineConfig(model_path=str(path), prefill_dtype=dtype), EvictionConfig())
               for dtype in ('float32', 'bfloat16')]
    prompts = rlp_test_prompts(n_prompts)
    differ = []
    for prompt_id, prompt in prompts:
        answers = []
        for engine in engines:
            state = engine.prefill(engine.encode(prompt), StopCriteria())
            answers.append(engine.decode(state, n_tokens, StopCriteria()).token_ids)
        if answers[0] != answers[1]:
            same = next((i for i, (a, b) in enumerate(zip(*answers)) if a != b),
                        min(map(len, answers)))
            differ.append((prompt_id, same))
    return len(prompts), len(prompts) - len(differ), differ


def chunk_plan_agreement(path: pathlib.Path, n_prompts: int, n_tokens: int,
                         dtype: str = 'auto'):
    """Return (rows, the dtype ``dtype`` resolved to): each prompt's three greedy answers.

    The engine at ``engine.prefill_dtype`` ``dtype`` (the default: auto) prefills each prompt
    in chunks of 512 (one chunk here) and in 16-token chunks (what a tight budget's time
    model plans); both answers are set against the fp32 engine's (chunks of 512).
    """
    from timebill_ros.bench.timebill import rlp_test_prompts
    from timebill_ros.config import EngineConfig, EvictionConfig
    from timebill_ros.engine.llm_engine import LlmEngine, fixed_chunks
    from timebill_ros.engine.models.weights import prefill_dtype
    from timebill_ros.engine.stopping import StopCriteria

    engine = LlmEngine(EngineConfig(model_path=str(path), prefill_dtype=dtype), EvictionConfig())
    reference = LlmEngine(EngineConfig(model_path=str(path), prefill_dtype='float32'),
                          EvictionConfig())
    rows = []
    for prompt_id, prompt in rlp_test_prompts(n_prompts):
        answers = []
        for which, plan in ((engine, 512), (engine, 16), (reference, 512)):
            state = which.prefill(which.encode(prompt), StopCriteria(),
                                  chunk_plan=fixed_chunks(plan))
            answers.append(which.decode(state, n_tokens, StopCriteria()).token_ids)
        rows.append({'prompt_id': prompt_id, 'chunks_512': answers[0],
                     'chunks_16': answers[1], 'fp32_512': answers[2]})
    return rows, prefill_dtype(dtype)


def chunk_plan_line(name, dtype, rows):
    """Return the table line of one file's rows: answers equal to fp32's and between plans."""
    fp32 = sum(row['chunks_512'] == row['fp32_512'] for row in rows)
    plans = sum(row['chunks_512'] == row['chunks_16'] for row in rows)
    return f'| {name} | {dtype} | {fp32}/{len(rows)} | {plans}/{len(rows)} |'


def main():
    """Run the comparison for each file; print and write a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('files', nargs='+', type=pathlib.Path)
    parser.add_argument('--prompts', type=int, default=100)
    parser.add_argument('--tokens', type=int, default=32)
    parser.add_argument('--out', type=pathlib.Path,
                        default=pathlib.Path('benchmarks/results/own_model/prefill_agreement.md'))
    parser.add_argument('--chunk-plans', action='store_true',
                        help='instead: the default prefill (auto) in two chunk plans, each '
                             "against fp32's answer")
    args = parser.parse_args()
    if args.chunk_plans:
        return chunk_plans_main(args)
    rows = []
    for path in args.files:
        start = time.monotonic()
        n, equal, differ = agreement(path, args.prompts, args.tokens)
        firsts = ', '.join(str(same) for _, same in differ) or '-'
        rows.append(f'| {path.name} | {equal}/{n} ({100 * equal / n:.0f} %) | {firsts} |')
        print(rows[-1], f'({time.monotonic() - start:.0f} s)', flush=True)
    text = '\n'.join([
        '# Greedy answers: bf16 prefill against fp32 prefill',
        '',
        f'Command: `timebill study prefill_agreement {" ".join(f.name for f in args.files)}'
        f' --prompts {args.prompts} --tokens {args.tokens}`; host {platform.node()} '
        f'({platform.machine()}), {datetime.date.today().isoformat()}. Prompts: the first '
        f'{args.prompts} of the RLP test split (one per category in turn), {args.tokens} tokens.',
        '',
        '| file | answers equal | tokens equal before the first change, where one differs |',
        '|---|---|---|', *rows, ''])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f'wrote {args.out}')


def chunk_plans_main(args):
    """Run :func:`chunk_plan_agreement` for each file; print and write a Markdown table."""
    rows, raw = [], {}
    for path in args.files:
        answers, dtype = chunk_plan_agreement(path, args.prompts, args.tokens)
        raw[path.name] = {'dtype': dtype, 'rows': answers}
        rows.append(chunk_plan_line(path.name, dtype, answers))
        print(rows[-1], flush=True)
    args.out.with_suffix('.json').write_text(json.dumps(raw, indent=1), encoding='utf-8')
    text = '\n'.join([
        '# Greedy answers of the default prefill: against fp32, and between two chunk plans',
        '',
        f'Command: `timebill study prefill_agreement {" ".join(f.name for f in args.files)}'
        f' --chunk-plans --prompts {args.prompts} --tokens {args.tokens} --out ...`; host '
        f'{platform.node()} ({platform.machine()}), {datetime.date.today().isoformat()}. '
        f'Prompts: the first {args.prompts} of the RLP test split, {args.tokens} tokens; '
        'plans: chunks of 512 and of 16 tokens. Rows (each answer\'s token ids): '
        f'{args.out.with_suffix(".json").name}; the table again from them: `'
        'timebill study prefill_agreement --chunk-plans-table JSON`.', '',
        '| file | auto resolved to | answers = fp32 (512) | answers equal, 512 vs 16 |',
        '|---|---|---|---|', *rows, ''])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    if len(sys.argv) == 3 and sys.argv[1] == '--chunk-plans-table':
        data = json.loads(pathlib.Path(sys.argv[2]).read_text(encoding='utf-8'))
        print('\n'.join(chunk_plan_line(name, run['dtype'], run['rows'])
                        for name, run in data.items()))
        sys.exit(0)
    main()
