"""The GGUF kernels' GEMMs of one decoding step, by activation rows and threads.

    timebill study gguf_gemm_rows [--rounds 5]

Every matrix of the embedded model's layer 0 (Q4_1; the step multiplies by 30 such layers)
and the Q8_0 LM head, timed with 1 and 8 activation rows (a batch of 8 goals) on 1 and 2
threads; prints ms per step of GEMMs (layer 0 x 30 + the head), medians of the rounds.
"""

import argparse
import statistics
import time


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rounds', type=int, default=5)
    args = parser.parse_args(argv)
    import numpy as np
    import torch
    from gguf import GGUFReader

    from timebill_ros.engine import kernels
    from timebill_ros.engine.model_source import embedded_gguf_path
    gemm = kernels.load()
    tensors = [t for t in GGUFReader(embedded_gguf_path()).tensors
               if t.name.startswith('blk.0.') or t.name == 'token_embd.weight']
    tensors = [t for t in tensors if t.tensor_type.name in ('Q4_1', 'Q8_0')]
    # (name, type, blocks in the kernels' layout, K, N); a GGUF shape is (K, N)
    matrices = [(t.name, int(t.tensor_type),
                 gemm.pack(torch.from_numpy(np.array(t.data)), int(t.tensor_type),
                           int(t.shape[0])), int(t.shape[0]), int(t.shape[1])) for t in tensors]
    for rows in (1, 8):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            totals = []
            for _ in range(args.rounds):
                total = 0.0
                for name, qtype, blocks, k, n in matrices:
                    x = torch.randn(rows, k)
                    head = name == 'token_embd.weight'
                    reps = 3 if head else 20
                    start = time.perf_counter()
                    for _ in range(reps):
                        gemm.gemm(x, blocks, qtype, n, False)
                    total += (time.perf_counter() - start) / reps * (1 if head else 30)
                totals.append(total)
            print(f'{rows} row(s), {threads} thread(s): '
                  f'{statistics.median(totals) * 1e3:.2f} ms of GEMMs a step', flush=True)


if __name__ == '__main__':
    main()
