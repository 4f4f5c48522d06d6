"""Read a GGUF file's metadata and tensors (the ``gguf`` package's reader, memory-mapped).

Shapes: GGUF lists a matrix's dimensions innermost first; :meth:`GgufFile.tensor` returns the
rows as ``(N, row bytes)`` uint8 blocks (quantized types) or ``(N, K)`` arrays (F32 / F16 /
BF16), N output rows of K weights, as the file holds them.
"""

import pathlib
from typing import Any, Optional

import numpy as np


class GgufFile:
    """One GGUF file: ``arch``, metadata by key, tensors by name (memory-mapped, read-only)."""

    def __init__(self, path):
        """Open ``path`` (ValueError when it is not a readable GGUF file)."""
        from gguf import GGUFReader
        self.path = pathlib.Path(path).expanduser()
        if not self.path.is_file():
            raise ValueError(f'engine.model_path {str(path)!r} is not a file')
        try:
            self._reader = GGUFReader(self.path)
        except Exception as exc:  # gguf raises ValueError / struct errors on a bad file
            raise ValueError(f'{self.path} is not a readable GGUF file: '
                             f'{type(exc).__name__}: {exc}') from exc
        self.tensors = {t.name: t for t in self._reader.tensors}
        self.arch = str(self.get('general.architecture', ''))

    def get(self, key: str, default: Any = None) -> Any:
        """Return metadata ``key``'s value (str, number, bool or list), or ``default``."""
        field = self._reader.fields.get(key)
        if field is None:
            return default
        return field.contents()

    def arch_get(self, key: str, default: Any = None) -> Any:
        """Return ``<arch>.<key>`` (e.g. ``block_count``), or ``default``."""
        return self.get(f'{self.arch}.{key}', default)

    def require(self, key: str) -> Any:
        """Return ``<arch>.<key>``; ValueError naming the key when the file lacks it."""
        value = self.arch_get(key)
        if value is None:
            raise ValueError(f'{self.path.name} has no {self.arch}.{key}')
        return value

    def has(self, name: str) -> bool:
        """Return whether the file holds tensor ``name``."""
        return name in self.tensors

    def type_name(self, name: str) -> str:
        """Return tensor ``name``'s GGML type name (``Q4_K``, ``F32``, ...)."""
        return self._tensor(name).tensor_type.name

    def tensor(self, name: str) -> np.ndarray:
        """Return tensor ``name``'s data as the file holds it (a read-only memory map)."""
        return np.asarray(self._tensor(name).data)

    def shape(self, name: str) -> tuple:
        """Return tensor ``name``'s shape outermost first: (N, K) for a matrix."""
        return tuple(int(n) for n in reversed(self._tensor(name).shape))

    def vector(self, name: str) -> np.ndarray:
        """Return an F32 / F16 / BF16 tensor (a norm's weight) as float32, own memory."""
        data = self._tensor(name)
        kind = data.tensor_type.name
        if kind == 'F32':
            return np.array(data.data, dtype=np.float32)
        if kind == 'F16':
            return np.asarray(data.data).astype(np.float32)
        if kind == 'BF16':
            return _bf16_to_f32(np.asarray(data.data))
        raise ValueError(f'{self.path.name}: {name} is {kind}, not a float vector')

    def _tensor(self, name: str):
        tensor = self.tensors.get(name)
        if tensor is None:
            raise ValueError(f'{self.path.name} has no tensor {name}')
        return tensor

    @property
    def size_bytes(self) -> int:
        """The file's size, bytes."""
        return self.path.stat().st_size

    def describe(self) -> str:
        """One line: file, architecture, tensors by type."""
        counts = {}
        for tensor in self.tensors.values():
            counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
        types = ', '.join(f'{n} {k}' for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        return f'{self.path.name}: {self.arch}, {types}'


def _bf16_to_f32(data: np.ndarray) -> np.ndarray:
    """Return bf16 values (as the file's uint16 / raw bytes) as float32."""
    raw = np.ascontiguousarray(data).view(np.uint16)
    return (raw.astype(np.uint32) << 16).view(np.float32)


def chat_template(gguf: GgufFile) -> Optional[str]:
    """Return the file's chat template (``tokenizer.chat_template``), or None."""
    template = gguf.get('tokenizer.chat_template')
    return template if isinstance(template, str) and template.strip() else None
