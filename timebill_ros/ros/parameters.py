"""Declare the node's parameters from the config dataclasses and read them back."""

from rcl_interfaces.msg import ParameterDescriptor

from timebill_ros import params


def declare_and_read(node):
    """Declare every ``group.field`` parameter with its default; return a ServerConfig."""
    flat = {}
    for name, default in params.defaults().items():
        group = name.split('.')[0]
        descriptor = ParameterDescriptor(description=f'see docs/parameters.md, group {group}')
        flat[name] = node.declare_parameter(name, default, descriptor).value
    return params.config_from_flat(flat)
