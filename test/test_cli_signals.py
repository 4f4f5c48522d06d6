"""`timebill` verbs unwind on SIGTERM as on Ctrl-C, so the processes they started are stopped.

By default SIGTERM ends a Python process past every ``finally``: a benchmark stopped so left
its `timebill serve` and llama.cpp servers running. A real child process checks it.
"""

import signal
import subprocess
import sys
import time

CHILD = '''
import threading
from timebill_ros.cli import exit_on_sigterm
exit_on_sigterm()
try:
    print('waiting', flush=True)
    threading.Event().wait(60)
finally:
    print('cleaned up', flush=True)
'''


def test_sigterm_runs_the_finally_blocks():
    child = subprocess.Popen([sys.executable, '-c', CHILD], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == 'waiting'
    start = time.monotonic()
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=30)
    assert 'cleaned up' in out
    assert child.returncode == 128 + signal.SIGTERM
    assert time.monotonic() - start < 10
