"""What the ``timebill predictor`` steps share: the config, the lengths, the engine, levels."""

import pathlib

ONNX_ATOL = 1e-3  # fp32 export vs torch: bucket probabilities (or the scaled length)


def config_of(args):
    """Return the ServerConfig of ``--params`` / ``--set``, ``--model`` as engine.model_path."""
    import dataclasses
    from timebill_ros.params import load_config
    config = load_config(args.params, args.set)
    if getattr(args, 'model', None):
        model = pathlib.Path(args.model).expanduser().resolve()
        if not model.exists():
            raise ValueError(f'--model {args.model}: no such file or directory')
        config = dataclasses.replace(
            config, engine=dataclasses.replace(config.engine, model_path=str(model)))
    return config


def lengths_of(args, config):
    """Return the lengths JSONL: ``--lengths``, else the model's (predictor_build)."""
    from timebill_ros.cli.predictor_build import lengths_path
    return lengths_path(config, getattr(args, 'lengths', None))


def training_engine(args, config=None):
    """Return (config, the LlmEngine the predictors train on) of ``args``."""
    from timebill_ros.engine import LlmEngine
    config = config or config_of(args)
    # The RLP trains on transformers modules: the embedded model is loaded as such; a GGUF
    # file is served on its own blocks and the RLP gets transformers' copy of it
    # (training.target.load_target_model).
    return config, LlmEngine.load(config.engine, config.eviction, transformers_model=True)


def calibrate_levels(model, splits):
    """Set ``model.quantile_levels`` from the val prompts (export.calibrate_quantiles)."""
    from timebill_ros.training.export import calibrate_quantiles
    model.quantile_levels = calibrate_quantiles(model, splits['val'])
    print(f'{model.name}: N^_q levels calibrated on {len(splits["val"])} val prompts (q:level): '
          f'{model.quantile_levels or "none"}')


def add_readout_arguments(parser, file_parameter):
    """Add the flags a readout's training takes (B, head, epochs, seed, its file, export).

    file_parameter: the ``predictor.*`` parameter naming its ONNX file by default.
    """
    parser.add_argument('--bucket', type=int, default=64, help='B, tokens; 0 = regression')
    parser.add_argument('--head', choices=('softmax', 'ordinal'), default='ordinal')
    parser.add_argument('--epochs', type=int, default=6)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--onnx', help=f'ONNX path (default: predictor.{file_parameter} or '
                        'the cache)')
    parser.add_argument('--export', action='store_true', help='also export to ONNX and check')
    parser.add_argument('--if-stale', action='store_true',
                        help='skip if the ONNX was trained on every collected training prompt')
