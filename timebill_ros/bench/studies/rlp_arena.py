"""Resident memory the RLP's onnxruntime session keeps after a long prompt (docs/reliability.md).

    timebill study rlp_arena [RLP.onnx]

One process per mode (the arena is per process): the CPU arena as onnxruntime leaves it, no
arena, and the arena given back after each call (``memory.enable_memory_arena_shrinkage``, what
OnnxRlpPredictor.run sets). Each runs a 4000-token prompt, then two of 300 tokens, and prints
seconds and RSS growth (MB) after each call.
"""

import os
import subprocess
import sys
import time

MODES = ('default', 'no-arena', 'shrink')
DEFAULT = '~/.cache/timebill_ros/rlp/smollm2-135m-instruct__rlp.onnx'


def _one(path, mode):
    import numpy as np
    import onnxruntime
    import psutil
    from timebill_ros.predictors.onnx_rlp import ARENA_SHRINKAGE
    process = psutil.Process()
    before = process.memory_info().rss
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.enable_cpu_mem_arena = mode != 'no-arena'
    session = onnxruntime.InferenceSession(path, options, providers=['CPUExecutionProvider'])
    run_options = onnxruntime.RunOptions()
    if mode == 'shrink':
        run_options.add_run_config_entry(*ARENA_SHRINKAGE)
    cells = []
    for n_tokens in (4000, 300, 300):
        begin = time.perf_counter()
        session.run(None, {'input_ids': np.ones((1, n_tokens), dtype=np.int64)}, run_options)
        grown = (process.memory_info().rss - before) / 1e6
        cells.append(f'{n_tokens} tokens: {time.perf_counter() - begin:.2f} s, +{grown:.0f} MB')
    print(f'| {mode} | ' + ' | '.join(cells) + ' |')


def main(argv=None):
    """Run each mode in a child process and print one table row each."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ['--one']:
        _one(argv[1], argv[2])
        return 0
    path = os.path.expanduser(argv[0] if argv else DEFAULT)
    print('| arena | first call | second | third |\n|---|---|---|---|')
    for mode in MODES:
        subprocess.run([sys.executable, __file__, '--one', path, mode], check=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
