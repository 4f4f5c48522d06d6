"""Configuration: YAML ``ros__parameters`` or ROS parameters -> frozen dataclasses.

Parameter names are ``<group>.<field>``, matching the dataclasses in ``config.py``
(``engine.threads`` -> ``ServerConfig.engine.threads``). This is the one place that maps them.
"""

import dataclasses

import yaml

from timebill_ros.config import ServerConfig


def groups():
    """Return {group name: dataclass type} for every parameter group."""
    return {f.name: f.default_factory for f in dataclasses.fields(ServerConfig)}


def defaults():
    """Return {'group.field': default value} for every parameter."""
    flat = {}
    for group, cls in groups().items():
        for field in dataclasses.fields(cls):
            flat[f'{group}.{field.name}'] = getattr(cls(), field.name)
    return flat


def _coerce(name, value, default):
    """Check a parameter's type against its default's; ints are accepted for floats."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise TypeError(f'parameter {name} must be a bool, got {value!r}')
        return value
    if isinstance(default, tuple):  # a string array (e.g. prefix_cache.pin)
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or any(
                not isinstance(item, str) for item in value):
            raise TypeError(f'parameter {name} must be a list of strings, got {value!r}')
        return tuple(value)
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f'parameter {name} must be a number, got {value!r}')
        return float(value)
    if not isinstance(value, type(default)) or isinstance(value, bool):
        raise TypeError(
            f'parameter {name} must be {type(default).__name__}, got {value!r}')
    return value


def config_from_flat(flat):
    """Build a ServerConfig from {'group.field': value}; unknown names raise ValueError."""
    known = defaults()
    unknown = sorted(set(flat) - set(known))
    if unknown:
        raise ValueError(f'unknown parameter(s): {", ".join(unknown)}')
    values = {group: {} for group in groups()}
    for name, value in flat.items():
        group, field = name.split('.', 1)
        values[group][field] = _coerce(name, value, known[name])
    return ServerConfig(**{group: cls(**values[group]) for group, cls in groups().items()})


def flatten(tree, prefix=''):
    """Flatten nested dicts to dotted names: {'engine': {'threads': 2}} -> engine.threads."""
    flat = {}
    for key, value in tree.items():
        name = f'{prefix}{key}'
        if isinstance(value, dict):
            flat.update(flatten(value, name + '.'))
        else:
            flat[name] = value
    return flat


def load_yaml(path, node_name='timebill'):
    """Read a ROS 2 params file and return {'group.field': value} for ``node_name``.

    Sections ``/**``, ``<node_name>`` and ``/<node_name>`` (and namespaced ``/ns/<node_name>``)
    are merged in file order; each holds a ``ros__parameters`` mapping.
    """
    with open(path, encoding='utf-8') as stream:
        document = yaml.safe_load(stream) or {}
    if not isinstance(document, dict):
        raise ValueError(f'{path}: expected a mapping of node names to ros__parameters')
    flat = {}
    for section, body in document.items():
        if section == '/**' or section.strip('/').split('/')[-1] == node_name:
            if not isinstance(body, dict) or 'ros__parameters' not in body:
                raise ValueError(f'{path}: section {section!r} has no ros__parameters')
            flat.update(flatten(body['ros__parameters']))
    return flat


def to_yaml(config, node_name='/**'):
    """Return a ROS 2 params YAML document for ``config`` (every parameter, dotted groups)."""
    tree = {group: {name: list(value) if isinstance(value, tuple) else value
                    for name, value in dataclasses.asdict(getattr(config, group)).items()}
            for group in groups()}
    return yaml.safe_dump({node_name: {'ros__parameters': tree}}, sort_keys=False)


def load_config(params_file=None, overrides=()):
    """Return the ServerConfig of a params file plus ``GROUP.FIELD=VALUE`` overrides.

    The loader every ``timebill`` verb shares: ``params_file`` (a ROS 2 params YAML, or None
    for the defaults), then each override in order, its value parsed as YAML.
    """
    flat = load_yaml(params_file) if params_file else {}
    for item in overrides:
        name, _, raw = item.partition('=')
        flat[name] = yaml.safe_load(raw)
    return config_from_flat(flat)
