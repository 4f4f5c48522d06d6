"""A corrupt GGUF header is refused with a ValueError naming what is wrong (issue 58).

The files are written byte by byte here (struct), each valid but for one field: a count or a
length near 2^64, an alignment of 0, dims whose product overflows int64, an unknown type. None
may raise anything but ValueError, nor read or copy past the file.
"""

import struct

import pytest
from gguf import GGMLQuantizationType, GGUFValueType

from timebill_ros.engine.gguf.file import GgufFile, MAX_STRING_BYTES

HUGE = (1 << 64) - 8


def _string(text: bytes, length=None) -> bytes:
    return struct.pack('<Q', len(text) if length is None else length) + text


def _file(tmp_path, keys=(), tensors=(), n_keys=None, n_tensors=None, data=b''):
    """Write a GGUF v3 file of ``keys`` (raw key-value bytes) and ``tensors`` (raw entries)."""
    header = b'GGUF' + struct.pack('<I', 3)
    header += struct.pack('<QQ', len(tensors) if n_tensors is None else n_tensors,
                          len(keys) if n_keys is None else n_keys)
    body = header + b''.join(keys) + b''.join(tensors)
    body += b'\0' * (-len(body) % 32) + data
    path = tmp_path / 'corrupt.gguf'
    path.write_bytes(body)
    return path


def _kv_string(key: bytes, value: bytes, length=None) -> bytes:
    return _string(key) + struct.pack('<I', GGUFValueType.STRING) + _string(value, length)


def _kv_u32(key: bytes, value: int) -> bytes:
    return _string(key) + struct.pack('<II', GGUFValueType.UINT32, value)


def _tensor(name: bytes, dims, kind=GGMLQuantizationType.F32, offset=0) -> bytes:
    return (_string(name) + struct.pack('<I', len(dims)) + struct.pack(f'<{len(dims)}Q', *dims)
            + struct.pack('<IQ', kind, offset))


ARCH = _kv_string(b'general.architecture', b'llama')


def test_a_well_formed_little_file_reads(tmp_path):
    path = _file(tmp_path, [ARCH], [_tensor(b'w', (4, 2))], data=b'\0' * 32)
    gguf = GgufFile(path)
    assert gguf.arch == 'llama' and gguf.shape('w') == (2, 4)


@pytest.mark.parametrize('case, message', [
    ('alignment 0', 'general.alignment must be a power of two, got 0'),
    ('alignment 3', 'general.alignment must be a power of two, got 3'),
    ('string length', 'general.architecture: string length 18446744073709551608'),
    ('long string', f'exceeds the {MAX_STRING_BYTES} bytes'),
    ('array count', 'tokenizer.ggml.scores: array count 18446744073709551608'),
    ('string array count', 'tokenizer.ggml.tokens: array count 18446744073709551608'),
    ('key count', 'metadata key count 18446744073709551608'),
    ('tensor count', 'tensor count 18446744073709551608'),
    ('dims overflow', r'tensor w: dims \(4294967296, 4294967296\) are not a F32 tensor'),
    ('zero dim', r'tensor w: dims \(4, 0\)'),
    ('block', r'tensor w: dims \(40, 2\) are not a Q4_0 tensor'),
    ('many dims', 'tensor w: 99 dimensions'),
    ('unknown type', 'tensor w: unknown GGML type 99'),
    ('unknown value type', 'general.foo: unknown value type 77'),
    ('past the end', 'tensor w: 32 bytes at offset 0 are not aligned to 32 or run past'),
])
def test_a_corrupt_header_is_a_value_error_naming_the_field(tmp_path, case, message):
    keys, tensors, counts = [ARCH], [_tensor(b'w', (4, 2))], {}
    data = b'\0' * 32
    if case.startswith('alignment'):
        keys.append(_kv_u32(b'general.alignment', int(case.split()[1])))
    elif case == 'string length':
        keys = [_kv_string(b'general.architecture', b'llama', length=HUGE)]
    elif case == 'long string':
        data += b'x' * (MAX_STRING_BYTES + 16)
        keys = [_kv_string(b'general.architecture', b'llama', length=MAX_STRING_BYTES + 1)]
    elif case == 'array count':
        keys.append(_string(b'tokenizer.ggml.scores')
                    + struct.pack('<IIQ', GGUFValueType.ARRAY, GGUFValueType.FLOAT32, HUGE))
    elif case == 'string array count':
        keys.append(_string(b'tokenizer.ggml.tokens')
                    + struct.pack('<IIQ', GGUFValueType.ARRAY, GGUFValueType.STRING, HUGE))
    elif case == 'key count':
        counts['n_keys'] = HUGE
    elif case == 'tensor count':
        counts['n_tensors'] = HUGE
    elif case == 'dims overflow':
        tensors = [_tensor(b'w', (1 << 32, 1 << 32))]
    elif case == 'zero dim':
        tensors = [_tensor(b'w', (4, 0))]
    elif case == 'block':
        tensors = [_tensor(b'w', (40, 2), GGMLQuantizationType.Q4_0)]
    elif case == 'many dims':
        tensors = [_string(b'w') + struct.pack('<I', 99)]
    elif case == 'unknown type':
        tensors = [_string(b'w') + struct.pack('<I2QIQ', 2, 4, 2, 99, 0)]
    elif case == 'unknown value type':
        keys.append(_string(b'general.foo') + struct.pack('<I', 77))
    elif case == 'past the end':
        data = b''
    path = _file(tmp_path, keys, tensors, data=data, **counts)
    with pytest.raises(ValueError, match=message):
        GgufFile(path)


# --- fuzz: truncations, byte flips and a corrupt real file ---------------------------------------
def _little(tmp_path):
    """Return the bytes of a little valid file: two keys, an array, two tensors and data."""
    scores = (_string(b'tokenizer.ggml.scores')
              + struct.pack('<IIQ', GGUFValueType.ARRAY, GGUFValueType.FLOAT32, 3)
              + struct.pack('<3f', 0.5, 1.5, 2.5))
    path = _file(tmp_path, [ARCH, scores],
                 [_tensor(b'w', (4, 2)), _tensor(b'v', (8,), offset=32)], data=b'\1' * 64)
    raw = path.read_bytes()
    GgufFile(path)  # valid as written
    return raw


def test_every_truncation_is_a_value_error(tmp_path):
    raw = _little(tmp_path)
    path = tmp_path / 'cut.gguf'
    for size in range(len(raw)):  # 0 bytes, inside the magic, counts, keys, tensors, data
        path.write_bytes(raw[:size])
        with pytest.raises(ValueError, match='cut.gguf|engine.model_path'):
            GgufFile(path)


def test_every_flipped_header_byte_reads_or_is_a_value_error(tmp_path):
    raw = _little(tmp_path)
    path = tmp_path / 'flip.gguf'
    header = len(raw) - 64
    refused = 0
    for at in range(header):
        for mask in (0x01, 0x80, 0xFF):
            flipped = bytearray(raw)
            flipped[at] ^= mask
            path.write_bytes(bytes(flipped))
            try:
                GgufFile(path)
            except ValueError as exc:
                assert 'flip.gguf' in str(exc)
                refused += 1
    assert refused > header  # most flips break it; none raises anything else


def test_a_corrupt_real_file_is_refused_within_64_mb(tmp_path):
    """The embedded GGUF with corrupt fields: each a ValueError, peak RSS <= 64 MB above.

    The parses run in one child process that measures its own peak RSS around them (a
    corrupt string length once copied and decoded the rest of a 98 MB file, +540 MB).
    """
    import json
    import subprocess
    import sys

    from timebill_ros.engine.model_source import embedded_gguf_path
    source = embedded_gguf_path()
    whole = source.read_bytes()
    first_key = 4 + 4 + 8 + 8  # magic, version, tensor count, key count
    size = len(whole)
    key_length = struct.unpack_from('<Q', whole, first_key)[0]
    value_type_at = first_key + 8 + key_length
    cases = {
        'key length past the file': (first_key, struct.pack('<Q', size - 100)),
        'key length near 2^64': (first_key, struct.pack('<Q', HUGE)),
        'key count': (16, struct.pack('<Q', size)),
        'tensor count': (8, struct.pack('<Q', size // 8)),
        'version': (4, struct.pack('<I', 7)),
        'magic': (0, b'GGUG'),
        'value type': (value_type_at, struct.pack('<I', 1234)),
        'string value length': (value_type_at + 4, struct.pack('<Q', size - 200)),
    }
    paths = []
    for i, (at, value) in enumerate(cases.values()):
        raw = bytearray(whole)
        raw[at:at + len(value)] = value
        paths.append(tmp_path / f'corrupt_{i}.gguf')
        paths[-1].write_bytes(bytes(raw))
    del whole, raw
    # VmHWM (peak RSS) is reset after the imports (clear_refs 5), so the peak measured is
    # the parses' own, not the imports'.
    script = ('import json, sys\n'
              'from timebill_ros.engine.gguf.file import GgufFile\n'
              'def status(field):\n'
              '    for line in open("/proc/self/status"):\n'
              '        if line.startswith(field):\n'
              '            return int(line.split()[1]) / 1024\n'
              'open("/proc/self/clear_refs", "w").write("5")\n'
              'base = status("VmRSS:")\n'
              'out = []\n'
              'for path in sys.argv[1:]:\n'
              '    try:\n'
              '        GgufFile(path)\n'
              '        out.append("READ")\n'
              '    except ValueError as exc:\n'
              '        out.append(f"ValueError {exc}")\n'
              'print(json.dumps({"results": out, "peak_mb": status("VmHWM:") - base}))\n')
    done = subprocess.run([sys.executable, '-c', script, *map(str, paths)],
                          capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(done.stdout.splitlines()[-1])
    for case, path, outcome in zip(cases, paths, report['results']):
        assert outcome.startswith('ValueError') and path.name in outcome, (case, outcome)
    assert report['peak_mb'] <= 64, report
