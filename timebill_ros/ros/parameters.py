"""Declare the node's parameters from the config dataclasses and read them back."""

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.exceptions import ParameterUninitializedException
from rclpy.parameter import Parameter

from timebill_ros import params


def declare_parameters(node):
    """Declare every ``group.field`` parameter with its default (overrides apply)."""
    for name, default in params.defaults().items():
        group = name.split('.')[0]
        descriptor = ParameterDescriptor(description=f'see docs/parameters.md, group {group}')
        if isinstance(default, tuple):
            # A string array: declared by type (an empty default would read as a byte
            # array); unset, its value is None and the default applies.
            node.declare_parameter(name, Parameter.Type.STRING_ARRAY, descriptor)
            continue
        node.declare_parameter(name, default, descriptor)


def read_config(node):
    """Return a ServerConfig of the parameters' current values (ValueError names a bad one)."""
    flat = {}
    for name, default in params.defaults().items():
        try:
            value = node.get_parameter(name).value
        except ParameterUninitializedException:  # a string array left unset
            value = None
        if value is not None and isinstance(default, tuple):
            value = tuple(value)
        flat[name] = default if value is None else value
    return params.config_from_flat(flat)


def declare_and_read(node):
    """Declare every ``group.field`` parameter with its default; return a ServerConfig."""
    declare_parameters(node)
    return read_config(node)
