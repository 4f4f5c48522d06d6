"""Helpers of the remote-backend tests: the loopback llama.cpp server, a stand-in, services.

The stand-in shows the failures the real server cannot be made to show on demand (429 / 503,
silence, a cut stream).
"""

import http.server
import json
import os
import threading
import urllib.request

import pytest

from timebill_ros.bench.llama_server import LoopbackLlamaServer, server_available
from timebill_ros.config import EngineConfig, ServerConfig
from timebill_ros.engine.remote import client
from timebill_ros.engine.remote.model import RemoteModel
from timebill_ros.predictors import FallbackPredictor
from timebill_ros.server.backends.openai import OpenAiApi
from timebill_ros.server.backends.remote import RemoteRunner
from timebill_ros.server.service import TimeBillService
from timebill_ros.timing.remote import RemoteCoefficients, RemoteTimeModel

SERVER_CTX = 2048  # the loopback server's context, tokens
# One thread: llama.cpp's threads spin at every barrier of a step, so two of them on a machine
# whose two cores are busy with other work wait for each other for a whole time slice (steps of
# 100s of ms); one thread has no barrier to wait at and keeps its pace under load.
SERVER_THREADS = 1
END_TOKENS = (0, 1, 2)  # the embedded SmolLM2's <|endoftext|>, <|im_start|>, <|im_end|>


def start_llama_server(tmp_path_factory):
    """Start the loopback llama.cpp server, or skip here / fail under CI without it.

    CI installs llama-cpp-python[server] (scripts/setup_llama.sh, run by ``make test``): there a
    missing server is a failure, not a skip.
    """
    if not server_available():
        if os.environ.get('CI'):
            pytest.fail('llama-cpp-python[server] is not installed (scripts/setup_llama.sh)')
        pytest.skip('llama-cpp-python[server] is not installed (make llama installs it)')
    log = tmp_path_factory.mktemp('llama') / 'server.log'
    return LoopbackLlamaServer(n_ctx=SERVER_CTX, threads=SERVER_THREADS,
                               log_path=log).start()


def complete(url, prompt, max_tokens, ignore_eos=False):
    """POST one greedy, unstreamed ``/completions`` request to ``url``; return its JSON.

    What another client of a shared server sends (it holds the one-request server meanwhile).
    ignore_eos: the answer runs to ``max_tokens`` (the embedded model's end tokens, ids 0-2,
    get a logit bias of -100): a hold whose length does not depend on where the model would
    stop.
    """
    fields = {'prompt': prompt, 'max_tokens': max_tokens, 'temperature': 0}
    if ignore_eos:
        fields['logit_bias'] = {str(token): -100 for token in END_TOKENS}
    body = json.dumps(fields).encode()
    request = urllib.request.Request(url + '/completions', data=body,
                                     headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def remote_config(url, **engine_fields):
    """Return a ServerConfig of the remote backend at ``url`` (fallback predictor)."""
    from timebill_ros.config import PredictorConfig
    engine = EngineConfig(backend='openai', remote_url=url, remote_context_tokens=SERVER_CTX,
                          **engine_fields)
    return ServerConfig(engine=engine, predictor=PredictorConfig(kind='fallback'))


def remote_service(url, coefficients, name='model', fallback=None, **engine_fields):
    """Return a started TimeBillService on the engine at ``url`` with ``coefficients``.

    No probes: the time model starts from ``coefficients`` (RemoteCoefficients). Its
    runner counts the requests it opens in ``runner.opened``. fallback: a local JobRunner.
    """
    config = remote_config(url, **engine_fields)
    model = RemoteModel.load(config.engine, name)
    time_model = RemoteTimeModel(coefficients, config.timing.online_settings())
    predictor = FallbackPredictor()
    runner = CountingRunner(model, predictor, time_model, config,
                            client.Endpoint.parse(url), OpenAiApi())
    runner.fallback = fallback
    service = TimeBillService(config, model, predictor, time_model, runner=runner)
    service.start()
    return service


class CountingRunner(RemoteRunner):
    """The real RemoteRunner; ``opened`` counts the requests it sent."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.opened = 0

    def open_stream(self, body):
        self.opened += 1
        return super().open_stream(body)


# Coefficients about this machine's llama.cpp on the embedded model (fitted by the probes:
# a few ms to the first token of a held prompt, ~3 ms an uncached prompt token, ~8 ms a step).
LOOPBACK = RemoteCoefficients(first_token_s=0.02, prefill_token_s=3e-3, step_s=8e-3,
                              step_kv_token_s=2e-6)


class StandIn(http.server.ThreadingHTTPServer):
    """A stand-in engine on loopback that fails the way ``mode`` says.

    ``busy503`` / ``busy429``: that status; ``http500``: an error status; ``silent``: accepts
    and never answers; ``cut``: streams three tokens, then closes without an end.
    """

    daemon_threads = True

    def __init__(self, mode):
        super().__init__(('127.0.0.1', 0), _StandInHandler)
        self.mode = mode
        self.release = threading.Event()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        """Return its API base URL."""
        return f'http://127.0.0.1:{self.server_address[1]}/v1'

    def close(self):
        """Stop serving."""
        self.release.set()
        self.shutdown()
        self.server_close()


class _StandInHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get('Content-Length', 0)))
        mode = self.server.mode
        if mode in ('busy503', 'busy429', 'http500'):
            code = {'busy503': 503, 'busy429': 429, 'http500': 500}[mode]
            body = b'{"error": "stand-in"}'
            self.send_response(code)
            self.send_header('Content-Length', str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if mode == 'silent':
            self.server.release.wait(30)
            return
        self.send_response(200)
        self.send_header('Content-Type', 'text/event-stream')
        self.end_headers()
        for word in ('one', ' two', ' three'):
            self.wfile.write(b'data: {"choices": [{"text": "%s", "finish_reason": null}]}\n\n'
                             % word.encode())
            self.wfile.flush()
        self.close_connection = True
