"""docs/parameters.md is made from the code (``timebill params-doc``) and documents every field."""

import dataclasses
import pathlib

import pytest
import yaml

from timebill_ros import params
from timebill_ros.cli import build_parser, params_doc

PAGE = pathlib.Path(__file__).resolve().parents[1] / 'docs' / 'parameters.md'


@dataclasses.dataclass(frozen=True)
class Documented:
    """A test group (group ``toy``).

    size: how many, tokens; a description
        on two lines.
    lo / hi: the bounds | both ends, ``<x>`` and alpha* <= <b>.
    """

    size: int = 3
    lo: float = 0.5
    hi: float = 1.0


@dataclasses.dataclass(frozen=True)
class Undocumented:
    """A test group with a field missing from its docstring.

    size: how many.
    """

    size: int = 3
    secret_knob: bool = False


def _rows(page):
    """Return {'group.field': (type, default, description)} from the page's tables."""
    rows = {}
    for line in page.splitlines():
        if line.startswith('| `'):
            cells = [cell.strip() for cell in line.strip('|').split(' | ')]
            rows[cells[0].strip('`')] = (cells[1], cells[2].strip('`'), cells[3])
    return rows


def test_committed_page_is_the_rendered_one():
    committed = PAGE.read_text(encoding='utf-8') if PAGE.exists() else ''
    assert committed == params_doc.render(), (
        'docs/parameters.md is stale: run `timebill params-doc` '
        '(python -m timebill_ros.cli params-doc) and commit it')


def test_render_is_deterministic():
    assert params_doc.render() == params_doc.render()


def test_every_field_is_in_the_page_with_its_default_and_a_description():
    page = params_doc.render()
    rows = _rows(page)
    names = []
    for group, cls in params.groups().items():
        assert f'## `{group}`' in page
        _, docs = params_doc.field_docs(cls)
        for field in dataclasses.fields(cls):
            name = f'{group}.{field.name}'
            names.append(name)
            assert name in rows, f'{name} missing from the page'
            type_name, default, description = rows[name]
            assert type_name == ('string[]' if field.type is tuple else field.type.__name__)
            # The default as written in YAML reads back as the code's default.
            want = params.defaults()[name]
            assert yaml.safe_load(default) == (list(want) if field.type is tuple else want), name
            assert description and docs[field.name], name
    assert sorted(rows) == sorted(names)


def test_every_real_field_has_its_own_docstring_entry():
    for cls in params.groups().values():
        _, docs = params_doc.field_docs(cls)
        assert sorted(docs) == sorted(f.name for f in dataclasses.fields(cls))
        assert all(text.strip() for text in docs.values()), cls.__name__


def test_entries_are_joined_and_shared_and_escaped():
    summary, docs = params_doc.field_docs(Documented)
    assert summary == 'A test group (group ``toy``).'
    assert docs['size'] == 'how many, tokens; a description on two lines.'
    assert docs['lo'] == docs['hi'] == 'the bounds | both ends, ``<x>`` and alpha* <= <b>.'
    assert params_doc._cell(docs['lo']) == (
        'the bounds \\| both ends, `<x>` and alpha\\* <= &lt;b>.')


def test_an_undocumented_field_raises_naming_it():
    with pytest.raises(ValueError, match='Undocumented: .*secret_knob'):
        params_doc.field_docs(Undocumented)


def test_render_fails_on_an_undocumented_parameter(monkeypatch):
    real = params.groups()
    monkeypatch.setattr(params, 'groups', lambda: {**real, 'toy': Undocumented})
    with pytest.raises(ValueError, match='secret_knob'):
        params_doc.render()
    monkeypatch.setattr(params, 'groups', lambda: {**real, 'toy': Documented})
    assert '| `toy.hi` | float | `1.0` |' in params_doc.render()


def test_an_entry_naming_no_field_raises():
    @dataclasses.dataclass(frozen=True)
    class Renamed:
        """A group whose docstring kept an old name.

        size: how many.
        old_name: gone.
        """

        size: int = 3

    with pytest.raises(ValueError, match='old_name'):
        params_doc.field_docs(Renamed)


def test_check_exit_codes_and_message(tmp_path, capsys):
    out = tmp_path / 'parameters.md'

    def run(*argv):
        args = build_parser().parse_args(['params-doc', '--out', str(out), *argv])
        return args.func(args, [])

    assert run('--check') == 1
    assert 'missing' in capsys.readouterr().out
    assert run() == 0
    assert out.read_text(encoding='utf-8') == params_doc.render()
    assert run('--check') == 0
    out.write_text(params_doc.render().replace('`kill`', '`partial`', 1), encoding='utf-8')
    assert run('--check') == 1
    message = capsys.readouterr().out
    assert f'{out} is stale: run `timebill params-doc --out {out}`' in message


def test_default_out_is_the_committed_page():
    args = build_parser().parse_args(['params-doc'])
    assert args.out == params_doc.DEFAULT_OUT == 'docs/parameters.md'
    assert not args.check
