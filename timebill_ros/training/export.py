"""Export a trained RLP to ONNX (dynamic sequence length) and check it against torch.

The ONNX file carries what the server needs to turn its output into N^ as metadata
(``timebill.*`` keys): the kind (classification / regression), B, N_model, L, the training
N_p, the readout, the embedding format and the target model key. The server refuses a file
whose model key is not its model's.

The embedding table (vocabulary x hidden, 49152 x 576 for SmolLM2: 113 of the file's 172 MB in
fp32) is stored as int8 by default (``embedding='int8'``): onnxruntime's dynamic quantization
of the Gather weights, one scale per tensor. Measured on the N_model 128 RLP
(benchmarks/results/rlp_int8): 172 -> 87 MB, the same N^ on 106 of 107 test prompts, t_Predict
within 5 %. Quantizing the layers' MatMuls too is 2-3x faster but moves the MAE from 15 to 21
tokens, so the layers stay fp32.
"""

import json
import math
import pathlib
from typing import Dict, Sequence

import torch

from timebill_ros.predictors.contract import INPUT_NAME, META_PREFIX, OUTPUT_NAME, POOLED_NAME
from timebill_ros.predictors.threshold import MAX_PROMPTS, write_train_lengths

MAX_EXPORT_TOKENS = 8192
EMBEDDING_FORMATS = ('int8', 'float32')


def rlp_metadata(model, model_key: str, embedding: str = 'float32') -> Dict[str, str]:
    """Return the metadata stored in the ONNX file of ``model`` (string values)."""
    return {
        'kind': 'regression' if model.bucket_tokens is None else 'classification',
        'bucket_tokens': str(model.bucket_tokens or 0), 'n_model': str(model.n_model),
        'n_layers': str(model.n_layers), 'max_input_tokens': str(model.max_input_tokens),
        'model_key': model_key, 'name': model.name,
        'readout': getattr(model, 'readout', 'argmax'), 'head': getattr(model, 'head', 'softmax'),
        'embedding': embedding, 'train_prompts': str(getattr(model, 'n_train', 0)),
        'vocab_size': str(_vocab_size(model)),
        'quantile_levels': getattr(model, 'quantile_levels', '')}


CALIBRATED_QUANTILES = (0.8, 0.9, 0.95, 0.99)  # the budget.upper_quantile values calibrated
LEVEL_GRID = tuple(round(0.8 + 0.005 * i, 3) for i in range(40)) + (0.999,)  # levels tried


def calibrate_quantiles(model, held_out, quantiles=CALIBRATED_QUANTILES) -> str:
    """Return ``q:level`` pairs: per q, the lowest level whose N^ covers a share q of held-out.

    model: a trained classifier (RlpModel or PrefillReadoutModel); held_out: Examples it did
    not train on (the val split). An answer is covered when the level's N^ (N_model for the
    top bucket) is >= its length (capped at N_model). The level is never below q; where no
    level of LEVEL_GRID reaches q the largest is kept. '' for the regression variant or no
    held-out prompts (the server then reads q itself).
    """
    import numpy as np
    if model.bucket_tokens is None or not held_out:
        return ''
    truth = np.array([min(e.n_tokens, model.n_model) for e in held_out], dtype=float)
    tokens = model.quantile_tokens(held_out, LEVEL_GRID)  # (levels, prompts)
    covered = dict(zip(LEVEL_GRID, (tokens >= truth).mean(axis=1).tolist()))
    pairs = []
    for q in quantiles:
        level = next((lv for lv in LEVEL_GRID if lv >= q and covered[lv] >= q), LEVEL_GRID[-1])
        pairs.append(f'{q}:{max(q, level)}')
    return ','.join(pairs)


def _vocab_size(model) -> int:
    """Return the token ids ``model``'s embedding takes (0: it reads no token ids)."""
    embedding = getattr(model.net, 'embed_tokens', None)
    return int(embedding.num_embeddings) if embedding is not None else 0


def export_onnx(model, path, model_key: str, embedding: str = 'int8') -> pathlib.Path:
    """Write ``model.net`` as ONNX to ``path``: input ``input_ids`` (1, n) int64 -> (1, C).

    embedding: ``int8`` (the embedding table quantized, see the module docstring) or
    ``float32``.
    """
    import onnx
    if embedding not in EMBEDDING_FORMATS:
        raise ValueError(f'embedding must be one of {EMBEDDING_FORMATS}, got {embedding!r}')
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    net = model.net.eval()
    example = torch.tensor([model.input_ids('Is the door open? Answer yes or no.')])
    n_tokens = torch.export.Dim('n_tokens', min=1, max=MAX_EXPORT_TOKENS)
    tmp = path.with_suffix('.tmp.onnx')
    torch.onnx.export(net, (example,), str(tmp), dynamo=True, input_names=[INPUT_NAME],
                      output_names=[OUTPUT_NAME], dynamic_shapes={'input_ids': {1: n_tokens}},
                      external_data=False, verbose=False)
    proto = onnx.load(str(tmp))
    metadata = rlp_metadata(model, model_key, embedding)
    for key, value in metadata.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = META_PREFIX + key, value
    onnx.save(proto, str(tmp))
    if embedding == 'int8':
        quantize_int8(tmp, path, op_types=['Gather'])
        tmp.unlink()
    else:
        tmp.replace(path)
    path.with_suffix('.json').write_text(json.dumps(metadata, indent=1))
    return path


def export_readout_onnx(model, path, model_key: str) -> pathlib.Path:
    """Write the prefill readout ``model.net`` as ONNX: ``pooled`` (1, 2 hidden) -> (1, C).

    The metadata is the RLP's (``n_layers`` is the target model's) with ``input`` =
    ``pooled`` and ``pool_layers`` (the layers the engine must pool, 1-based, comma list),
    and the model's ``extra_metadata`` (a decode readout's ``answer_pool``); no embedding
    table, so nothing is quantized.
    """
    import onnx
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    net = model.net.eval()
    example = torch.zeros(1, 2 * net.norm_weight.shape[0])  # (1, 2 x layers x hidden)
    tmp = path.with_suffix('.tmp.onnx')
    torch.onnx.export(net, (example,), str(tmp), dynamo=True, input_names=[POOLED_NAME],
                      output_names=[OUTPUT_NAME], external_data=False, verbose=False)
    proto = onnx.load(str(tmp))
    metadata = {**rlp_metadata(model, model_key), 'input': POOLED_NAME, 'embedding': 'none',
                'max_input_tokens': '0',
                'pool_layers': ','.join(map(str, model.pool_layers)),
                **getattr(model, 'extra_metadata', {})}
    for key, value in metadata.items():
        proto.metadata_props.add(key=META_PREFIX + key, value=value)
    onnx.save(proto, str(tmp))
    tmp.replace(path)
    path.with_suffix('.json').write_text(json.dumps(metadata, indent=1))
    return path


def quantize_int8(src, dst, op_types=None, per_channel: bool = False) -> pathlib.Path:
    """Write onnxruntime's dynamic int8 quantization of ONNX ``src`` to ``dst``; keep metadata.

    op_types: the node types whose weights are quantized (None = onnxruntime's default,
    MatMul and Gather among them); per_channel: one scale per output channel.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    # The dynamo export's value_info disagrees with onnx shape inference on one dimension
    # (1152 vs 256), which quantize_dynamic re-runs: hand it the graph without value_info.
    plain = onnx.load(str(src))
    del plain.graph.value_info[:]
    bare = pathlib.Path(dst).with_suffix('.bare.onnx')
    onnx.save(plain, str(bare))
    options = {'per_channel': per_channel}
    if op_types is not None:
        options['op_types_to_quantize'] = list(op_types)
    try:
        quantize_dynamic(str(bare), str(dst), weight_type=QuantType.QInt8, **options)
    finally:
        bare.unlink(missing_ok=True)
    proto = onnx.load(str(dst))
    have = {p.key for p in proto.metadata_props}
    for prop in plain.metadata_props:
        if prop.key not in have:
            proto.metadata_props.add(key=prop.key, value=prop.value)
    onnx.save(proto, str(dst))
    return pathlib.Path(dst)


def compare_with_torch(model, session, inputs: Sequence, input_name: str = INPUT_NAME) -> tuple:
    """Run torch and onnxruntime on each input once; return (max difference, same N^ count).

    inputs: token id lists (the RLP), or tensors ready for ``model.net`` (the prefill
    readout's pooled states, (1, W), with ``input_name`` POOLED_NAME).

    max difference: the largest |torch - onnxruntime| over the prompts of what the server
    reads: the bucket probabilities (softmax of the output) of a classifier, the output
    itself of the regression variant. (The ordinal head outputs log-probabilities; those of
    near-empty buckets are large negative numbers whose float rounding differs between
    runtimes without changing any probability.) same N^ count: the prompts on which both
    give the same N^ (N_max = N_model).
    """
    worst, same = 0.0, 0
    model.net.eval()
    with torch.inference_mode():
        for item in inputs:
            tensor = (item if torch.is_tensor(item)
                      else torch.tensor([list(item)], dtype=torch.long))
            expected = model.net(tensor)
            got = torch.from_numpy(session.run([OUTPUT_NAME], {input_name: tensor.numpy()})[0])
            same += model.output_tokens(expected) == model.output_tokens(got)
            if model.bucket_tokens is not None:
                expected, got = torch.softmax(expected, -1), torch.softmax(got, -1)
            worst = max(worst, float((expected - got).abs().max()))
    return worst, same


def train_prompts(max_prompts: int = MAX_PROMPTS) -> list:
    """Return up to ``max_prompts`` training-split prompts of the RLP corpus, spread evenly."""
    from timebill_ros.training.corpus import build_corpus
    prompts = [item.prompt for item in build_corpus() if item.split == 'train']
    step = max(1, len(prompts) // max_prompts)
    return prompts[::step][:max_prompts]


def export_train_lengths(onnx_path, encode, predictor_config, max_prompts: int = MAX_PROMPTS,
                         log=print) -> pathlib.Path:
    """Predict N^ of the training sample with the exported RLP; store it beside the file.

    encode(prompt) -> input_ids (the server's chat template). The predictor reads as the
    server's does (``predictor.*`` input clamps), with no N_max: RT-LM's offload threshold
    tau is the server's quantile of these (predictors/threshold.py).
    """
    from timebill_ros.predictors.onnx_rlp import OnnxRlpPredictor
    predictor = OnnxRlpPredictor.load(
        onnx_path, threads=predictor_config.threads, provider='cpu',
        min_input_tokens=predictor_config.min_input_tokens,
        max_input_tokens=predictor_config.max_input_tokens)
    prompts = train_prompts(max_prompts)
    lengths = [predictor.predict(p, encode(p), math.inf) for p in prompts]
    path = write_train_lengths(onnx_path, lengths)
    log(f'stored N^ of {len(prompts)} training prompts (for the offload threshold) in {path}')
    return path
