"""Run the installed llm.launch.py through launch_ros and drive the lifecycle node it starts.

    python benchmarks/launch_check.py true|false     (the ``autostart`` launch argument)

Needs ``launch`` and ``launch_ros`` (a ROS 2 install has them; without one, as on the dev
machine, see benchmarks/results/launch_check.md for how they were put on PYTHONPATH). With
autostart false it configures and activates the node through ``~/change_state`` itself; then
it asks one goal with TimebillClient and stops the launch with SIGINT.
"""

import signal
import subprocess
import sys
import time

import rclpy
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetState

from timebill_ros.ros.client import TimebillClient

NODE = 'tb_launch'
LAUNCHER = '''
import sys
from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription, LaunchService
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
path = get_package_share_directory('timebill_ros') + '/launch/llm.launch.py'
service = LaunchService()
service.include_launch_description(LaunchDescription([IncludeLaunchDescription(
    PythonLaunchDescriptionSource(path),
    launch_arguments={'autostart': sys.argv[1], 'node_name': sys.argv[2]}.items())]))
sys.exit(service.run())
'''


def call(node, client, request):
    """Call a service and wait for its response."""
    future = client.call_async(request)
    rclpy.spin_until_future_complete(node, future, timeout_sec=300)
    return future.result()


def main(autostart):
    """Launch, bring up if needed, ask one goal, stop; print what happened."""
    with open(f'/tmp/launch_{autostart}.log', 'w', encoding='utf-8') as log:
        proc = subprocess.Popen([sys.executable, '-c', LAUNCHER, autostart, NODE],
                                stdout=log, stderr=subprocess.STDOUT)
    rclpy.init()
    node = rclpy.create_node('launch_checker')
    get = node.create_client(GetState, f'/{NODE}/get_state')
    change = node.create_client(ChangeState, f'/{NODE}/change_state')
    if not get.wait_for_service(timeout_sec=120):
        raise SystemExit('no lifecycle services')
    print('state at first contact:', call(node, get, GetState.Request()).current_state.label)
    if autostart == 'false':
        time.sleep(3)
        print('state after 3 s:', call(node, get, GetState.Request()).current_state.label)
        for transition in (Transition.TRANSITION_CONFIGURE, Transition.TRANSITION_ACTIVATE):
            response = call(node, change, ChangeState.Request(
                transition=Transition(id=transition)))
            print('transition', transition, 'succeeded:', response.success)
    with TimebillClient(f'/{NODE}/instruct', 'launch_planner', wait_s=300) as llm:
        print('state when the action server answered:',
              call(node, get, GetState.Request()).current_state.label)
        result = llm.ask('Is the gripper open? Answer yes or no.', budget_s=10.0,
                         max_new_tokens=16)
        print('result: status', result.status, 'error_code', result.error_code,
              result.finish_reason, repr(result.response[:60]))
    proc.send_signal(signal.SIGINT)
    print('launch exit code', proc.wait(timeout=60))
    node.destroy_node()
    rclpy.try_shutdown()


if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else 'true')
