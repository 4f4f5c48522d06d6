"""The plugin families' registry: one line of names per family, one loader, one lookup.

A plugin is a class with a ``name`` in a family's package, one strategy per file (kvpress's
presses, nav2's behavior-tree plugins). Adding one is its file plus its name below: the
family's package loads every class whose ``name`` is listed (:func:`load`), and config
validates a parameter against the same names (config sits below both wings and cannot
import the plugins, so the names live here, below both too).
"""

import importlib
import pkgutil

# family -> names, in the order its registry lists them (each parameter's default is in
# config.py). The registry line of a new plugin is its name here.
NAMES = {
    'overrun policy': ('kill', 'skip_next', 'partial'),
    'admission policy': ('feasibility', 'none'),
    'scheduler policy': ('fifo', 'edf', 'luf', 'muf', 'slack', 'up'),
    'eviction scorer': ('snapkv', 'streaming_llm', 'knorm'),
    'backend': ('local', 'openai'),
    'length predictor': ('rlp', 'fallback'),
}
# family -> the package whose modules hold its plugins.
FAMILIES = {
    'overrun policy': 'timebill_ros.server.overrun',
    'admission policy': 'timebill_ros.server.admission',
    'scheduler policy': 'timebill_ros.server.scheduler',
    'eviction scorer': 'timebill_ros.engine.eviction',
    'backend': 'timebill_ros.server.backends',
    'length predictor': 'timebill_ros.predictors',
}


def load(family, base):
    """Return {name: class} of ``family``'s plugins, in :data:`NAMES` order.

    Imports every module of the family's package and keeps the subclasses of ``base``
    defined there whose ``name`` is listed. ImportError names a listed plugin that no
    module defines, or one that two classes claim.
    """
    if family not in NAMES:
        raise ValueError(f'unknown plugin family {family!r}; expected one of {sorted(NAMES)}')
    package = importlib.import_module(FAMILIES[family])
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f'{package.__name__}.{info.name}')
        for kind in vars(module).values():
            if (isinstance(kind, type) and issubclass(kind, base)
                    and kind.__module__ == module.__name__
                    and getattr(kind, 'name', None) in NAMES[family]):
                found.setdefault(kind.name, []).append(kind)
    for name in NAMES[family]:
        if len(found.get(name, ())) != 1:
            raise ImportError(f'{package.__name__} must define one {base.__name__} named '
                              f'{name!r}, found {len(found.get(name, ()))}')
    return {name: found[name][0] for name in NAMES[family]}


def choose(family, registry, name):
    """Return ``registry[name]``; raise ValueError naming the family and the known names.

    Every plugin family looks its names up here, so their errors read alike.
    """
    if name not in registry:
        raise ValueError(f'unknown {family} {name!r}; expected one of {sorted(registry)}')
    return registry[name]
