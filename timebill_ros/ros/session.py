"""Run an InstructClient with rclpy set up and torn down around it."""

import contextlib
import threading


@contextlib.contextmanager
def client_session(action_name='/timebill/instruct', node_name='timebill_client'):
    """Yield a spinning InstructClient; shut the executor down and join it on exit.

    Sessions may nest (one per server): they share the rclpy context of the outermost.
    """
    import rclpy
    from rclpy.executors import MultiThreadedExecutor

    from timebill_ros.ros.client import InstructClient

    own_context = not rclpy.ok()
    if own_context:
        rclpy.init()
    client = InstructClient(action_name, node_name)
    executor = MultiThreadedExecutor(num_threads=4)
    executor.add_node(client)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        yield client
    finally:
        executor.shutdown(timeout_sec=5.0)
        spinner.join(timeout=5.0)
        client.destroy_node()
        if own_context:
            rclpy.try_shutdown()
