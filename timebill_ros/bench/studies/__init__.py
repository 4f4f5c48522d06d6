"""The studies behind the figures the docs cite, one per module, run as ``timebill study NAME``.

A study module has a ``main(argv) -> int`` and a docstring whose first line says what it
measures (``timebill study --list`` prints them). The docs name each figure's command as
``timebill study NAME [flags]``; the benchmark recipes in ``benchmarks/*.sh`` call them,
and ``benchmarks/results/`` keeps what they wrote.
"""

import importlib
import pkgutil


def names() -> list:
    """Return the study names: the modules of this package, sorted."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__))


def describe(name) -> str:
    """Return the first line of study ``name``'s docstring ('' without one).

    name: one of :func:`names` (what ``--list`` walks: each is imported, not looked up).
    """
    lines = (importlib.import_module(f'{__name__}.{name}').__doc__ or '').strip().splitlines()
    return lines[0] if lines else ''


def run(name, argv) -> int:
    """Run study ``name`` with its own flags ``argv``; return its exit status."""
    return _module(name).main(list(argv)) or 0


def _module(name):
    """Import study ``name`` (ValueError naming the known ones when there is none)."""
    if name not in names():
        raise ValueError(f'unknown study {name!r}; expected one of {names()}')
    return importlib.import_module(f'{__name__}.{name}')
