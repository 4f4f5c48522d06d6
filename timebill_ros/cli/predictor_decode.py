"""``timebill predictor decode-readout``: train (and export) the model's decode readout.

It reads the answers a collection kept (``answer_ids`` in the lengths file), teacher-forces
each after its prompt (training/decode_features.py, one prefill of prompt + answer), and
trains the readout on the prompt's and the answer's pooled states at decoding checkpoints
(training/heads/decode_readout.py). It prints, at each checkpoint k of the held-out
prompts, the rest's error beside the prefill readout's (the same distribution read from the
prompt alone, conditioned on N > k, as timebill-online reads it without this file).
"""

import json
import pathlib
import statistics

Q_REST = 0.9  # the upper quantile the rest's coverage is reported at (budget.upper_quantile)


def add_arguments(parser):
    """Add ``--answer-ids``, the held-out rows (``--rows``) and their table (``--rest-table``)."""
    parser.add_argument('--answer-ids', metavar='JSONL',
                        help='a collection whose answer_ids join the lengths file (default: '
                        'the embedded model\'s committed data/rlp/answer_ids_240.jsonl)')
    parser.add_argument('--rows', help='write the held-out rest rows (JSON) here')
    parser.add_argument('--rest-table', metavar='ROWS_JSON',
                        help='only print the table of rows --rows wrote')


def prefill_pool_layers(config, n_layers):
    """Return the layers the prefill readout pools (the decode readout must read the same).

    From the prefill readout file's metadata beside it (``<file>.json``), else the default
    (middle and last).
    """
    from timebill_ros.predictors.contract import predictor_files
    from timebill_ros.training.heads.prefill_readout import default_pool_layers
    meta_path = predictor_files(config)['readout'].with_suffix('.json')
    try:
        text = json.loads(meta_path.read_text())['pool_layers']
        return tuple(int(n) for n in text.split(','))
    except (OSError, KeyError, ValueError):
        return default_pool_layers(n_layers)


def cmd_decode_readout(args, ros_args):
    """Train the decode readout on collected answers' states at checkpoints; optionally export."""
    import torch
    from timebill_ros.cli.predictor_common import (calibrate_levels, config_of, lengths_of,
                                                   training_engine)
    from timebill_ros.cli.predictor_build import built_on
    from timebill_ros.predictors.contract import predictor_files
    from timebill_ros.training.dataset import load_examples
    from timebill_ros.training.decode_features import (
        decode_features, default_decode_features_path)
    from timebill_ros.training.heads.decode_readout import (checkpoint_examples,
                                                            DecodeReadoutModel)
    from timebill_ros.training.target import final_norm_weight
    if args.rest_table:  # only the table of a saved run's rows
        data = json.loads(pathlib.Path(args.rest_table).read_text())
        print(f"{data['readout']} on {data['model']} ({data['n_train_prompts']} training "
              f"prompts); {data['date']}, {data['host']}; `{data['command']}`")
        print(rest_table(data))
        return 0
    config = config_of(args)
    path = pathlib.Path(args.onnx or predictor_files(config)['decode readout'])
    lengths = lengths_of(args, config)
    records = _records_with_ids(args, config, lengths)
    splits = {split: [e for e in examples if 'answer_ids' in records.get(e.prompt_id, {})]
              for split, examples in load_examples(lengths, args.split_view).items()}
    if not splits['train']:
        print(f'decode readout skipped: {lengths} keeps no answer token ids (a collection '
              'made before they were kept: collect again to build it)')
        return 0
    if args.if_stale and built_on(path) >= len(splits['train']):
        print(f'decode readout already built on every collected training prompt: {path}')
        return 0
    _, engine = training_engine(args, config)
    engine.pool_layers = layers = prefill_pool_layers(config, engine.n_layers)
    features = decode_features(
        engine, [e for split in splits.values() for e in split], records,
        default_decode_features_path(engine.model_key, config.engine.model_cache_dir or None))
    points = {split: checkpoint_examples(examples, features)
              for split, examples in splits.items()}
    if not points['train']:
        print('decode readout skipped: no training answer is still decoding at a checkpoint')
        return 0
    model = DecodeReadoutModel(final_norm_weight(engine), engine.n_layers, features,
                               bucket_tokens=args.bucket or None,
                               n_model=splits['train'][0].n_model, epochs=args.epochs,
                               seed=args.seed, head=args.head, pool_layers=layers)
    model.fit(points['train'], points['val'])
    model.n_train = len(splits['train'])  # prompts, as the other predictors count them
    calibrate_levels(model, points)
    held_out = points['test'] or points['val']
    data = rest_data(model, held_out, _prefill_readout(config, engine), engine.model_key)
    print(rest_table(data))
    if args.rows:
        pathlib.Path(args.rows).write_text(json.dumps(data, indent=1))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({'state_dict': model.net.state_dict()}, path.with_suffix('.pt'))
    if args.export:
        return _export(model, engine, held_out, path)
    return 0


def _records_with_ids(args, config, lengths):
    """Return the lengths file's records, with the answer ids of ``--answer-ids`` merged in."""
    from timebill_ros.cli.predictor_build import answer_ids_path
    from timebill_ros.training.collect import load_records, merge_answer_ids
    records = load_records(lengths)
    ids_path = answer_ids_path(config, args.answer_ids, getattr(args, 'lengths', None))
    if ids_path is not None:
        if not ids_path.is_file():
            raise ValueError(f'--answer-ids {ids_path}: no such file')
        merged = merge_answer_ids(records, load_records(ids_path), str(ids_path))
        print(f'answer ids of {merged} prompts from {ids_path}')
    return records


def _prefill_readout(config, engine):
    """Return the model's prefill readout (the comparison), or None without its file."""
    from timebill_ros.predictors.contract import predictor_files
    from timebill_ros.predictors.prefill_readout import PrefillReadout
    path = predictor_files(config)['readout']
    return PrefillReadout.load(path) if path.is_file() else None


def _prompt_part(values, n_layers_pooled):
    """Return the prompt's pooled states (1, 2 L H) of a decode input (1, 2 (L + 1) H)."""
    import torch
    width = values.shape[-1] // (2 * (n_layers_pooled + 1))
    half = values.shape[-1] // 2
    return torch.cat([values[:, :half - width], values[:, half:-width]], dim=1)


def rest_rows(model, examples, prefill=None, q: float = Q_REST) -> list:
    """Return per checkpoint example: k, the true rest, the decode and the prefill bounds.

    Each bound is (N^_rem, N^_rem,q) of the distribution conditioned on N > k at N_max =
    N_model (predictors.length_distribution.OutputFormat.rest_bounds); the prefill
    readout's is None without one. A capped answer's true rest is N_model - k (what
    N_max = N_model leaves).
    """
    import torch
    from timebill_ros.predictors.length_distribution import OutputFormat
    from timebill_ros.training.heads.decode_readout import n_generated_of
    decode_format = OutputFormat('classification', model.bucket_tokens, model.n_model,
                                 model.readout, _levels(getattr(model, 'quantile_levels', '')))
    rows = []
    model.net.eval()
    with torch.inference_mode():
        for example in examples:
            k = n_generated_of(example)
            values = model.features[example.prompt_id]
            output = model.net(values)[0].numpy()
            left = (model.n_model - k,) * 2  # what the server reads without a distribution
            row = {'prompt_id': example.prompt_id, 'k': k,
                   'rest': min(example.n_tokens, model.n_model) - k,
                   'decode': decode_format.rest_bounds(output, model.n_model, k, q) or left,
                   'prefill': None}
            if prefill is not None:
                prompt = _prompt_part(values, len(model.pool_layers))
                row['prefill'] = prefill.format.rest_bounds(
                    prefill.run(prompt), model.n_model, k, q) or left
            rows.append(row)
    return rows


def _levels(text):
    from timebill_ros.predictors.length_distribution import parse_quantile_levels
    return parse_quantile_levels(text or '')


def rest_table(data) -> str:
    """Return the held-out rest errors by checkpoint, the decode readout beside the prefill's.

    data: :func:`rest_data`'s (its rows, N_model, q). Columns per source: MAE of N^_rem
    (tokens), share of rests within N^_rem,q, median N^_rem,q / rest.
    """
    rows, n_model, q = data['rows'], data['n_model'], data['q']
    sources = ['decode'] + (['prefill'] if rows and rows[0]['prefill'] is not None else [])
    lines = [f'rest of the answer at checkpoints, {len(rows)} held-out (prompt, k) pairs, '
             f'N_max = N_model = {n_model}, q = {q}',
             '| k | answers | ' + ' | '.join(
                 f'{s}: MAE N^_rem, covered by N^_rem,q, median N^_rem,q / rest'
                 for s in sources) + ' |',
             '|---|---|' + '---|' * len(sources)]
    for k in sorted({row['k'] for row in rows}):
        at = [row for row in rows if row['k'] == k and row['rest'] > 0]
        if not at:
            continue
        cells = []
        for source in sources:
            mae = statistics.mean(abs(row[source][0] - row['rest']) for row in at)
            covered = sum(row[source][1] >= row['rest'] for row in at)
            ratio = statistics.median(row[source][1] / row['rest'] for row in at)
            cells.append(f'{mae:.1f}, {covered}/{len(at)}, {ratio:.2f}')
        lines.append(f'| {k} | {len(at)} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def rest_data(model, examples, prefill, model_key, q: float = Q_REST) -> dict:
    """Return the held-out rows (:func:`rest_rows`) with what they were read from.

    The command, host and date come along (what ``--rest-table`` prints them with).
    """
    import datetime
    import platform
    import sys
    return {'command': 'timebill predictor ' + ' '.join(sys.argv[2:]), 'host': platform.node(),
            'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
            'model': model_key, 'readout': model.name, 'n_model': model.n_model, 'q': q,
            'n_train_prompts': model.n_train, 'rows': rest_rows(model, examples, prefill, q)}


def _export(model, engine, held_out, path):
    """Export the decode readout; check onnxruntime against torch on held-out checkpoints."""
    import onnxruntime
    from timebill_ros.cli.predictor_common import ONNX_ATOL
    from timebill_ros.predictors.contract import POOLED_NAME
    from timebill_ros.predictors.decode_readout import DecodeReadout
    from timebill_ros.training.export import compare_with_torch, export_readout_onnx
    export_readout_onnx(model, path, engine.model_key)
    readout = DecodeReadout(onnxruntime.InferenceSession(
        str(path), providers=['CPUExecutionProvider']))  # opened as the server opens it
    worst, same = compare_with_torch(model, readout.session,
                                     [model.features[e.prompt_id] for e in held_out],
                                     POOLED_NAME)
    print(f'ONNX vs torch on {len(held_out)} held-out checkpoints: max |difference| '
          f'{worst:.2e}, same N^ on {same}/{len(held_out)}; {readout.time_s * 1e3:.2f} ms a '
          'call')
    if worst > ONNX_ATOL:
        print(f'ONNX output differs from torch: {worst} > {ONNX_ATOL}')
        return 1
    print(f'exported {path} ({path.stat().st_size / 1e6:.1f} MB)')
    return 0
