"""``timebill predictor collect|train|export|eval``: the response-length predictors."""

import argparse
import pathlib
import sys

from timebill_ros.cli.predictor_common import (add_readout_arguments, calibrate_levels,
                                               config_of, lengths_of, ONNX_ATOL,
                                               training_engine)

ONNX_CHECK_PROMPTS = 24  # test prompts compared torch vs onnxruntime after export
INT8_AGREEMENT = 0.9  # int8-embedding export: share of check prompts with torch's N^


def _paths(args, config):
    """Return (ONNX path, torch checkpoint path); needs no loaded model."""
    from timebill_ros.predictors.contract import predictor_files
    onnx_path = pathlib.Path(args.onnx or predictor_files(config)['RLP'])
    return onnx_path, onnx_path.with_suffix('.pt')


def cmd_collect(args, ros_args):
    """Run the target LLM over the corpus and append response lengths (resumable).

    The pooled prefill states of the readout's layers are kept on the way (the prefill
    features cache), so the readout needs no second pass over the corpus.
    """
    from timebill_ros.training.collect import collect
    from timebill_ros.training.corpus import build_corpus, quick_subset
    from timebill_ros.training.prefill_features import default_features_path, FeatureSink
    config = config_of(args)
    out = lengths_of(args, config)
    config, engine = training_engine(args, config)
    items = build_corpus()
    if args.split:
        items = [it for it in items if it.split == args.split]
    if args.prompts:
        items = quick_subset(items, args.prompts)
    cfg = config.engine
    guard_on = cfg.loop_guard if args.loop_guard is None else args.loop_guard
    loop_guard = ((cfg.loop_guard_max_period, cfg.loop_guard_min_repeats,
                   cfg.loop_guard_min_span) if guard_on else None)
    engine.pool_layers = _pool_layers(args, engine)
    sink = FeatureSink(engine, default_features_path(engine.model_key,
                                                     cfg.model_cache_dir or None))
    try:
        n = collect(engine, items, out, n_model=args.n_model, max_batch=args.batch,
                    limit=args.limit or None, loop_guard=loop_guard, on_prefill=sink.add)
    finally:
        sink.close()
    print(f'collected {n} prompts into {out}')
    return 0


def cmd_verify(args, ros_args):
    """Re-measure some collected lengths unbatched, through the server's decode path."""
    from timebill_ros.training.collect import verify
    from timebill_ros.training.corpus import build_corpus
    config, engine = training_engine(args)
    rows = verify(engine, build_corpus(), lengths_of(args, config), args.n)
    same = sum(b == s for _, b, s in rows)
    within = sum(abs(b - s) <= 16 for _, b, s in rows)
    print(f'{same}/{len(rows)} identical, {within}/{len(rows)} within 16 tokens '
          '(batched collection vs unbatched server path)')
    return 0


def cmd_build(args, ros_args):
    """Build the model's own RLP and readout: collect its lengths if needed, train, export."""
    from timebill_ros.cli.predictor_build import cmd_build as build
    return build(args, config_of(args))


def _rlp_settings(args, n_model):
    return {'bucket_tokens': args.bucket or None, 'n_model': n_model, 'n_layers': args.layers,
            'n_trainable_layers': args.trainable_layers,
            'max_input_tokens': args.max_input_tokens, 'epochs': args.epochs, 'seed': args.seed,
            'head': args.head}


def cmd_train(args, ros_args):
    """Train the RLP on the train split (val picks the epoch); save it; optionally export."""
    import torch
    from timebill_ros.training.dataset import load_examples
    from timebill_ros.training.heads.rlp import RlpModel
    from timebill_ros.cli.predictor_build import built_on
    from timebill_ros.training.target import load_target_model
    config = config_of(args)
    onnx_path, pt_path = _paths(args, config)
    splits = load_examples(lengths_of(args, config), args.split_view)
    if args.if_stale and built_on(onnx_path) >= len(splits['train']):
        print(f'RLP already built on every collected training prompt: {onnx_path}')
        return _train_lengths_if_missing(args, config, onnx_path)
    _, engine = training_engine(args, config)
    settings = _rlp_settings(args, splits['train'][0].n_model)
    model = RlpModel(load_target_model(engine), engine.encode, **settings)
    model.fit(splits['train'], splits['val'])
    calibrate_levels(model, splits)
    pt_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({'settings': settings, 'state_dict': model.net.state_dict(),
                'n_train': model.n_train, 'quantile_levels': model.quantile_levels}, pt_path)
    print(f'saved {pt_path}')
    if args.export:
        return _export(model, engine, splits, onnx_path, args.embedding, config.predictor)
    return 0


def _train_lengths_if_missing(args, config, onnx_path):
    """Store the training predictions beside an RLP built before they were stored."""
    from timebill_ros.predictors.threshold import read_train_lengths
    from timebill_ros.training.export import export_train_lengths
    try:
        read_train_lengths(onnx_path)
    except (OSError, ValueError, KeyError):
        _, engine = training_engine(args, config)
        export_train_lengths(onnx_path, engine.encode, config.predictor)
    return 0


def _export(model, engine, splits, onnx_path, embedding, predictor_config):
    """Export and check against torch: fp32 to ONNX_ATOL, int8 by N^ agreement.

    Then store the exported RLP's N^ of the training sample beside it (the offload
    threshold's input).
    """
    import onnxruntime
    from timebill_ros.training.export import (compare_with_torch, export_onnx,
                                              export_train_lengths)
    export_onnx(model, onnx_path, engine.model_key, embedding)
    session = onnxruntime.InferenceSession(str(onnx_path), providers=['CPUExecutionProvider'])
    by_length = sorted(_check_examples(splits), key=lambda e: e.n_prompt_tokens)
    picks = sorted({round(i * (len(by_length) - 1) / (ONNX_CHECK_PROMPTS - 1))
                    for i in range(ONNX_CHECK_PROMPTS)})  # shortest to longest, evenly
    ids = [model.input_ids(by_length[i].prompt) for i in picks]
    diff, same = compare_with_torch(model, session, ids)
    lengths = sorted(len(i) for i in ids)
    print(f'ONNX ({embedding} embedding) vs torch on {len(ids)} held-out prompts '
          f'({lengths[0]}..{lengths[-1]} tokens): max |difference| {diff:.2e}, '
          f'same N^ on {same}/{len(ids)}')
    if embedding == 'float32' and diff > ONNX_ATOL:
        print(f'ONNX output differs from torch: {diff} > {ONNX_ATOL}', file=sys.stderr)
        return 1
    if same < INT8_AGREEMENT * len(ids):
        print(f'ONNX N^ differs from torch on {len(ids) - same}/{len(ids)} prompts',
              file=sys.stderr)
        return 1
    print(f'exported {onnx_path} ({onnx_path.stat().st_size / 1e6:.0f} MB)')
    export_train_lengths(onnx_path, engine.encode, predictor_config)
    return 0


def cmd_export(args, ros_args):
    """Export the trained RLP (.pt next to the ONNX path) to ONNX and check it."""
    import torch
    from timebill_ros.training.dataset import load_examples
    from timebill_ros.training.heads.rlp import RlpModel
    from timebill_ros.training.target import load_target_model
    config = config_of(args)
    onnx_path, pt_path = _paths(args, config)
    if not pt_path.is_file():
        print(f'no trained RLP at {pt_path}: run `timebill predictor train`', file=sys.stderr)
        return 2
    _, engine = training_engine(args, config)
    saved = torch.load(pt_path, weights_only=True)
    model = RlpModel(load_target_model(engine), engine.encode, **saved['settings'])
    model.net.load_state_dict(saved['state_dict'])
    model.n_train = saved.get('n_train', 0)
    model.quantile_levels = saved.get('quantile_levels', '')
    return _export(model, engine, load_examples(lengths_of(args, config), args.split_view),
                   onnx_path,
                   args.embedding, config.predictor)


def _pool_layers(args, engine):
    """Return ``--pool-layers`` as a tuple of 1-based layers (default: middle and last)."""
    from timebill_ros.training.heads.prefill_readout import default_pool_layers
    if not args.pool_layers:
        return default_pool_layers(engine.n_layers)
    try:
        return tuple(int(part) for part in args.pool_layers.split(','))
    except ValueError:
        raise ValueError(f'--pool-layers must be a comma list of ints, got '
                         f'{args.pool_layers!r}') from None


def _features(engine, config, splits, layers):
    """Return prompt id -> pooled prefill states of every example (training.prefill_features)."""
    from timebill_ros.training.prefill_features import default_features_path, prefill_features
    examples = [e for split in splits.values() for e in split]
    path = default_features_path(engine.model_key, config.engine.model_cache_dir or None)
    return prefill_features(engine, examples, path, log=print, layers=layers)


def _readout_path(args, config):
    from timebill_ros.predictors.contract import predictor_files
    return pathlib.Path(args.onnx or predictor_files(config)['readout'])


def cmd_readout(args, ros_args):
    """Train the prefill readout on the engine's pooled prefill states; optionally export it."""
    import torch
    from timebill_ros.training.dataset import load_examples
    from timebill_ros.training.heads.prefill_readout import PrefillReadoutModel
    from timebill_ros.cli.predictor_build import built_on
    from timebill_ros.training.target import final_norm_weight
    config = config_of(args)
    path = _readout_path(args, config)
    splits = load_examples(lengths_of(args, config), args.split_view)
    if args.if_stale and built_on(path) >= len(splits['train']):
        print(f'prefill readout already built on every collected training prompt: {path}')
        return 0
    _, engine = training_engine(args, config)
    layers = _pool_layers(args, engine)
    model = PrefillReadoutModel(final_norm_weight(engine), engine.n_layers,
                                _features(engine, config, splits, layers),
                                bucket_tokens=args.bucket or None,
                                n_model=splits['train'][0].n_model, epochs=args.epochs,
                                seed=args.seed, head=args.head, pool_layers=layers)
    model.fit(splits['train'], splits['val'])
    calibrate_levels(model, splits)
    if splits['test']:
        print(f'{model.name}: test MAE {model.mae(splits["test"]):.1f} tokens '
              f'({args.split_view} view, {len(splits["test"])} prompts)')
    else:
        print(f'{model.name}: no test prompts collected (a quick build); val MAE '
              f'{model.mae(splits["val"]):.1f} tokens')
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({'state_dict': model.net.state_dict()}, path.with_suffix('.pt'))
    if args.export:
        return _export_readout(model, engine, _check_examples(splits), path)
    return 0


def _export_readout(model, engine, test, path):
    """Export the readout and check onnxruntime against torch on the test prompts."""
    import onnxruntime
    from timebill_ros.predictors.contract import POOLED_NAME
    from timebill_ros.training.export import compare_with_torch, export_readout_onnx
    from timebill_ros.predictors.prefill_readout import PrefillReadout
    export_readout_onnx(model, path, engine.model_key)
    # Opened as the server opens it: its metadata must be a readout's.
    readout = PrefillReadout(onnxruntime.InferenceSession(
        str(path), providers=['CPUExecutionProvider']))
    worst, same = compare_with_torch(model, readout.session,
                                     [model.features[e.prompt_id] for e in test], POOLED_NAME)
    print(f'ONNX vs torch on {len(test)} held-out prompts: max |difference| '
          f'{worst:.2e}, same N^ on {same}/{len(test)}; {readout.time_s * 1e3:.2f} ms a call')
    if worst > ONNX_ATOL:
        print(f'ONNX output differs from torch: {worst} > {ONNX_ATOL}', file=sys.stderr)
        return 1
    print(f'exported {path} ({path.stat().st_size / 1e6:.1f} MB)')
    return 0


def _buckets(text: str) -> tuple:
    """Parse ``--buckets`` (comma list of B in tokens, 0 = regression) into RLP_BUCKETS form."""
    try:
        values = [int(part) for part in text.split(',') if part.strip()]
    except ValueError:
        raise ValueError(f'--buckets must be a comma list of ints, got {text!r}') from None
    if not values or any(v < 0 for v in values):
        raise ValueError(f'--buckets needs ints >= 0 (0 = regression), got {text!r}')
    return tuple(v or None for v in values)


def cmd_eval(args, ros_args):
    """Train every predictor on train, print MAE / RMSE / R^2 on test, save the table."""
    import json
    from timebill_ros.training import report
    from timebill_ros.training.dataset import load_examples
    splits = load_examples(lengths_of(args, config_of(args)), args.split_view)
    if args.report_only:  # rewrite the tables and the plot from a saved run
        rows = json.loads((pathlib.Path(args.out) / 'rlp_eval.json').read_text())
        print(f'saved {report.save_report(rows, splits, args.out)}')
        return 0
    config, engine = training_engine(args)
    n_model = splits['train'][0].n_model
    models = report.baseline_models(print) + report.rlp_variants(
        engine, n_model, {}, print, buckets=_buckets(args.buckets), n_layers=args.layers,
        n_trainable_layers=args.trainable_layers, max_input_tokens=args.max_input_tokens,
        epochs=args.epochs, seed=args.seed, head=args.head)
    if args.readout:
        layers = _pool_layers(args, engine)
        models += report.readout_variants(engine, n_model,
                                          _features(engine, config, splits, layers), print,
                                          buckets=_buckets(args.buckets), epochs=args.epochs,
                                          seed=args.seed, head=args.head, pool_layers=layers)
    if args.only:
        models = [m for m in models if any(s in m.name for s in args.only.split(','))]
    rows = report.evaluate_models(models, splits)
    print(report.format_table(rows, splits))
    print(f'saved {report.save_report(rows, splits, args.out)}')
    return 0


def cmd_overlap(args, ros_args):
    """Measure t_Predict against t_prefill when both run concurrently, as in the server."""
    from timebill_ros.server.backends.local import build_predictor
    from timebill_ros.predictors.onnx_rlp import OnnxRlpPredictor
    from timebill_ros.timing.startup import load_or_calibrate
    from timebill_ros.training.overlap import format_overlap, measure_overlap
    config, engine = training_engine(args)
    calibration = load_or_calibrate(engine, config.engine, config.timing, log=print)
    predictor = build_predictor(config, engine, calibration.coefficients)
    if not isinstance(predictor, OnnxRlpPredictor):
        print(f'no RLP to measure: {predictor.name}', file=sys.stderr)
        return 2
    rows = measure_overlap(engine, predictor, repeats=args.repeats)
    text = format_overlap(rows)
    print(text)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text('Regenerate: `timebill predictor overlap`\n\n' + text + '\n')
    print(f'saved {out}')
    return 0


def _check_examples(splits):
    """Return the held-out prompts exports are checked on: test, else val (a quick build)."""
    return splits['test'] or splits['val'] or splits['train']


def _common(parser, lengths=True):
    parser.add_argument('--params', help='ROS 2 params YAML for the engine settings')
    parser.add_argument('--set', action='append', default=[], metavar='GROUP.FIELD=VALUE')
    parser.add_argument('--model', metavar='FILE',
                        help='the model (a .gguf file or a transformers folder): '
                        'engine.model_path; default: the params, else the embedded model')
    if lengths:
        parser.add_argument('--lengths', default=None,
                            help="lengths JSONL (default: the embedded model's committed "
                            'file, or <cache>/rlp/<model key>__lengths.jsonl)')
        parser.add_argument('--split-view', choices=('prompt', 'family'), default='prompt',
                            help='prompt: each prompt its own split (templates shared); '
                            'family: whole template families held out for val and test')


def _rlp_args(parser):
    parser.add_argument('--layers', type=int, default=4, help='L, target decoder layers')
    parser.add_argument('--trainable-layers', type=int, default=1, help='last T layers train')
    parser.add_argument('--max-input-tokens', type=int, default=512, help='training N_p')
    parser.add_argument('--epochs', type=int, default=6)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--head', choices=('softmax', 'ordinal'), default='softmax',
                        help='bucket head: softmax cross-entropy or ordinal (cumulative link)')


def _pool_layers_arg(parser):
    parser.add_argument('--pool-layers', default='',
                        help='prefill readout: decoder layers pooled, 1-based comma list '
                        '(default: the middle and the last)')


def _embedding_arg(parser):
    from timebill_ros.training.export import EMBEDDING_FORMATS
    parser.add_argument('--embedding', choices=EMBEDDING_FORMATS, default=EMBEDDING_FORMATS[0],
                        help='weights of the embedding table in the ONNX file')


def add_parser(sub):
    """Add the ``predictor`` command and its subcommands to ``sub``."""
    from timebill_ros.cli import predictor_decode
    from timebill_ros.training.collect import MAX_BATCH, N_MODEL
    parser = sub.add_parser('predictor', help=__doc__)
    psub = parser.add_subparsers(dest='predictor_command', required=True)
    col = psub.add_parser('collect', help=cmd_collect.__doc__)
    _common(col, lengths=False)
    col.add_argument('--out', dest='lengths', default=None,
                     help='lengths JSONL, appended (default: as --lengths of train)')
    col.add_argument('--prompts', type=int, default=0,
                     help='a quick start: only this many train / val prompts (0 = all)')
    _pool_layers_arg(col)
    col.add_argument('--n-model', type=int, default=N_MODEL, help='N_model, tokens')
    col.add_argument('--batch', type=int, default=MAX_BATCH, help='prompts per batch')
    col.add_argument('--split', choices=('train', 'val', 'test'), help='only this split')
    col.add_argument('--limit', type=int, default=0, help='at most this many prompts now')
    col.add_argument('--loop-guard', action=argparse.BooleanOptionalAction, default=None,
                     help="end looping answers as the server does (default: the params' "
                     'engine.loop_guard and its settings)')
    col.set_defaults(func=cmd_collect)
    build = psub.add_parser('build', help=cmd_build.__doc__)
    _common(build, lengths=False)
    build.add_argument('--background', action='store_true',
                       help='in a niced process of its own; return at once')
    build.add_argument('--prompts', type=int, default=0,
                       help='a quick start: collect only this many train / val prompts')
    build.add_argument('--nice', type=int, default=10, help='--background: nice level')
    build.set_defaults(func=cmd_build)
    ver = psub.add_parser('verify', help=cmd_verify.__doc__)
    _common(ver)
    ver.add_argument('--n', type=int, default=16, help='prompts to re-measure')
    ver.set_defaults(func=cmd_verify)
    train = psub.add_parser('train', help=cmd_train.__doc__)
    _common(train)
    _rlp_args(train)
    train.add_argument('--bucket', type=int, default=64, help='B, tokens; 0 = regression')
    train.add_argument('--onnx', help='ONNX path (default: predictor.model_file or the cache)')
    train.add_argument('--export', action='store_true', help='also export to ONNX and check')
    train.add_argument('--if-stale', action='store_true',
                       help='skip if the ONNX was trained on every collected training prompt')
    _embedding_arg(train)
    train.set_defaults(func=cmd_train)
    readout = psub.add_parser('readout', help=cmd_readout.__doc__)
    _common(readout)
    add_readout_arguments(readout, 'readout_file')
    _pool_layers_arg(readout)
    readout.set_defaults(func=cmd_readout)
    decode = psub.add_parser('decode-readout', help=predictor_decode.cmd_decode_readout.__doc__)
    _common(decode)
    add_readout_arguments(decode, 'decode_readout_file')
    predictor_decode.add_arguments(decode)
    decode.set_defaults(func=predictor_decode.cmd_decode_readout)
    export = psub.add_parser('export', help=cmd_export.__doc__)
    _common(export)
    export.add_argument('--onnx', help='ONNX path (default: predictor.model_file or the cache)')
    _embedding_arg(export)
    export.set_defaults(func=cmd_export)
    ev = psub.add_parser('eval', help=cmd_eval.__doc__)
    _common(ev)
    _rlp_args(ev)
    ev.add_argument('--out', default='benchmarks/results', help='folder of rlp_eval.md/json')
    ev.add_argument('--only', default='', help='comma list of name parts to run')
    ev.add_argument('--report-only', action='store_true',
                    help='rewrite the report from OUT/rlp_eval.json (same lengths and view)')
    ev.add_argument('--readout', action='store_true',
                    help='add the prefill readout (one per --buckets B; features cached)')
    _pool_layers_arg(ev)
    ev.add_argument('--buckets', default='8,16,32,64,0',
                    help='RLP variants: comma list of B, tokens (0 = regression)')
    ev.set_defaults(func=cmd_eval)
    over = psub.add_parser('overlap', help=cmd_overlap.__doc__)
    _common(over, lengths=False)
    over.add_argument('--repeats', type=int, default=3)
    over.add_argument('--out', default='benchmarks/results/rlp_overlap.md')
    over.set_defaults(func=cmd_overlap)
    return parser
