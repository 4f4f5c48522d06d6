"""The ``timebill`` node: a managed (lifecycle) Instruct action server over TimeBillService.

Lifecycle (``rclpy.lifecycle``; ``~/get_state``, ``~/change_state``):

- unconfigured, before the first configure: no action server yet (a client's
  ``wait_for_server`` waits, as for a node that has not started); /diagnostics says so.
- configure: reads the parameters, loads the model, calibrates, loads the predictors and
  warms up (the service factory); the first one opens the action server, which then stays
  open for the node's life. inactive: every new goal ends REJECTED with ``INACTIVE``.
- activate: goals are served. deactivate: new goals end REJECTED with ``INACTIVE``; queued
  and running goals go on to their own terminal state (each has a deadline).
- cleanup: every queued or running goal ends FAILED with ``SHUTDOWN`` and the model is freed;
  unconfigured (new goals: REJECTED, ``INACTIVE``). shutdown (from any state): the same,
  then finalized.

Predictors built after the start (``make run`` builds the RLP and the readout in the
background): while active, every ``predictor.reload_check_s`` the node asks
``upgrade_check(service)`` whether files it lacks exist now; if so it builds a second service
with them beside the running one and swaps it in when no goal is queued or running (goals are
served meanwhile), then logs the switch.

Long work runs on the service's executor threads. Each goal's execute callback only waits for
its result on a threading.Event, so the MultiThreadedExecutor gets a thread for every goal that
may be queued or running, and four more: goal, cancel and timer callbacks always find a free
one (``executor_threads``).
"""

import gc
import platform
import sys
import threading
import time
import traceback

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Header

from timebill_ros.server import status
from timebill_ros.server.executor import max_running_goals
from timebill_ros.server.factory import predictor_upgrade
from timebill_ros.server.service_slot import ServiceSlot
from timebill_ros.action import Instruct
from timebill_ros.msg import GoalEvent, ServerStats
from timebill_ros.ros import conversions
from timebill_ros.ros.parameters import declare_and_read, read_config
from timebill_ros.server.goals import JobResult
from timebill_ros.server.stats import diagnostic_level, firm_ok

LEVELS = (DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR)
MIB = float(2 ** 20)
WAIT_SLICE_S = 1.0  # how often a waiting execute callback checks the server's threads, s
CANCELING_WAIT_S = 2.0  # longest wait for rclpy's CANCELING transition, s
EARLY_CANCEL_KEEP_S = 60.0  # how long a cancel that came before its goal's job is kept, s
EVENTS_KEPT = 100  # GoalEvents the ~/events publisher keeps for late subscribers
DESTROY_WAIT_S = 5.0  # longest wait in destroy_node() for execute callbacks to return, s
SPARE_THREADS = 4  # executor threads beyond the goals' execute callbacks
SUCCESS, FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE


class TimeBillNode(LifecycleNode):
    """Serves Instruct goals with the service built by ``service_factory(config, logger)``.

    Starts unconfigured: :func:`bring_up` (or ``~/change_state``) configures and activates
    it. ``freeze_heap``: once the service is built, run one full collection and
    ``gc.freeze()`` (see :func:`_freeze_heap`); the server process sets it, in-process tests
    leave it off.
    """

    def __init__(self, service_factory, node_name='timebill', freeze_heap=False,
                 upgrade_check=predictor_upgrade, **kwargs):
        super().__init__(node_name, **kwargs)
        self.config = declare_and_read(self)
        self._service_factory = service_factory
        self._freeze_heap = freeze_heap
        # Which service serves, and its hot swap when predictor files appear (server/).
        self.slot = ServiceSlot(service_factory, upgrade_check, self.get_logger().info,
                                self._log_fault, on_swap=self._took_config)
        self.lifecycle_state = 'unconfigured'
        self._jobs = {}  # goal id bytes -> Job, while its execute callback waits
        self._early_cancels = {}  # goal id bytes -> monotonic s: canceled before submitted
        self._jobs_lock = threading.Lock()
        self._destroyed = False
        self._executing = 0  # execute callbacks that have not returned yet
        self._executing_cond = threading.Condition()
        self._group = ReentrantCallbackGroup()
        # Latched: a monitor that starts late gets the last EVENTS_KEPT goals.
        self._events_pub = self.create_publisher(GoalEvent, self.config.ros.events_topic,
                                                 QoSProfile(
                                                     depth=EVENTS_KEPT,
                                                     durability=DurabilityPolicy.TRANSIENT_LOCAL,
                                                     reliability=ReliabilityPolicy.RELIABLE))
        self._stats_pub = self.create_publisher(ServerStats, self.config.ros.stats_topic, 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self._action = None  # the Instruct action server while configured
        self._hardware_id = f'{platform.node() or "localhost"}/{self.config.engine.device}'
        self.create_timer(self.config.stats.period_s, self._publish_stats,
                          callback_group=self._group)
        if self.config.predictor.reload_check_s > 0:
            self.create_timer(self.config.predictor.reload_check_s, self._check_upgrade,
                              callback_group=self._group)
        self.get_logger().info('unconfigured')

    @property
    def service(self):
        """Return the serving TimeBillService (None while unconfigured)."""
        return self.slot.service

    def _took_config(self, service):
        self.config = service.config

    @property
    def executor_threads(self):
        """Return the MultiThreadedExecutor size this node needs.

        One thread for each goal that may wait in the queue or run (each execute callback
        holds one until its result), and SPARE_THREADS for goal responses, cancels and timers.
        """
        return self.config.queue.max_depth + max_running_goals(self.config) + SPARE_THREADS

    def _action_name(self):
        return self.resolve_topic_name(self.config.ros.action_name)

    # --- lifecycle -------------------------------------------------------------------------
    def on_configure(self, state):
        """Read the parameters and build the service (model, calibration, predictors)."""
        self.lifecycle_state = 'configuring'
        try:
            self.config = read_config(self)
            service = self._service_factory(self.config, self.get_logger().info)
            service.pause()  # inactive until activated
            if self._freeze_heap:
                _freeze_heap()
            service.start()
        except Exception:
            self._log_fault('configure')
            self.lifecycle_state = 'unconfigured'
            return FAILURE
        self.slot.install(service)
        if self._action is None:
            self._open_action()
        self.lifecycle_state = 'inactive'
        self.get_logger().info(f'configured (inactive): {self._action_name()} refuses goals '
                               'until activated')
        return SUCCESS

    def _open_action(self):
        self._action = ActionServer(
            self, Instruct, self.config.ros.action_name, execute_callback=self._execute,
            goal_callback=self._on_goal, cancel_callback=self._on_cancel,
            callback_group=self._group, handle_accepted_callback=self._on_accepted,
            result_timeout=self.config.ros.result_timeout_s,
            **_service_qos(self.config.ros.request_queue_depth))

    def on_activate(self, state):
        """Serve goals."""
        self.service.resume()
        self.lifecycle_state = 'active'
        self.slot.active = True
        self.get_logger().info(f'active: serving {self._action_name()}')
        return super().on_activate(state)

    def on_deactivate(self, state):
        """Refuse new goals (INACTIVE); queued and running goals go on to their end."""
        self.slot.active = False
        self.service.pause()
        self.lifecycle_state = 'inactive'
        self.get_logger().info('inactive: new goals are refused; queued and running goals '
                               'go on to their own end')
        return super().on_deactivate(state)

    def on_cleanup(self, state):
        """End every goal (FAILED, SHUTDOWN) and free the model."""
        self._release_service()
        self.get_logger().info('cleaned up (unconfigured): the model is freed')
        return SUCCESS

    def on_shutdown(self, state):
        """End every goal (FAILED, SHUTDOWN) and free the model; the node is finalized."""
        self._release_service()
        self.lifecycle_state = 'finalized'
        return SUCCESS

    def on_error(self, state):
        """Free what a failed transition left; back to unconfigured."""
        self._release_service()
        return SUCCESS

    def _release_service(self):
        """End every goal (FAILED, SHUTDOWN) and free the model; the action server stays."""
        self.slot.active = False
        service = self.slot.release()
        self.lifecycle_state = 'unconfigured'
        if service is None:
            return
        service.shutdown()
        del service
        gc.unfreeze()  # the model's objects were frozen by configure: let them go
        gc.collect()

    def shutdown(self):
        """End all goals (FAILED) and stop the service's threads; calling it again is a no-op.

        A replacement service being built meanwhile is never swapped in (it shuts down).
        """
        service = self.slot.close()
        if service is not None:
            service.shutdown()

    # --- predictors built after the start ----------------------------------------------------
    def _check_upgrade(self):
        """Timer: build a service with predictors that appeared (ServiceSlot.check_upgrade)."""
        try:
            self.slot.check_upgrade(lambda: read_config(self))
        except Exception:
            self._log_fault('predictor check')

    def destroy_node(self):
        """End every goal in flight (FAILED), then destroy the action server and the node.

        Goals' execute callbacks get up to DESTROY_WAIT_S seconds to return, so a client
        whose executor still spins receives their results; no ``timebill-*`` thread is left.
        """
        if self._destroyed:
            return
        self._destroyed = True
        self.shutdown()
        with self._executing_cond:
            self._executing_cond.wait_for(lambda: self._executing == 0, DESTROY_WAIT_S)
        if self._action is not None:
            self._action.destroy()
        super().destroy_node()

    # --- action callbacks --------------------------------------------------------------------
    def _on_goal(self, goal_request):
        # Every goal is accepted, so that bad input ends in a REJECTED result with a reason.
        return GoalResponse.ACCEPT

    def _on_accepted(self, goal_handle):
        """Start the goal's execute callback, also when a cancel races rclpy's execute().

        ``ServerGoalHandle.execute()`` checks ``is_cancel_requested`` and then moves the goal
        to EXECUTING without a lock. A cancel processed on another executor thread in between
        makes that transition raise (CANCELING -> EXECUTE is invalid) before the execute
        callback is scheduled, and the goal would never get a result. Found by
        benchmarks/responsiveness.py (a cancel sent as soon as the goal was accepted).
        """
        try:
            goal_handle.execute()
        except Exception:
            if not goal_handle.is_cancel_requested:
                raise
            action = self._action
            if action is not None:
                action.notify_execute(goal_handle, None)  # ends it CANCELED

    def _on_cancel(self, goal_handle):
        """Cancel the goal's job; remember the cancel when the job is not submitted yet.

        rclpy moves the goal to CANCELING only after this callback returns, so an execute
        callback that submits the job meanwhile sees ``is_cancel_requested`` still false:
        ``_early_cancels`` carries the cancel to it (a lost cancel let a goal run to the end).
        """
        try:
            key = bytes(goal_handle.goal_id.uuid)
            with self._jobs_lock:
                job = self._jobs.get(key)
                if job is None:
                    now_s = time.monotonic()
                    self._early_cancels = {k: t for k, t in self._early_cancels.items()
                                           if now_s - t < EARLY_CANCEL_KEEP_S}
                    self._early_cancels[key] = now_s
            service = self.service
            if job is not None and service is not None:
                service.cancel(job)
        except Exception:  # the request is still answered; the goal ends on its own
            self._log_fault('cancel callback')
        return CancelResponse.ACCEPT

    def _log_fault(self, where):
        self.get_logger().error(f'{where} failed: {traceback.format_exc()}')

    def _execute(self, goal_handle):
        with self._executing_cond:
            self._executing += 1
        try:
            return self._execute_goal(goal_handle)
        finally:
            with self._executing_cond:
                self._executing -= 1
                self._executing_cond.notify_all()

    def _execute_goal(self, goal_handle):
        key = bytes(goal_handle.goal_id.uuid)
        ros_now_s = self.get_clock().now().nanoseconds / 1e9
        clock_of = self.service
        mono_now_s = clock_of.clock() if clock_of is not None else time.monotonic()
        request = conversions.request_from_goal(
            goal_handle.request, key.hex(), ros_now_s, mono_now_s)
        received_s = mono_now_s - max(0.0, ros_now_s - _accepted_at_s(goal_handle, ros_now_s))
        finished = threading.Event()
        outcome = {}

        def on_feedback(feedback):
            goal_handle.publish_feedback(conversions.feedback_to_msg(feedback))

        def on_done(result):
            outcome['result'] = result
            try:
                self._events_pub.publish(
                    conversions.event_msg(result, self.get_clock().now().to_msg()))
            except Exception:  # the event is a side line: the result still goes out
                self._log_fault('event publishing')
            finally:
                finished.set()

        with self.slot.lock:  # a replacement service is never swapped in mid-submit
            service = self.service
            if service is not None:
                job = service.submit(request, on_feedback, on_done, received_s=received_s)
        if service is None:  # unconfigured (after a cleanup)
            on_done(JobResult(
                status=status.REJECTED, error_code=status.ERROR_INACTIVE, goal_id=key.hex(),
                message=f'server is {self.lifecycle_state} (lifecycle state); configure and '
                        'activate it', finish_reason=status.FINISH_REJECTED,
                budget_s=request.budget_s or 0.0, stop_phase='admission'))
            return self._terminate(goal_handle, outcome['result'])
        with self._jobs_lock:
            if job is not None:
                self._jobs[key] = job
            canceled_early = self._early_cancels.pop(key, None) is not None
        if job is not None and (canceled_early or goal_handle.is_cancel_requested):
            service.cancel(job)
        self._wait_finished(service, finished, outcome, goal_handle, job)
        with self._jobs_lock:
            self._jobs.pop(key, None)
        return self._terminate(goal_handle, outcome['result'])

    def _wait_finished(self, service, finished, outcome, goal_handle, job):
        """Wait for the goal's result; a FAILED one if the server's threads died meanwhile.

        Every WAIT_SLICE_S it also applies a cancel rclpy holds that the job missed.
        """
        while not finished.wait(WAIT_SLICE_S):
            if job is not None and goal_handle.is_cancel_requested:
                service.cancel(job)
            if not service.healthy:
                outcome.setdefault('result', JobResult(
                    status=status.FAILED, stop_phase='server',
                    error_code=status.ERROR_INTERNAL, finish_reason=status.FINISH_ERROR,
                    message='internal error: a server thread died; see the node log'))
                return

    def _terminate(self, goal_handle, result):
        # The message first: a goal marked done with no result message reaches the client as
        # an empty Result (status 0).
        result, msg = self._result_msg(result)
        outcome = status.ACTION_OUTCOME[result.status]
        if outcome == 'canceled':
            # A goal canceled while queued ends inside the cancel callback, before rclpy
            # moves it to CANCELING (after the callback returns): wait for that transition.
            _wait_until(lambda: goal_handle.is_cancel_requested, CANCELING_WAIT_S)
        if outcome == 'canceled' and goal_handle.is_cancel_requested:
            goal_handle.canceled()
        elif outcome == 'succeed':
            goal_handle.succeed()
        else:
            goal_handle.abort()
        line = (f'goal {result.goal_id[:8]}: {result.status_name} ({result.message}) '
                f'total {result.total_time_s:.3f} s')
        # rclpy refuses different severities from one call site: two calls.
        if result.status == status.COMPLETED:
            self.get_logger().info(line)
        else:
            self.get_logger().warning(line)
        return msg

    def _result_msg(self, result):
        """Return ``(result, its Instruct.Result)``, never raising.

        A result that cannot be converted (a non-finite time, a field of the wrong type) goes
        out with its non-finite times as 0 and a note; if even that fails, as FAILED with
        ``ERROR_INTERNAL`` naming the fault. Either way the fault is logged.
        """
        try:
            return result, conversions.result_to_msg(result)
        except Exception:
            self._log_fault(f'goal {result.goal_id[:8]}: result conversion')
        try:
            cleaned = conversions.finite_times(result)
            return cleaned, conversions.result_to_msg(cleaned)
        except Exception as exc:
            failed = JobResult(
                status=status.FAILED, error_code=status.ERROR_INTERNAL, goal_id=result.goal_id,
                finish_reason=status.FINISH_ERROR, stop_phase='server',
                message=f'internal error: the result could not be sent: '
                        f'{type(exc).__name__}: {exc}')
            return failed, conversions.result_to_msg(failed)

    # --- stats and diagnostics -------------------------------------------------------------
    def _publish_stats(self):
        try:
            self._publish_stats_once()
        except Exception:  # a timer callback that raises would stop the executor's spin
            self._log_fault('stats publishing')

    def _publish_stats_once(self):
        service, state = self.service, self.lifecycle_state
        stamp = self.get_clock().now().to_msg()
        if service is None:  # no goals are served: /diagnostics says so, no stats
            self._publish_diagnostics(stamp, LEVELS[1], f'{state}: not serving goals',
                                      {'lifecycle_state': state})
            return
        snap = service.stats.snapshot()
        serving = service.status()
        self._stats_pub.publish(ServerStats(
            stamp=stamp, queue_depth=serving.queue_depth, busy=serving.busy,
            window_size=snap.window_size, completion_rate=float(snap.completion_rate),
            deadline_misses=snap.deadline_misses, miss_rate=float(snap.miss_rate),
            total_goals=snap.total_goals, last_kill_latency_s=snap.last_kill_latency_s,
            last_total_time_s=snap.last_total_time_s,
            last_predicted_wcet_s=snap.last_predicted_wcet_s,
            active_goals=serving.active_goals, misses_total=snap.misses_total,
            consecutive_misses=snap.consecutive_misses, firm_met=snap.firm_met,
            firm_window=snap.firm_window, firm_ok=firm_ok(snap, self.config.stats),
            kill_latency_max_s=float(snap.kill_latency_max_s),
            wcet_coverage=float(snap.wcet_coverage), wcet_samples=snap.wcet_samples,
            speed_factor_decode=float(serving.speed_factor_decode),
            speed_factor_prefill=float(serving.speed_factor_prefill),
            wcet_margin_decode=float(serving.wcet_margin_decode),
            wcet_margin_prefill=float(serving.wcet_margin_prefill),
            scheduler_policy=serving.scheduler_policy,
            executor_names=[name for name, _, _ in serving.executors],
            executor_busy=[busy for _, busy, _ in serving.executors],
            executor_queue_depth=[queued for _, _, queued in serving.executors],
            prefix_lookups=serving.prefix.lookups, prefix_hits=serving.prefix.hits,
            prefix_hit_rate=float(serving.prefix.hit_rate),
            prefix_store_mb=serving.prefix.bytes / MIB,
            prefix_store_max_mb=serving.prefix.max_bytes / MIB))
        level, message = diagnostic_level(snap, self.config.stats)
        if state != 'active':
            level, message = max(level, 1), f'{state}: new goals are refused; {message}'
        values = {'lifecycle_state': state}
        values.update(diagnostic_values(snap, serving, self.config.stats))
        self._publish_diagnostics(stamp, LEVELS[level], message, values)

    def _publish_diagnostics(self, stamp, level, message, values):
        self._diag_pub.publish(DiagnosticArray(header=Header(stamp=stamp), status=[
            DiagnosticStatus(level=level, name=f'{self.get_name()}: deadlines',
                             message=message, hardware_id=self._hardware_id,
                             values=[KeyValue(key=k, value=str(v))
                                     for k, v in values.items()])]))


def diagnostic_values(snap, serving, stats_config):
    """Return the /diagnostics key/values (strings or numbers) for one period."""
    values = {
        'active_goals': serving.active_goals, 'queue_depth': serving.queue_depth,
        'busy': serving.busy, 'window_size': snap.window_size,
        'completion_rate': f'{snap.completion_rate:.3f}',
        'deadline_misses': snap.deadline_misses, 'misses_total': snap.misses_total,
        'consecutive_misses': snap.consecutive_misses,
        'firm_m_of_k': f'{stats_config.firm_m}/{stats_config.firm_k}',
        'firm_met': f'{snap.firm_met}/{snap.firm_window}',
        'total_goals': snap.total_goals,
        'last_kill_latency_s': f'{snap.last_kill_latency_s:.4f}',
        'kill_latency_max_ms': f'{snap.kill_latency_max_s * 1e3:.1f}',
        'wcet_coverage': f'{snap.wcet_coverage:.3f}', 'wcet_samples': snap.wcet_samples,
        'speed_factor': f'{serving.speed_factor_decode:.3f}',
        'speed_factor_prefill': f'{serving.speed_factor_prefill:.3f}',
        'wcet_margin': f'{serving.wcet_margin_decode:.3f}',
        'wcet_margin_prefill': f'{serving.wcet_margin_prefill:.3f}',
    }
    values['scheduler_policy'] = serving.scheduler_policy
    values.update({
        'prefix_hit_rate': f'{serving.prefix.hit_rate:.3f}',
        'prefix_hits': f'{serving.prefix.hits}/{serving.prefix.lookups}',
        'prefix_store_mb':
            f'{serving.prefix.bytes / MIB:.1f}/{serving.prefix.max_bytes / MIB:.0f}',
    })
    for name, busy, queued in serving.executors:
        values[f'executor_{name}'] = 'busy' if busy else 'idle'
        values[f'queue_depth_{name}'] = queued
    values.update({f'count_{name.lower()}': n for name, n in snap.by_status.items()})
    return values


def _service_qos(depth):
    """Return the ActionServer QoS keywords: reliable keep-last queues of ``depth`` requests."""
    profile = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth,
                         reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.VOLATILE)
    return {f'{name}_service_qos_profile': profile for name in ('goal', 'cancel', 'result')}


def _wait_until(predicate, timeout_s, poll_s=0.002):
    """Poll ``predicate`` until it is true or ``timeout_s`` seconds pass; return its value."""
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= end:
            return False
        time.sleep(poll_s)
    return True


def _accepted_at_s(goal_handle, default_s):
    """Return the ROS time (s) the action server stamped when it accepted the goal.

    rclpy keeps it in the handle's GoalInfo (``_goal_info``, the same from Humble to Kilted)
    without a public accessor. Execute callbacks run on parallel threads and may start out of
    order, so this stamp, not the callback's start, is the goal's receipt time.
    """
    info = getattr(goal_handle, '_goal_info', None)
    stamp = getattr(info, 'stamp', None)
    if stamp is None or (stamp.sec == 0 and stamp.nanosec == 0):
        return default_s
    return conversions.time_to_s(stamp)


def _freeze_heap():
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
