"""Read a GGUF file's metadata and tensors: values as plain Python, tensors memory-mapped.

Why not ``gguf.GGUFReader`` (the ``gguf`` package is still the source of the format's
constants: value types, GGML types, block sizes): it keeps every element of every metadata
array as its own numpy views, ~680 MB of anonymous memory for Gemma 3's 262,144-token
vocabulary (measured: 719 MB resident after opening gemma-3-270m-q4_k_m.gguf, 73 MB once it
is deleted), which a robot computer with 8 GB shared between CPU and GPU cannot spare. This
reader keeps metadata as Python values (the vocabulary as one list of str, numbers as numpy
arrays), and the tensors as views of one read-only memory map whose pages
:meth:`GgufFile.release` gives back once the engine has copied the blocks.

Shapes: GGUF lists a matrix's dimensions innermost first; :meth:`GgufFile.tensor` returns the
rows as ``(N, row bytes)`` uint8 blocks (quantized types) or ``(N, K)`` arrays (F32 / F16 /
BF16 as uint16), N output rows of K weights, as the file holds them.
"""

import dataclasses
import math
import mmap
import pathlib
import struct
from typing import Any, Optional

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUF_DEFAULT_ALIGNMENT, GGUFValueType

MAGIC = b'GGUF'
# Scalar value types: struct format. Arrays of them are read with numpy in one go.
_SCALARS = {GGUFValueType.UINT8: '<B', GGUFValueType.INT8: '<b', GGUFValueType.UINT16: '<H',
            GGUFValueType.INT16: '<h', GGUFValueType.UINT32: '<I', GGUFValueType.INT32: '<i',
            GGUFValueType.FLOAT32: '<f', GGUFValueType.BOOL: '<?', GGUFValueType.UINT64: '<Q',
            GGUFValueType.INT64: '<q', GGUFValueType.FLOAT64: '<d'}
_DENSE = {'F32': np.float32, 'F16': np.float16, 'BF16': np.uint16}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies: GGML type, dimensions innermost first, byte offset and size."""

    type_name: str
    dims: tuple
    offset: int
    nbytes: int


MAX_STRING_BYTES = 16 << 20  # one metadata string (a chat template is ~10 KB), bytes
MAX_DIMS = 4  # GGML's tensors have at most four dimensions
# The fewest bytes an entry takes (key or name length + value type / dims count, ...): what a
# count read from the header is checked against before anything is read for it.
_MIN_KEY_BYTES, _MIN_TENSOR_BYTES, _MIN_STRING_BYTES = 8 + 4, 8 + 4 + 4 + 8, 8


class _Cursor:
    """Reads little-endian values from a buffer, advancing an offset.

    Every length and count read is checked against the bytes left (ValueError naming what was
    read), so a corrupt header is refused before it allocates or copies anything.
    """

    def __init__(self, buffer, offset: int = 0):
        self.buffer, self.offset = buffer, offset

    @property
    def left(self) -> int:
        """Bytes after the offset."""
        return len(self.buffer) - self.offset

    def scalar(self, fmt: str):
        value = struct.unpack_from(fmt, self.buffer, self.offset)[0]
        self.offset += struct.calcsize(fmt)
        return value

    def count(self, what: str, fmt: str, min_bytes: int) -> int:
        """Read a count of ``what`` whose entries take at least ``min_bytes`` bytes each."""
        at, value = self.offset, self.scalar(fmt)
        if value * min_bytes > self.left:
            raise ValueError(f'{what} count {value} at byte {at} does not fit the '
                             f'{self.left} bytes left in the file')
        return value

    def string(self, what: str = 'string') -> str:
        at, length = self.offset, self.scalar('<Q')
        if length > min(self.left, MAX_STRING_BYTES):
            raise ValueError(f'{what} length {length} at byte {at} exceeds the '
                             f'{min(self.left, MAX_STRING_BYTES)} bytes it may take')
        raw = self.buffer[self.offset:self.offset + length]
        self.offset += length
        return bytes(raw).decode('utf-8', errors='replace')

    def value(self, kind: int, key: str = ''):
        kind = _value_type(kind, key)
        if kind == GGUFValueType.STRING:
            return self.string(f'{key}: string')
        if kind == GGUFValueType.ARRAY:
            item = _value_type(self.scalar('<I'), key)
            if item in _SCALARS:
                dtype = np.dtype(_SCALARS[item][1:]).newbyteorder('<')
                count = self.count(f'{key}: array', '<Q', dtype.itemsize)
                data = np.frombuffer(self.buffer, dtype, count, self.offset).copy()
                self.offset += count * dtype.itemsize
                return data.tolist() if item == GGUFValueType.BOOL else data
            count = self.count(f'{key}: array', '<Q', _MIN_STRING_BYTES)
            return [self.value(item, key) for _ in range(count)]
        return self.scalar(_SCALARS[kind])


def _value_type(kind: int, key: str) -> GGUFValueType:
    """Return GGUF value type ``kind``; ValueError naming the key for an unknown one."""
    try:
        return GGUFValueType(kind)
    except ValueError:
        raise ValueError(f'{key or "metadata"}: unknown value type {kind}') from None


class GgufFile:
    """One GGUF file: ``arch``, metadata by key, tensors by name (memory-mapped, read-only)."""

    def __init__(self, path):
        """Open ``path`` (ValueError when it is not a readable GGUF file)."""
        self.path = pathlib.Path(path).expanduser()
        if not self.path.is_file():
            raise ValueError(f'engine.model_path {str(path)!r} is not a file')
        try:
            with open(self.path, 'rb') as handle:
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            self.metadata, self.tensors = self._parse()
        except (ValueError, struct.error, OSError, UnicodeError, IndexError,
                OverflowError) as exc:
            raise ValueError(f'{self.path} is not a readable GGUF file: '
                             f'{type(exc).__name__}: {exc}') from exc
        self.arch = str(self.get('general.architecture', ''))

    def _parse(self):
        """Return (metadata {key: value}, tensors {name: TensorInfo})."""
        cursor = _Cursor(self._map)
        if bytes(self._map[:4]) != MAGIC:
            raise ValueError('no GGUF magic')
        cursor.offset = 4
        version = cursor.scalar('<I')
        if version not in (2, 3):
            raise ValueError(f'GGUF version {version} (2 and 3 are read)')
        n_tensors = cursor.count('tensor', '<Q', _MIN_TENSOR_BYTES)
        n_keys = cursor.count('metadata key', '<Q', _MIN_KEY_BYTES)
        metadata = {}
        for _ in range(n_keys):
            key = cursor.string('metadata key')
            metadata[key] = cursor.value(cursor.scalar('<I'), key)
        infos = [_tensor_entry(cursor) for _ in range(n_tensors)]
        alignment = metadata.get('general.alignment', GGUF_DEFAULT_ALIGNMENT)
        if (not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1
                or alignment & (alignment - 1)):
            raise ValueError(f'general.alignment must be a power of two, got {alignment!r}')
        start = -(-cursor.offset // alignment) * alignment
        tensors = {}
        for name, kind, dims, offset in infos:
            nbytes = _tensor_bytes(name, kind, dims)
            if offset % alignment or start + offset + nbytes > len(self._map):
                raise ValueError(f'tensor {name}: {nbytes} bytes at offset {offset} are not '
                                 f'aligned to {alignment} or run past the end of the file')
            tensors[name] = TensorInfo(kind.name, dims, start + offset, nbytes)
        return metadata, tensors

    def get(self, key: str, default: Any = None) -> Any:
        """Return metadata ``key``'s value (str, number, bool, list or array), or ``default``."""
        return self.metadata.get(key, default)

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
        return self._info(name).type_name

    def shape(self, name: str) -> tuple:
        """Return tensor ``name``'s shape outermost first: (N, K) for a matrix."""
        return tuple(int(n) for n in reversed(self._info(name).dims))

    def tensor(self, name: str) -> np.ndarray:
        """Return tensor ``name``'s data as the file holds it (a read-only view of the map).

        Quantized: (N, row bytes) uint8; F32 / F16: (N, K) of that dtype; BF16: (N, K) uint16.
        """
        info = self._info(name)
        shape = self.shape(name)
        rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        if info.type_name in _DENSE:
            data = np.frombuffer(self._map, _DENSE[info.type_name], info.nbytes
                                 // np.dtype(_DENSE[info.type_name]).itemsize, info.offset)
            return data.reshape(shape if len(shape) > 1 else (shape[0],))
        data = np.frombuffer(self._map, np.uint8, info.nbytes, info.offset)
        return data.reshape(rows, -1)

    def vector(self, name: str) -> np.ndarray:
        """Return an F32 / F16 / BF16 tensor (a norm's weight) as float32, own memory."""
        kind = self.type_name(name)
        data = self.tensor(name)
        if kind == 'BF16':
            return (data.astype(np.uint32) << 16).view(np.float32).reshape(data.shape)
        if kind in _DENSE:
            return np.array(data, dtype=np.float32)
        raise ValueError(f'{self.path.name}: {name} is {kind}, not a float vector')

    def release(self) -> None:
        """Give the map's resident pages back (after the blocks were copied); reads still work.

        The pages are the file's own (clean): the kernel reads them again if touched.
        """
        if hasattr(self._map, 'madvise') and hasattr(mmap, 'MADV_DONTNEED'):
            self._map.madvise(mmap.MADV_DONTNEED)

    def _info(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise ValueError(f'{self.path.name} has no tensor {name}')
        return info

    @property
    def size_bytes(self) -> int:
        """The file's size, bytes."""
        return self.path.stat().st_size

    def describe(self) -> str:
        """One line: file, architecture, tensors by type."""
        counts = {}
        for info in self.tensors.values():
            counts[info.type_name] = counts.get(info.type_name, 0) + 1
        types = ', '.join(f'{n} {k}' for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        return f'{self.path.name}: {self.arch}, {types}'


def _tensor_entry(cursor: _Cursor) -> tuple:
    """Read one tensor entry: (name, GGML type, dims innermost first, offset)."""
    name = cursor.string('tensor name')
    n_dims = cursor.scalar('<I')
    if not 1 <= n_dims <= MAX_DIMS:
        raise ValueError(f'tensor {name}: {n_dims} dimensions (1 to {MAX_DIMS} are read)')
    dims = tuple(cursor.scalar('<Q') for _ in range(n_dims))
    code, offset = cursor.scalar('<I'), cursor.scalar('<Q')
    try:
        kind = GGMLQuantizationType(code)
    except ValueError:
        raise ValueError(f'tensor {name}: unknown GGML type {code}') from None
    return name, kind, dims, offset


def _tensor_bytes(name: str, kind: GGMLQuantizationType, dims: tuple) -> int:
    """Return the bytes a tensor of ``dims`` takes in ``kind``; ValueError when impossible.

    Python integers: a product that would overflow int64 is seen, not wrapped.
    """
    if kind not in GGML_QUANT_SIZES:
        raise ValueError(f'tensor {name}: GGML type {kind.name} has no block size')
    block, size = GGML_QUANT_SIZES[kind]
    n_values = math.prod(dims)
    if not dims or min(dims) < 1 or n_values >= 1 << 62 or dims[0] % block:
        raise ValueError(f'tensor {name}: dims {dims} are not a {kind.name} tensor')
    return n_values // block * size


def chat_template(gguf: GgufFile) -> Optional[str]:
    """Return the file's chat template (``tokenizer.chat_template``), or None."""
    template = gguf.get('tokenizer.chat_template')
    return template if isinstance(template, str) and template.strip() else None
