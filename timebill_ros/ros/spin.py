"""Running the node: configure and activate it, spin it through callback faults, stop cleanly.

What ``timebill serve`` (cli/server.py) and the tests run around a TimeBillNode; the node
itself (ros/node.py) holds the lifecycle and the action.
"""

import gc
import sys
import threading
import time
import traceback

from rclpy.lifecycle import TransitionCallbackReturn

SUCCESS = TransitionCallbackReturn.SUCCESS


def freeze_heap():
    """Collect once, then move every object alive out of the collector's reach.

    The model, tokenizer and service live as long as the node: frozen, a full (generation-2)
    collection while goals are served scans only what goals allocate, not the millions of
    objects torch and transformers made (a 0.3-0.5 s pause here). It runs before the action
    server exists: done after, the first goal (discovery can complete at once) waited for it.
    """
    gc.collect()
    gc.freeze()


def bring_up(node):
    """Configure, then activate ``node`` (what a lifecycle manager does); return True if active.

    The node's services answer meanwhile when its executor already spins (``~/get_state``
    says ``configuring`` while the model loads).
    """
    if node.trigger_configure() != SUCCESS:
        node.get_logger().error('configure failed: the node stays unconfigured')
        return False
    return node.trigger_activate() == SUCCESS


def spin_through_faults(executor, logger):
    """Run ``executor.spin()``; when a callback's exception ends it, log and spin on.

    rclpy's MultiThreadedExecutor re-raises a callback's exception out of ``spin()``: one
    faulty callback would otherwise stop every goal, cancel and timer of the node.
    """
    import rclpy
    from rclpy.executors import ExternalShutdownException
    while rclpy.ok():
        try:
            executor.spin()
            return
        except (ExternalShutdownException, KeyboardInterrupt):
            return
        except Exception:
            if not rclpy.ok():
                return
            logger.error(f'a callback raised; spinning on: {traceback.format_exc()}')


def spin(node_factory, args=None, stop_event=None):
    """Run the node until SIGINT/SIGTERM (or ``stop_event``), then shut down cleanly.

    On the signal the service ends every goal first (queued and running goals get a FAILED
    result) while the executor still spins, so clients receive their results; then the
    executor stops and its thread is joined before rclpy shuts down. ``destroy_node`` ends
    whatever goal is left. A heap frozen by ``freeze_heap`` stays frozen: call it last.
    """
    import signal

    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    stop_event = stop_event or threading.Event()
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop_event.set())
    node = node_factory()
    sys.setswitchinterval(node.config.ros.gil_switch_interval_s)
    executor = MultiThreadedExecutor(num_threads=node.executor_threads)
    executor.add_node(node)
    spinner = threading.Thread(target=spin_through_faults, args=(executor, node.get_logger()),
                               name='timebill-spin', daemon=True)
    spinner.start()
    try:
        if node.config.ros.autostart:
            bring_up(node)
        while not stop_event.wait(0.2):
            pass
    finally:
        node.get_logger().info('shutting down: ending goals in flight')
        node.shutdown()
        time.sleep(0.5)  # results of the ended goals go out while the executor spins
        executor.shutdown(timeout_sec=5.0)
        spinner.join(timeout=5.0)
        node.destroy_node()
        rclpy.try_shutdown()
        # No gc.unfreeze() here: the process ends next, and unfrozen, the interpreter's last
        # collection walks the whole model heap (2.2 s instead of 0.45 s from spin's return
        # to the exit, measured with the lifecycle test's model).
