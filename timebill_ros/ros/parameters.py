"""Declare the node's parameters from the config dataclasses and read them back."""

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.parameter import Parameter

from timebill_ros import params


def declare_and_read(node):
    """Declare every ``group.field`` parameter with its default; return a ServerConfig."""
    flat = {}
    for name, default in params.defaults().items():
        group = name.split('.')[0]
        descriptor = ParameterDescriptor(description=f'see docs/parameters.md, group {group}')
        if isinstance(default, tuple):
            # A string array: declared by type (an empty default would read as a byte
            # array); unset, its value is None and the default applies.
            value = node.declare_parameter(name, Parameter.Type.STRING_ARRAY, descriptor).value
            flat[name] = default if value is None else tuple(value)
            continue
        flat[name] = node.declare_parameter(name, default, descriptor).value
    return params.config_from_flat(flat)
