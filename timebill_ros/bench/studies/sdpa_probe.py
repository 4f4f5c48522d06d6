"""Decoding steps on a GPU with and without torch's cuDNN attention (docs/gpu.md, fourth run).

    timebill study sdpa_probe TOKENIZER_DIR [--keep-cudnn] [--decode-weights float32]

A random-weight model of the embedded model's shape (TOKENIZER_DIR holds its config.json and
tokenizer files, e.g. the converted embedded model's directory in the cache) saved to a temp
directory and served by LlmEngine in float16 on ``cuda``. 64-token answers from prompts of
lengths seen and never seen before, in this thread and in new ones. The engine turns the cuDNN
backend off on a CUDA device (engine.forward.avoid_cudnn_attention); ``--keep-cudnn`` turns it
back on after the load, to time what the engine avoids. Then one answer under torch's profiler
(top ops by CPU time) and three prefills of 1k-4k tokens.
"""

import argparse
import sys
import tempfile
import threading
import time

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from timebill_ros.config import EngineConfig, EvictionConfig, PrefixCacheConfig
from timebill_ros.engine import LlmEngine
from timebill_ros.engine.stopping import StopCriteria

N_TOKENS = 64


def _ids(n_prompt):
    generator = torch.Generator().manual_seed(n_prompt)
    return torch.randint(100, 40000, (n_prompt,), generator=generator).tolist()


def _decode_s(engine, n_prompt):
    with torch.inference_mode():
        state = engine.prefill(_ids(n_prompt), StopCriteria())
        torch.cuda.synchronize()
        begin = time.perf_counter()
        out = engine.decode(state, N_TOKENS, StopCriteria())
        torch.cuda.synchronize()
    return len(out.token_ids), time.perf_counter() - begin


def _run(engine, label, n_prompt, new_thread=False):
    box = []
    if new_thread:
        thread = threading.Thread(target=lambda: box.append(_decode_s(engine, n_prompt)))
        thread.start()
        thread.join()
    else:
        box.append(_decode_s(engine, n_prompt))
    n_tokens, seconds = box[0]
    print(f'{label:34s} prompt {n_prompt:4d}: {n_tokens} tokens '
          f'{1e3 * seconds / n_tokens:6.1f} ms/token', flush=True)


def main(argv=None):
    """Print ms/token of each case, the profiled ops and the prefills."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('tokenizer_dir')
    parser.add_argument('--keep-cudnn', action='store_true')
    parser.add_argument('--decode-weights', default='float32')
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit('sdpa_probe: torch sees no CUDA device')
    model_dir = tempfile.mkdtemp(prefix='sdpa_probe_')
    torch.manual_seed(0)
    config = LlamaConfig.from_pretrained(args.tokenizer_dir)
    LlamaForCausalLM(config).to(torch.float16).save_pretrained(model_dir)
    AutoTokenizer.from_pretrained(args.tokenizer_dir).save_pretrained(model_dir)
    engine = LlmEngine(EngineConfig(model_path=model_dir, device='cuda', dtype='float16',
                                    decode_weights=args.decode_weights, threads=2),
                       EvictionConfig(), prefix_cache=PrefixCacheConfig(enabled=False))
    if args.keep_cudnn:
        torch.backends.cuda.enable_cudnn_sdp(True)
    print(f'cuDNN attention enabled: {torch.backends.cuda.cudnn_sdp_enabled()}', flush=True)
    for label, n_prompt, new_thread in (
            ('this thread, first', 100, False), ('this thread, lengths seen', 100, False),
            ('this thread, new lengths', 137, False), ('new thread, lengths seen', 100, True),
            ('new thread, new lengths', 173, True), ('this thread, new lengths', 199, False)):
        _run(engine, label, n_prompt, new_thread)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        _run(engine, 'profiled, new lengths', 411)
    print(prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=6,
                                    max_name_column_width=50))
    with torch.inference_mode():
        for n_prompt in (1000, 2000, 4000):
            for repeat in range(2):
                torch.cuda.synchronize()
                begin = time.perf_counter()
                engine.prefill(_ids(n_prompt), StopCriteria())
                torch.cuda.synchronize()
                print(f'prefill {n_prompt} tokens ({engine.engine_config.prefill_chunk_tokens}'
                      f'-token chunks), run {repeat}: {time.perf_counter() - begin:.3f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
