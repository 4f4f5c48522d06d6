"""llama-cpp-python's OpenAI-compatible server on loopback, for tests and benchmarks.

The remote engine of ``engine.backend: openai`` (docs/remote.md). It serves the embedded
GGUF (or ``model_path``) on 127.0.0.1 at a free port, one request at a time
(llama-cpp-python's server runs one generation and queues the rest), and keeps the tokens of
its last request for the next prompt that starts with them.
"""

import os
import socket
import subprocess
import sys
import time

from timebill_ros.engine import model_source
from timebill_ros.engine.remote import client
from timebill_ros.server.backends.openai import list_models

READY_TIMEOUT_S = 120.0


def free_port() -> int:
    """Return a TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def server_available() -> bool:
    """Return whether llama-cpp-python's server can be started (its package is installed)."""
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError:
        return False
    return True


class LoopbackLlamaServer:
    """A llama-cpp-python server process; ``url`` is its API base (``.../v1``).

    model_path: a GGUF file (empty: the embedded SmolLM2 GGUF). n_ctx: its context, tokens.
    threads: its CPU threads. port: 0 picks a free one. log_path: its output (None: dropped).
    """

    def __init__(self, model_path='', n_ctx=4096, threads=2, port=0, log_path=None):
        self.model_path = str(model_path or model_source.embedded_gguf_path())
        self.n_ctx, self.threads = n_ctx, threads
        self.port = port or free_port()
        self.log_path = log_path
        self.process = None

    @property
    def url(self) -> str:
        """Return the OpenAI API base URL."""
        return f'http://127.0.0.1:{self.port}/v1'

    def start(self, timeout_s=READY_TIMEOUT_S) -> 'LoopbackLlamaServer':
        """Start the process and wait until ``/v1/models`` answers (RuntimeError if not)."""
        command = [sys.executable, '-m', 'llama_cpp.server', '--model', self.model_path,
                   '--host', '127.0.0.1', '--port', str(self.port), '--n_ctx', str(self.n_ctx),
                   '--n_threads', str(self.threads), '--n_threads_batch', str(self.threads)]
        output = open(self.log_path, 'ab') if self.log_path else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                            env=dict(os.environ, PYTHONUNBUFFERED='1'))
        finally:
            if output is not subprocess.DEVNULL:
                output.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f'llama_cpp.server exited with {self.process.returncode} '
                                   f'(log: {self.log_path})')
            if self.models():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f'llama_cpp.server did not answer within {timeout_s} s')

    def models(self) -> list:
        """Return the ids of ``/v1/models`` ([] while it does not answer)."""
        try:
            return list_models(client.Endpoint.parse(self.url), 1.0)
        except client.RemoteError:
            return []

    def stop(self, timeout_s=10.0) -> None:
        """Stop the process (terminate, then kill)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout_s)

    def kill(self) -> None:
        """Kill the process at once (an engine that dies mid-answer)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10.0)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
