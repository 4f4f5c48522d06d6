"""Launch the timebill_ros action server (``timebill serve``) on a ROS 2 install.

Usage::

    ros2 launch timebill_ros llm.launch.py
    ros2 launch timebill_ros llm.launch.py namespace:=robot1 params_file:=/path/to/llm.yaml
    ros2 launch timebill_ros llm.launch.py autostart:=false   # a lifecycle manager brings it up

The node is a lifecycle node: with ``autostart`` (the default) it configures and activates
itself; without, it waits unconfigured for ``~/change_state`` (nav2's lifecycle_manager,
``ros2 lifecycle set /timebill configure``).

launch_ros appends ``--ros-args -r __node:=<node_name> [-r __ns:=<namespace>]
--params-file <params_file>`` after ``serve``; the ``serve`` subcommand hands those to rclpy.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue


def generate_launch_description():
    """Declare the launch arguments and the ``timebill serve`` node."""
    default_params = os.path.join(
        get_package_share_directory('timebill_ros'), 'config', 'llm.yaml')
    return LaunchDescription([
        DeclareLaunchArgument(
            'params_file', default_value=default_params,
            description='YAML file with the node parameters'),
        DeclareLaunchArgument(
            'namespace', default_value='',
            description='Namespace of the node (empty: none)'),
        DeclareLaunchArgument(
            'node_name', default_value='timebill',
            description='Name of the node'),
        DeclareLaunchArgument(
            'autostart', default_value='true',
            description='Configure and activate the lifecycle node at start'),
        Node(
            package='timebill_ros',
            executable='timebill',
            name=LaunchConfiguration('node_name'),
            namespace=LaunchConfiguration('namespace'),
            arguments=['serve'],
            parameters=[LaunchConfiguration('params_file'), {
                'ros.autostart': ParameterValue(LaunchConfiguration('autostart'),
                                                value_type=bool)}],
            output='screen',
            emulate_tty=True,
        ),
    ])
