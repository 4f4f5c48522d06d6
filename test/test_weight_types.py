"""The weight types the kernels read are declared once per language; this holds them equal.

The C++ core (gguf_core.h: enum QType and the TYPES_HELP message) and the Python kernel binding
(engine/kernels: QTYPES) must name the same ids, and those must be gguf's
(GGMLQuantizationType): the kernels read every type as the file holds it.
"""

import re

import gguf

from timebill_ros.engine import kernels


def _cpp_enum():
    text = kernels.CORE.read_text(encoding='utf-8')
    body = re.search(r'enum QType : int64_t \{([^}]*)\}', text).group(1)
    return {name: int(value) for name, value in re.findall(r'(\w+) = (\d+)', body)}


def _cpp_help():
    text = kernels.CORE.read_text(encoding='utf-8')
    return re.search(r'TYPES_HELP =\s*((?:"[^"]*"\s*)+);', text).group(1)


def test_the_cpp_enum_is_the_python_table():
    assert _cpp_enum() == kernels.QTYPES


def test_the_types_are_gguf_ids():
    for name, type_id in kernels.QTYPES.items():
        assert gguf.GGMLQuantizationType[name].value == type_id
    assert set(kernels.KQUANTS) < set(kernels.QTYPES)


def test_the_error_message_lists_every_type():
    message = _cpp_help()
    assert all(f'{name} = {type_id}' in message for name, type_id in kernels.QTYPES.items())
