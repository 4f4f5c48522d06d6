"""Benchmark servers: ``timebill serve`` as its own process, its parameters, and its client.

A benchmark that compares methods starts one server per method, all at once and sharing the
run's calibration (an idle server takes no compute), and plays each workload on every server
in turn, the order rotated (:func:`rotate`), so that the machine's drift hits all alike.
"""

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time

CALIBRATION_FILE = 'calibration.yaml'  # the run's calibration, in the servers' folder


def decode_weights_of(calibration_file) -> str:
    """Return the step format a calibration was taken with (its dtype's third field).

    Servers of a benchmark run use it rather than each resolving ``auto`` on its own. A file
    that does not exist (yet) gives ``auto``; the server then refuses the missing file itself.
    """
    from timebill_ros.timing.model import Calibration
    if not pathlib.Path(calibration_file).is_file():
        return 'auto'
    return Calibration.load(calibration_file).dtype.split('-')[2]


def safe_name(name):
    """Return ``name`` with every character but letters, digits, ``-`` and ``_`` as ``_``."""
    return ''.join(c if c.isalnum() or c in '-_' else '_' for c in name)


def write_params(folder, name, flat, n_max):
    """Write the params YAML of the server of method ``name`` under ``folder``; return its path.

    ``flat``: the method's own parameters (dotted names), over what every benchmark server
    gets: N_max, the run's calibration (``folder``/CALIBRATION_FILE) with the step format it
    was taken with, and an online state file of its own (methods must not learn from each
    other). Parameters the server refuses raise ValueError before anything is written.
    """
    from timebill_ros import params
    folder = pathlib.Path(folder)
    calibration_file = str(folder / CALIBRATION_FILE)
    base = {'engine.max_new_tokens': n_max,
            'timing.calibration_file': calibration_file,
            'engine.decode_weights': decode_weights_of(calibration_file),
            'timing.state_file': str(folder / f'{safe_name(name)}.online.yaml')}
    config = params.config_from_flat({**base, **flat})
    path = folder / f'{safe_name(name)}.yaml'
    path.write_text(params.to_yaml(config))
    return str(path)


def start_server(params_file, log_path, node_name='timebill', extra_env=None):
    """Start ``timebill serve`` logging to ``log_path``; ``extra_env`` adds variables."""
    cmd = [sys.executable, '-m', 'timebill_ros.cli', 'serve', '--node-name', node_name]
    if params_file:
        cmd += ['--params', str(params_file)]
    log = open(log_path, 'w', encoding='utf-8')
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, **(extra_env or {})))


def stop_server(proc):
    """Stop a server process cleanly (SIGINT; killed after 30 s); return its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextlib.contextmanager
def served(params_file, log_path, wait_s=600.0, node_name='timebill'):
    """Run ``timebill serve`` as its own process; yield a client connected to it.

    ``node_name``: the server node's name (its action is ``/<node_name>/instruct``), so that
    several servers can run side by side. Raises RuntimeError when the server exits or does
    not come up within wait_s seconds. On exit the server gets SIGINT (clean shutdown) and
    its exit code is printed.
    """
    from timebill_ros.ros.client import client_session
    proc = start_server(params_file, log_path, node_name)
    try:
        with client_session(f'/{node_name}/instruct', f'{node_name}_client') as client:
            start = time.monotonic()
            while not client.wait_for_server(5.0):
                if proc.poll() is not None or time.monotonic() - start > wait_s:
                    raise RuntimeError(f'server did not come up; see {log_path}')
            yield client
    finally:
        print(f'server exited with code {stop_server(proc)}')


def start_servers(stack, methods, calibration, folder, n_max, log_dir, node_prefix,
                  progress=print):
    """Start one server per method, all at once; return [(name, client)] in method order.

    methods: [(name, flat parameters)] (:func:`write_params`). ``calibration`` is saved in
    ``folder`` for all of them. Each server logs to ``log_dir``/<name>.log and is the node
    ``<node_prefix>_<index>``; ``stack`` (a contextlib.ExitStack) stops them all on exit.
    """
    folder = pathlib.Path(folder)
    calibration.save(folder / CALIBRATION_FILE)
    clients = []
    for index, (name, flat) in enumerate(methods):
        progress(f'starting the server of method {name}')
        params_file = write_params(folder, name, flat, n_max)
        clients.append((name, stack.enter_context(served(
            params_file, pathlib.Path(log_dir) / f'{safe_name(name)}.log',
            node_name=f'{node_prefix}_{index}'))))
    return clients


def rotate(items, turn):
    """Return ``items`` rotated left by ``turn`` (mod its length)."""
    items = list(items)
    if not items:
        return items
    k = turn % len(items)
    return items[k:] + items[:k]
