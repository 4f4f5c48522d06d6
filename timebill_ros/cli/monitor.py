"""``timebill monitor`` and ``timebill record``: watch deadline misses from a terminal.

``monitor`` subscribes to the node's ``~/events`` and ``~/stats`` and to /diagnostics and
draws, in an 80-column terminal (rich), the recent goals (status, budget, total, t^_WCET,
alpha*, executor, finish reason, error code), the miss rate, (m,k)-firm, WCET coverage, the
speed factors and the queue depth per executor. ``--once`` prints one snapshot and exits.
``record`` writes the same messages to a JSON-lines file that ``timebill plot`` draws.

The messages are kept as plain dicts (:func:`message_dict`), so the dashboard, the recorder
and the plots read one form; only the ``watch`` functions touch rclpy.
"""

import collections
import json
import sys
import threading
import time

STATUS_STYLE = {'COMPLETED': 'green', 'KILLED': 'red', 'SKIPPED': 'red', 'REJECTED': 'yellow',
                'CANCELED': 'cyan', 'FAILED': 'bold red'}
LEVEL_NAMES = {0: 'OK', 1: 'WARN', 2: 'ERROR', 3: 'STALE'}


def message_dict(msg):
    """Return a ROS message as a dict of plain values (times and durations as seconds)."""
    out = {}
    for name in msg.get_fields_and_field_types():
        value = getattr(msg, name)
        if hasattr(value, 'nanosec'):
            value = value.sec + value.nanosec * 1e-9
        elif hasattr(value, 'get_fields_and_field_types'):
            value = message_dict(value)
        elif isinstance(value, (list, tuple)) or type(value).__name__ == 'array':
            value = [message_dict(v) if hasattr(v, 'get_fields_and_field_types') else v
                     for v in value]
        elif isinstance(value, bytes):  # a byte field (DiagnosticStatus.level) is one byte
            value = value[0] if len(value) == 1 else value.hex()
        out[name] = value
    return out


def diagnostics_of(array_dict, node_name):
    """Return (level, message, {key: value}) of ``node_name``'s status in a DiagnosticArray."""
    for entry in array_dict.get('status', []):
        if entry['name'] == f'{node_name}: deadlines':
            level = int(entry['level'])
            return level, entry['message'], {kv['key']: kv['value'] for kv in entry['values']}
    return None


class MonitorState:
    """What the dashboard shows: the last ``rows`` goal events, the last stats and diagnostics.

    Fed with message dicts (:func:`message_dict`) from any thread; counts goals by status and
    error code since the monitor started.
    """

    def __init__(self, node_name='timebill', rows=12):
        self.node_name = node_name.strip('/').split('/')[-1]
        self.events = collections.deque(maxlen=rows)
        self.stats = None
        self.diagnostics = None  # (level, message, values)
        self.by_status = collections.Counter()
        self.by_error = collections.Counter()
        self._seen = set()
        self._lock = threading.Lock()

    def add_event(self, event):
        """Keep a GoalEvent dict (once per goal id: a latched replay may repeat one)."""
        with self._lock:
            if event['goal_id'] in self._seen:
                return
            self._seen.add(event['goal_id'])
            self.events.append(event)
            self.by_status[_status_name(event['status'])] += 1
            self.by_error[event.get('error_code', 0)] += 1

    def set_stats(self, stats):
        """Keep the latest ServerStats dict."""
        with self._lock:
            self.stats = stats

    def set_diagnostics(self, array_dict):
        """Keep this node's entry of a DiagnosticArray dict (other nodes' are ignored)."""
        found = diagnostics_of(array_dict, self.node_name)
        if found is not None:
            with self._lock:
                self.diagnostics = found

    def render(self):
        """Return the dashboard as a rich renderable (header lines and the goals table)."""
        from rich.console import Group
        with self._lock:
            return Group(*_header(self), _goals_table(list(self.events)))


def _status_name(code):
    from timebill_ros.server.status import STATUS_NAMES
    return STATUS_NAMES.get(code, str(code))


def _header(state):
    from rich.text import Text
    lines = []
    state_name = '?'
    if state.diagnostics is not None:
        level, message, values = state.diagnostics
        state_name = values.get('lifecycle_state', '?')
        lines.append(Text.assemble(
            (f'{state.node_name} ', 'bold'), (f'{state_name} ', 'bold'),
            (f'{LEVEL_NAMES.get(level, level)}: ', 'red' if level else 'green'), message))
    else:
        lines.append(Text(f'{state.node_name}: no /diagnostics yet', style='yellow'))
    stats = state.stats
    if stats is None:
        lines.append(Text('no ~/stats yet (is the node active?)', style='yellow'))
        return lines
    queues = ', '.join(f'{name} {depth}{"*" if busy else ""}' for name, busy, depth in zip(
        stats['executor_names'], stats['executor_busy'], stats['executor_queue_depth']))
    lines.append(Text(
        f'miss rate {stats["miss_rate"]:.2f} ({stats["deadline_misses"]}/'
        f'{stats["window_size"]})  (m,k)-firm {stats["firm_met"]}/{stats["firm_window"]} '
        f'{"ok" if stats["firm_ok"] else "BROKEN"}  WCET cover {stats["wcet_coverage"]:.2f} '
        f'({stats["wcet_samples"]})', style=None if stats['firm_ok'] else 'red'))
    lines.append(Text(
        f'speed decode {stats["speed_factor_decode"]:.2f} prefill '
        f'{stats["speed_factor_prefill"]:.2f}  {stats["scheduler_policy"]}  queue '
        f'{stats["queue_depth"]} ({queues})  goals {stats["total_goals"]}'))
    if state.by_error:
        from timebill_ros.server.status import ERROR_NAMES
        codes = '  '.join(f'{ERROR_NAMES.get(code, code)} {n}'
                          for code, n in sorted(state.by_error.items()) if code)
        if codes:
            lines.append(Text(f'errors: {codes}', style='yellow'))
    return lines


def _goals_table(events):
    from rich import box
    from rich.table import Table
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), expand=False)
    for name, justify in (('goal', 'left'), ('status', 'left'), ('budget', 'right'),
                          ('total', 'right'), ('t^WCET', 'right'), ('a*', 'right'),
                          ('exec', 'left'), ('finish', 'left'), ('err', 'right')):
        table.add_column(name, justify=justify, no_wrap=True, overflow='ellipsis')
    for event in reversed(events):  # newest first
        name = _status_name(event['status'])
        late = '' if event['deadline_met'] else '!'
        table.add_row(
            event['goal_id'][:6], f'[{STATUS_STYLE.get(name, "")}]{name[:9]}[/]',
            f'{event["budget_s"]:.2f}', f'{event["total_time_s"]:.2f}{late}',
            f'{event["predicted_wcet_s"]:.2f}' if event['predicted_wcet_s'] else '-',
            f'{event["eviction_ratio"]:.2f}', (event['executor'] or '-')[:7],
            event['finish_reason'][:10], str(event.get('error_code', 0) or ''))
    if not events:
        table.caption = 'no goal has ended since the monitor started'
    return table


def snapshot_text(state, width=80):
    """Return the dashboard as plain text ``width`` columns wide (what ``--once`` prints)."""
    from rich.console import Console
    console = Console(width=width, record=True, file=_Null(), color_system=None)
    console.print(state.render())
    return console.export_text()


class _Null:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


def _topic(node, name):
    return f'{node.rstrip("/")}/{name}'


def watch(node, on_event, on_stats, on_diagnostics, stop_event, ready=None):
    """Subscribe to the node's events, stats and /diagnostics; spin until ``stop_event``.

    Events are read with TRANSIENT_LOCAL durability, so the node's last ones (it keeps them
    for late subscribers) arrive too. ``ready`` (a threading.Event) is set once subscribed.
    """
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import DurabilityPolicy, QoSProfile

    from diagnostic_msgs.msg import DiagnosticArray
    from timebill_ros.msg import GoalEvent, ServerStats

    own_context = not rclpy.ok()
    if own_context:
        rclpy.init()
    listener = rclpy.create_node('timebill_monitor')
    latched = QoSProfile(depth=100, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    listener.create_subscription(GoalEvent, _topic(node, 'events'),
                                 lambda m: on_event(message_dict(m)), latched)
    listener.create_subscription(ServerStats, _topic(node, 'stats'),
                                 lambda m: on_stats(message_dict(m)), 10)
    listener.create_subscription(DiagnosticArray, '/diagnostics',
                                 lambda m: on_diagnostics(message_dict(m)), 10)
    executor = SingleThreadedExecutor()
    executor.add_node(listener)
    if ready is not None:
        ready.set()
    try:
        while not stop_event.is_set() and rclpy.ok():
            executor.spin_once(timeout_sec=0.1)
    finally:
        listener.destroy_node()
        if own_context:
            rclpy.try_shutdown()


def collect_snapshot(node='/timebill', wait_s=3.0, rows=12):
    """Listen for ``wait_s`` seconds (less once stats and diagnostics came); return the state."""
    state = MonitorState(node, rows)
    stop = threading.Event()
    thread = threading.Thread(target=watch, args=(node, state.add_event, state.set_stats,
                                                  state.set_diagnostics, stop), daemon=True)
    thread.start()
    end = time.monotonic() + wait_s
    while time.monotonic() < end and (state.stats is None or state.diagnostics is None):
        time.sleep(0.05)
    time.sleep(min(0.3, max(0.0, end - time.monotonic())))  # the latched events' tail
    stop.set()
    thread.join(5.0)
    return state


def cmd_monitor(args, ros_args):
    """Show live goals, the miss rate, (m,k)-firm and WCET coverage of a node (rich)."""
    if args.once:
        print(snapshot_text(collect_snapshot(args.node, args.wait, args.rows), args.width),
              end='')
        return 0
    from rich.live import Live
    state = MonitorState(args.node, args.rows)
    stop = threading.Event()
    thread = threading.Thread(target=watch, args=(args.node, state.add_event, state.set_stats,
                                                  state.set_diagnostics, stop), daemon=True)
    thread.start()
    try:
        with Live(state.render(), refresh_per_second=2, screen=False) as live:
            while thread.is_alive():
                live.update(state.render())
                time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        thread.join(5.0)
    return 0


class JsonLinesRecorder:
    """Appends messages to an open text file as JSON lines, one per message, flushed.

    A write that fails (a full disk: ENOSPC, a revoked mount) is not raised into the ROS
    callback that called it: the first OSError is kept in ``error``, ``stop`` is set and later
    messages are dropped, so ``timebill record`` ends with a message instead of a traceback.
    """

    def __init__(self, out, stop, clock=time.time):
        self.out, self.stop, self.clock = out, stop, clock
        self.count = collections.Counter()
        self.error = None
        self._lock = threading.Lock()

    def callback(self, topic):
        """Return the on-message function of ``topic`` (it takes the message's dict)."""
        def on_message(fields):
            with self._lock:
                if self.error is not None:
                    return
                try:
                    self.out.write(json.dumps({'topic': topic, 'received_s': self.clock(),
                                               **fields}) + '\n')
                    self.out.flush()
                except OSError as exc:
                    self.error = exc
                    self.stop.set()
                    return
                self.count[topic] += 1
        return on_message


def cmd_record(args, ros_args):
    """Write the node's ~/events and ~/stats to a JSON-lines file (for timebill plot).

    Exit code 0, or 1 when the file cannot be opened or written (a full disk), said on stderr.
    """
    stop = threading.Event()
    try:
        out = open(args.out, 'a', encoding='utf-8')
    except OSError as exc:
        print(f'timebill record: cannot open {args.out}: {exc.strerror or exc}', file=sys.stderr)
        return 1
    recorder = JsonLinesRecorder(out, stop)
    thread = threading.Thread(target=watch, args=(args.node, recorder.callback('events'),
                                                  recorder.callback('stats'), lambda m: None,
                                                  stop), daemon=True)
    thread.start()
    end = time.monotonic() + args.duration if args.duration else None
    try:
        while (thread.is_alive() and not stop.is_set()
               and (end is None or time.monotonic() < end)):
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        thread.join(5.0)
        try:
            out.close()
        except OSError as exc:  # the last flush of a full disk
            recorder.error = recorder.error or exc
    count = recorder.count
    print(f'recorded {count["events"]} events and {count["stats"]} stats into {args.out}',
          file=sys.stderr)
    if recorder.error is not None:
        print(f'timebill record: stopped, cannot write {args.out}: '
              f'{recorder.error.strerror or recorder.error}', file=sys.stderr)
        return 1
    return 0


def add_parser(sub):
    """Add the ``monitor`` and ``record`` commands to ``sub``."""
    monitor = sub.add_parser('monitor', help=cmd_monitor.__doc__)
    monitor.add_argument('--node', default='/timebill', help='the node (namespace included)')
    monitor.add_argument('--once', action='store_true', help='print one snapshot and exit')
    monitor.add_argument('--wait', type=float, default=3.0,
                         help='--once: seconds to listen before printing')
    monitor.add_argument('--rows', type=int, default=12, help='recent goals shown')
    monitor.add_argument('--width', type=int, default=80, help='--once: columns')
    monitor.set_defaults(func=cmd_monitor)
    record = sub.add_parser('record', help=cmd_record.__doc__)
    record.add_argument('--node', default='/timebill', help='the node (namespace included)')
    record.add_argument('--out', default='timebill_events.jsonl', help='JSON-lines file '
                        '(appended)')
    record.add_argument('--duration', type=float, default=0.0,
                        help='seconds to record (0: until Ctrl-C)')
    record.set_defaults(func=cmd_record)
