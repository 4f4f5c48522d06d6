"""How fast can a faithful one-token step get on this CPU? (issue 11's last alternatives).

The embedded model, one run, rounds interleaved so the machine's drift hits every row alike;
ms per decoding step of the forward alone (no stop checks or streaming), medians:
- ``transformers fp32``: today's reference engine (transformers' modules, DynamicCache);
- ``lean fp16 eager``: the server's default on an AVX2 CPU (FBGEMM fp16-weight GEMMs, fp32
  activations; greedy answers identical to fp32 in `timebill enginebench`);
- ``lean fp16 compiled``: the same step as one torch.compile graph (dynamic shapes, the
  FBGEMM call wrapped as a custom op since torch cannot trace it, every layer's KV written in
  place); the Kill / cancel check can then only run between steps;
- ``lean fp16 eager, row-split GEMMs``: the weights of the LM head and the MLP's gate/up
  packed as two row blocks run on two threads at once (FBGEMM keeps a one-token product on
  one thread whatever torch's thread count);
- ``fp16 weight streaming only``: the step's 120 GEMMs and the LM head alone, on the same
  packed weights, nothing else: the floor any step built on FBGEMM fp16 stays above; and the
  same with row-split blocks.
Also: the compile time, greedy agreement of the compiled step with the eager one, and the
step time the 2.5x bar of issue 11 asks for.

    timebill study decode_ceiling [--rounds 3] [--steps 24] [--out FILE.md]
"""

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from timebill_ros.config import EngineConfig, EvictionConfig
from timebill_ros.engine import LlmEngine
from timebill_ros.engine.lean_llama import LeanLlamaForward

BAR = 2.5  # issue 11: the default engine >= 2.5x today's at B = 1
SPLIT_BYTES = 3 << 20  # fp16 weights at least this big are split (LM head, gate/up)
_POOL = ThreadPoolExecutor(1)


@torch.library.custom_op('timebill_bench::fp16_linear', mutates_args=())
def fp16_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Run FBGEMM's fp16-weight GEMM as an op torch.compile can place in a graph."""
    return torch.fbgemm_linear_fp16_weight(x, packed, bias)


@fp16_linear.register_fake
def _(x, packed, bias):
    return x.new_empty((*x.shape[:-1], bias.shape[0]))


class _Split:
    """A lean _Linear whose fp16 GEMM runs as two row blocks on two threads at once."""

    def __init__(self, linear):
        self.parts, self.split = linear.parts, linear.split
        weight = torch.cat([w for w, _ in self.parts]).detach()
        half = weight.shape[0] // 2
        bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0])
                          for w, b in self.parts]).detach()
        self.blocks = [(torch.fbgemm_pack_gemm_matrix_fp16(w.contiguous()), b.contiguous())
                       for w, b in ((weight[:half], bias[:half]), (weight[half:], bias[half:]))]

    def gemm(self, x):
        """Return x W^T for the one-token step, both blocks at once."""
        other = _POOL.submit(torch.fbgemm_linear_fp16_weight, x, *self.blocks[1])
        first = torch.fbgemm_linear_fp16_weight(x, *self.blocks[0])
        return torch.cat([first, other.result()], -1)

    def __call__(self, x, step):
        """Return the outputs, one tensor per module (as lean_llama._Linear)."""
        if not step:
            return tuple(F.linear(x, w, b) for w, b in self.parts)
        y = self.gemm(x)
        return (y,) if len(self.split) == 1 else y.split(self.split, dim=-1)


def _split_forward(model):
    """Return a lean fp16 forward whose big GEMMs (>= SPLIT_BYTES) run row-split."""
    forward = LeanLlamaForward(model, torch.float16)
    if forward.lm_head.step_bytes >= SPLIT_BYTES:
        forward.lm_head = _Split(forward.lm_head)
    for layer in forward.layers:
        if layer.gate_up.step_bytes >= SPLIT_BYTES:
            layer.gate_up = _Split(layer.gate_up)
    return forward


def _linears(forward):
    layers = [(layer.qkv, layer.out, layer.gate_up, layer.down) for layer in forward.layers]
    return [lin for group in layers for lin in group] + [forward.lm_head]


def _call(linear, x):
    """Run one _Linear's one-token GEMM (split or not) on x, (1, 1, K)."""
    if isinstance(linear, _Split):
        return linear.gemm(x)
    return torch.fbgemm_linear_fp16_weight(x, linear.packed, linear.step_bias)


def _streaming_s(forward, steps):
    """Seconds of one step's GEMMs alone: every layer's four and the LM head."""
    linears = _linears(forward)
    inputs = [torch.zeros(1, 1, lin.parts[0][0].shape[1]) for lin in linears]
    start = time.perf_counter()
    for _ in range(steps):
        for linear, x in zip(linears, inputs):
            _call(linear, x)
    return (time.perf_counter() - start) / steps


def _compiled_step(forward, n_q_heads):
    """Return a torch.compile'd whole one-token step of ``forward`` (fp16 FBGEMM weights)."""
    def lin(linear, x):
        return fp16_linear(x, linear.packed, linear.step_bias)

    def norm(x, module):
        return F.rms_norm(x, module.weight.shape, module.weight, module.variance_epsilon)

    def step(token, position: int, keys, values, lengths):
        x = forward.embed(token)
        cos = forward.cos[position:position + 1].view(1, 1, 1, -1)
        sin = forward.sin[position:position + 1].view(1, 1, 1, -1)
        for i, layer in enumerate(forward.layers):
            head_dim, n = layer.head_dim, lengths[i]
            qkv = lin(layer.qkv, norm(x, layer.input_norm))
            n_kv = (qkv.shape[-1] - n_q_heads * head_dim) // 2
            q, k, v = qkv.split([n_q_heads * head_dim, n_kv, n_kv], dim=-1)
            qk = torch.cat((q, k), dim=-1).view(1, 1, -1, head_dim)
            qk = torch.addcmul(qk * cos, torch.matmul(qk, forward.rotate), sin).transpose(1, 2)
            keys[i][:, :, n:n + 1] = qk[:, n_q_heads:]
            values[i][:, :, n:n + 1] = v.view(1, 1, -1, head_dim).transpose(1, 2)
            attn = F.scaled_dot_product_attention(
                qk[:, :n_q_heads], keys[i][:, :, :n + 1], values[i][:, :, :n + 1],
                scale=layer.scaling, enable_gqa=True)
            x = x + lin(layer.out, attn.transpose(1, 2).reshape(1, 1, -1))
            gate, up = lin(layer.gate_up, norm(x, layer.post_norm)).chunk(2, dim=-1)
            x = x + lin(layer.down, F.silu(gate) * up)
        return lin(forward.lm_head, norm(x, forward.final_norm))[0, -1]

    compiled = torch.compile(step, dynamic=True)

    def run(token_id, position, cache):
        for i in range(cache.n_layers):
            if cache.lengths[i] + 1 > cache.capacity(i):
                cache._grow(i, cache.lengths[i] + 1)
        logits = compiled(torch.tensor([[token_id]]), position, cache.keys, cache.values,
                          list(cache.lengths))
        cache.lengths = [n + 1 for n in cache.lengths]
        return logits
    return run


def _decode(step, forward, prompt, n_steps):
    """Greedy-decode ``n_steps`` after ``prompt``; return (s/step, token ids)."""
    cache = forward.new_cache()
    token = int(forward.run(prompt, 0, cache, step=False).argmax())
    tokens, start = [], time.perf_counter()
    for offset in range(n_steps):
        token = int(step(token, len(prompt) + offset, cache).argmax())
        tokens.append(token)
    return (time.perf_counter() - start) / n_steps, tokens


def main(argv=None) -> int:
    """Run the comparison; print (and write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--steps', type=int, default=24)
    parser.add_argument('--kv', default='100,1000')
    parser.add_argument('--out', default='')
    args = parser.parse_args(argv)
    engine = LlmEngine.load(EngineConfig(forward='transformers'), EvictionConfig())
    model = engine.model
    from timebill_ros.engine.hf_forward import TransformersForward
    reference = TransformersForward(model)
    eager = LeanLlamaForward(model, torch.float16)
    split = _split_forward(model)
    start = time.perf_counter()
    compiled = _compiled_step(eager, model.config.num_attention_heads)
    with torch.inference_mode():
        _decode(compiled, eager, engine.random_ids(40), 3)
    compile_s = time.perf_counter() - start
    print(f'compile + 3 steps: {compile_s:.1f} s', flush=True)

    def step_of(forward):
        return lambda token, position, cache: forward.run([token], position, cache, step=True)
    rows = {'transformers fp32': (step_of(reference), reference),
            'lean fp16 eager': (step_of(eager), eager),
            'lean fp16 compiled': (compiled, eager),
            'lean fp16 eager, row-split GEMMs': (step_of(split), split)}
    kvs = [int(v) for v in args.kv.split(',')]
    times = {(name, kv): [] for name in list(rows) + ['streaming', 'streaming split']
             for kv in kvs}
    same = {}
    with torch.inference_mode():
        for kv in kvs:
            prompt = engine.random_ids(kv)
            for _ in range(args.rounds):
                for name, (step, forward) in rows.items():
                    seconds, tokens = _decode(step, forward, prompt, args.steps)
                    times[name, kv].append(seconds)
                    same.setdefault(name, []).append(tokens)
                times['streaming', kv].append(_streaming_s(eager, args.steps))
                times['streaming split', kv].append(_streaming_s(split, args.steps))
                print(kv, {k[0]: round(v[-1] * 1e3, 1) for k, v in times.items()
                           if k[1] == kv}, flush=True)
    text = _report(times, kvs, same, compile_s, args)
    print(text)
    if args.out:
        with open(args.out, 'w', encoding='utf-8') as handle:
            handle.write(text)
    return 0


def _report(times, kvs, same, compile_s, args) -> str:
    med = {key: statistics.median(values) * 1e3 for key, values in times.items()}
    names = [('transformers fp32', 'transformers fp32 (today\'s engine)'),
             ('lean fp16 eager', 'lean fp16 eager (default on AVX2)'),
             ('lean fp16 compiled', 'lean fp16, torch.compile whole step'),
             ('lean fp16 eager, row-split GEMMs', 'lean fp16 eager, row-split GEMMs'),
             ('streaming', 'fp16 weight streaming only (GEMMs, FBGEMM)'),
             ('streaming split', 'fp16 weight streaming only, row-split GEMMs')]
    head = ' | '.join(f'ms/step @{kv} KV | x today @{kv}' for kv in kvs)
    lines = ['# One-token step: what is left to gain (smollm2-135m-instruct, '
             f'{torch.get_num_threads()} threads)', '',
             f'Command: `timebill study decode_ceiling --rounds {args.rounds} --steps '
             f'{args.steps} --kv {args.kv}`; medians of interleaved rounds.', '',
             f'| step | {head} |', '|---' * (1 + 2 * len(kvs)) + '|']
    for key, label in names:
        cells = ' | '.join(
            f'{med[key, kv]:.1f} | {med["transformers fp32", kv] / med[key, kv]:.2f}x'
            for kv in kvs)
        lines.append(f'| {label} | {cells} |')
    bar = ', '.join(f'{med["transformers fp32", kv] / BAR:.1f} ms @{kv} KV' for kv in kvs)
    reference = same['lean fp16 eager']
    agree = sum(a == b for a, b in zip(same['lean fp16 compiled'], reference))
    lines += ['', f'The {BAR}x bar of issue 11 asks for a step of at most {bar}.',
              f'Compile (torch.compile, dynamic shapes) + first 3 steps: {compile_s:.1f} s.',
              f'Greedy tokens of the compiled step equal the eager step\'s in {agree} of '
              f'{len(reference)} decodes of {args.steps} tokens.', '']
    return '\n'.join(lines)


if __name__ == '__main__':
    sys.exit(main())
