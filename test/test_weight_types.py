"""The weight types the kernels read are declared once per language; this holds them equal.

The C++ core (gguf_core.h: enum QType and the TYPES_HELP message), the Python kernel binding
(engine/kernels: QTYPES, KQUANTS) and the K-quant repacker (engine/kquants.py: SOURCES) must
name the same ids; the file's own ids must be gguf's (GGMLQuantizationType).
"""

import re

import gguf

from timebill_ros.engine import kernels, kquants


def _cpp_enum():
    text = kernels.CORE.read_text(encoding='utf-8')
    body = re.search(r'enum QType : int64_t \{([^}]*)\}', text).group(1)
    return {name: int(value) for name, value in re.findall(r'(\w+) = (\d+)', body)}


def _cpp_help():
    text = kernels.CORE.read_text(encoding='utf-8')
    return re.search(r'TYPES_HELP =\s*((?:"[^"]*"\s*)+);', text).group(1)


def test_the_cpp_enum_is_the_python_table():
    python = {**kernels.QTYPES, **{f'{name}_R': rid for name, rid in kernels.KQUANTS.items()}}
    assert _cpp_enum() == python


def test_the_file_types_are_gguf_ids_and_the_repacked_ones_follow_them():
    for name, type_id in kernels.QTYPES.items():
        assert gguf.GGMLQuantizationType[name].value == type_id
    for ggml_id, (name, repacked, _) in kquants.SOURCES.items():
        assert gguf.GGMLQuantizationType[name].value == ggml_id
        assert kernels.KQUANTS[name] == repacked == 100 + ggml_id
    assert set(kquants.GGML_IDS) == set(kernels.KQUANTS)


def test_the_error_message_lists_every_type():
    message = _cpp_help()
    assert all(f'{name} = {type_id}' in message for name, type_id in kernels.QTYPES.items())
    assert all(str(repacked) in message and name in message
               for name, repacked in kernels.KQUANTS.items())
