"""Planner answers with a JSON schema: whether they parse and validate, and t^_WCET holds.

    timebill study json_answers [--prompts 12] [--budget 30] [--out FILE.md]

Held-out planner prompts (the corpus test split of the planning families) through the core
service the node runs (embedded model, default parameters, Kill, fallback length predictor),
each once with a planner schema and once without, alternating. Prints per goal the finish
reason, tokens, time and t^_WCET, and in all: documents that parse and validate, and t^_WCET
coverage with and without the schema.
"""

import argparse
import datetime
import json
import platform

SCHEMA = {
    'type': 'object', 'additionalProperties': False, 'required': ['goal', 'steps'],
    'properties': {
        'goal': {'type': 'string', 'maxLength': 120},
        'steps': {'type': 'array', 'minItems': 1, 'maxItems': 6, 'items': {
            'type': 'object', 'additionalProperties': False, 'required': ['action', 'target'],
            'properties': {'action': {'enum': ['move', 'pick', 'place', 'inspect', 'wait']},
                           'target': {'type': 'string', 'maxLength': 60}}}}}}
FAMILIES = ('plan', 'navigate', 'manipulate', 'plan_paraphrase', 'to_json', 'map_qa')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--prompts', type=int, default=12)
    parser.add_argument('--budget', type=float, default=30.0)
    parser.add_argument('--max-new-tokens', type=int, default=256)
    parser.add_argument('--out', default='benchmarks/results/json_answers/json_answers.md')
    args = parser.parse_args(argv)
    import jsonschema

    from timebill_ros.bench.prefix import ask
    from timebill_ros.bench.rows import write_table
    from timebill_ros.params import load_config
    from timebill_ros.server.factory import build_service
    from timebill_ros.server.goals import GoalRequest
    from timebill_ros.training.corpus import build_corpus
    items = [it for it in build_corpus() if it.split == 'test' and it.category in FAMILIES]
    items = items[::max(1, len(items) // args.prompts)][:args.prompts]
    config = load_config(None, ['predictor.kind=fallback', 'predictor.prefill_readout=false'])
    service = build_service(config, log=print)
    service.start()
    rows = []
    try:
        for item in items:
            for schema in (json.dumps(SCHEMA), ''):
                prompt = item.prompt + (' Answer as JSON: a goal and up to six steps.'
                                        if schema else '')
                result = ask(service, GoalRequest(prompt, budget_s=args.budget,
                                                  max_new_tokens=args.max_new_tokens,
                                                  json_schema=schema))
                valid = None
                if schema and result.response:
                    try:
                        jsonschema.validate(json.loads(result.response), SCHEMA)
                        valid = True
                    except (ValueError, jsonschema.ValidationError):
                        valid = False
                rows.append(dict(prompt_id=item.prompt_id, schema=bool(schema),
                                 status=result.status_name, finish=result.finish_reason,
                                 tokens=result.response_tokens, total_s=result.total_time_s,
                                 execution_s=result.execution_time_s,
                                 wcet_s=result.predicted_wcet_s, valid=valid,
                                 response=result.response))
                print(f"{item.prompt_id} schema={bool(schema)} {result.status_name} "
                      f"{result.finish_reason} {result.response_tokens} tok "
                      f"{result.execution_time_s:.2f}/{result.predicted_wcet_s:.2f} s "
                      f"valid={valid}")
    finally:
        service.shutdown()
    lines = ['# JSON-schema answers on held-out planner prompts', '',
             f'{platform.node()}, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; '
             f'`timebill study json_answers --prompts {args.prompts}`; budget '
             f'{args.budget} s, Kill, max_new_tokens {args.max_new_tokens}, fallback predictor.',
             '', '| | goals | finish reasons | parse and validate | t^_WCET coverage | '
             'mean tokens |', '|---|---|---|---|---|---|']
    for with_schema in (True, False):
        group = [r for r in rows if r['schema'] is with_schema]
        finishes = {}
        for r in group:
            finishes[r['finish']] = finishes.get(r['finish'], 0) + 1
        ran = [r for r in group if r['status'] == 'COMPLETED' and r['wcet_s'] > 0]
        covered = sum(r['execution_s'] <= r['wcet_s'] for r in ran)
        valid = (f"{sum(bool(r['valid']) for r in group)}/{len(group)}" if with_schema
                 else '-')
        lines.append(f"| {'schema' if with_schema else 'no schema'} | {len(group)} | "
                     f"{', '.join(f'{k} {v}' for k, v in sorted(finishes.items()))} | {valid} | "
                     f"{covered}/{len(ran)} | "
                     f"{sum(r['tokens'] for r in group) / max(len(group), 1):.0f} |")
    lines += ['', 'Schema answers:', '']
    lines += [f"- {r['prompt_id']}: `{r['response'][:160]}`" for r in rows if r['schema']]
    write_table(args.out, lines, rows)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
