"""A hostile remote engine cannot break a deadline, the memory or the time model (issue 58).

Stand-in engines on loopback write raw bytes to the real client (engine/remote/client.py)
through the real service and RemoteRunner: endless lines under every framing, slowloris
headers, lying usage, Content-Length and chunk sizes, max_tokens ignored, malformed fields, a
redirect, /models bodies of every wrong shape. Each goal must end with its error code no
later than its deadline + 50 ms (Skip-Next: its ceiling), its reader thread gone <= 100 ms
after the result, the process's RSS at most 64 MB larger, and the next goal on a healthy
engine must complete, the time model as the hostile goal left it.
"""

import http.client
import json
import socket
import threading
import time

import pytest
from remote_helpers import LOOPBACK, remote_service
from service_helpers import ask

from timebill_ros.engine.remote import client
from timebill_ros.server import status
from timebill_ros.server.goals import GoalRequest
from timebill_ros.server.backends import openai
from timebill_ros.server.backends.remote import MAX_TOKENS_SLACK
from timebill_ros.timing.online import DECODE, PREFILL
from timebill_ros.timing.remote import RemoteTimeModel

KILL, SKIP, PARTIAL = status.POLICY_KILL, status.POLICY_SKIP_NEXT, status.POLICY_PARTIAL
LATE_S = 0.05  # a goal's result no later than its deadline (or ceiling) + this
GONE_S = 0.1  # the reader thread ends this long after the result, at most
RSS_MB = 64  # the process's resident memory grows at most this much a case
OK_HEAD = b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n'


def _chunk(text=None, finish=None, **extra):
    fields = {'choices': [{'text': text, 'finish_reason': finish}], **extra}
    return b'data: ' + json.dumps(fields).encode() + b'\n\n'


class RawEngine:
    """A loopback TCP server; ``handler(engine, conn, request_line)`` writes each response.

    One thread a connection; ``requests`` counts the requests read in full. ``handler`` may
    be swapped between goals (the healthy engine after a hostile one).
    """

    def __init__(self, handler):
        self.handler = handler
        self.requests = 0
        self._stop = threading.Event()
        self._sock = socket.create_server(('127.0.0.1', 0))
        self._sock.settimeout(0.05)
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self):
        """Return the API base URL."""
        return f'http://127.0.0.1:{self._sock.getsockname()[1]}/v1'

    @property
    def stopping(self):
        """Return whether the engine is being closed (handlers' loops end)."""
        return self._stop.is_set()

    def close(self):
        """Stop accepting; handlers' loops end at their next write."""
        self._stop.set()
        self._sock.close()

    def send(self, conn, data, every_s=0.0, forever=False):
        """Write ``data`` (again every ``every_s`` s when ``forever``) until the client leaves."""
        while not self.stopping:
            conn.sendall(data)
            if not forever:
                return
            if every_s:
                time.sleep(every_s)

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            head = b''
            while b'\r\n\r\n' not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            head, _, body = head.partition(b'\r\n\r\n')
            length = 0
            for line in head.split(b'\r\n')[1:]:
                name, _, value = line.partition(b':')
                if name.strip().lower() == b'content-length':
                    length = int(value)
            while len(body) < length:
                body += conn.recv(65536)
            self.requests += 1
            self.handler(self, conn, head.split(b'\r\n')[0].decode())
        except OSError:  # the client left: what Kill and close() do
            pass
        finally:
            conn.close()


def healthy(n_tokens=10, step_s=0.008, usage=None):
    """Return a handler streaming ``n_tokens`` tokens ``step_s`` apart, then its end."""
    def handler(engine, conn, request_line):
        conn.sendall(OK_HEAD + b'Connection: close\r\n\r\n')
        for i in range(n_tokens):
            time.sleep(step_s)
            conn.sendall(_chunk(f' w{i}'))
        extra = {'usage': usage} if usage is not None else {}
        conn.sendall(_chunk('', 'length', **extra) + b'data: [DONE]\n\n')
    return handler


def _rss_mb():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * 4096 / 1e6


def _reader_threads():
    return [t for t in threading.enumerate() if t.name == 'timebill-remote' and t.is_alive()]


def _factors(model):
    """Return the speed factors of time model ``model``'s prefill and decode."""
    return {phase: model.status(phase).speed_factor for phase in (PREFILL, DECODE)}


def goal(budget_s=1.0, policy=KILL, n_max=64):
    return GoalRequest(prompt='Report the battery level.', budget_s=budget_s,
                       overrun_policy=policy, max_new_tokens=n_max)


def run_case(handler, request, **engine_fields):
    """Run ``request`` on a ``handler`` engine, then a goal on a healthy one; check both.

    Returns (the hostile goal's result, its lateness after its deadline in seconds, the
    time model's speed factors right after it).
    """
    engine = RawEngine(handler)
    service = remote_service(engine.url, LOOPBACK, **engine_fields)
    try:
        rss_mb = _rss_mb()
        result = ask(service, request, timeout_s=60)
        ended = time.monotonic()
        while _reader_threads() and time.monotonic() - ended < GONE_S:
            time.sleep(0.002)
        assert not _reader_threads(), 'the reader thread outlived the result by 100 ms'
        assert _rss_mb() - rss_mb <= RSS_MB
        factors = _factors(service.time_model)
        engine.handler = healthy()
        after = ask(service, goal(budget_s=5.0))
        assert after.status == status.COMPLETED, after.message
        return result, result.total_time_s - request.budget_s, factors
    finally:
        service.shutdown()
        engine.close()


def check_failed(result, late_s, code, words):
    """Check a FAILED result: its code, a message with ``words``, on time."""
    assert result.status == status.FAILED, (result.status, result.message)
    assert result.error_code == code, (result.error_code, result.message)
    assert result.finish_reason == status.FINISH_ERROR
    assert words in result.message, result.message
    assert late_s <= LATE_S, late_s


UNMOVED = {PREFILL: 1.0, DECODE: 1.0}  # the speed factors of a time model that learned nothing


# --- endless lines, under every framing ------------------------------------------------------
FRAMINGS = {'http10': b'HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n',
            'close': OK_HEAD + b'Connection: close\r\n\r\n',
            'keep_alive': OK_HEAD + b'Content-Length: 1000000000000\r\n\r\n',
            'chunked': OK_HEAD + b'Transfer-Encoding: chunked\r\n\r\n'}


def endless(framing, every_s):
    """Return a handler streaming one line without a newline, 4 KB every ``every_s`` s."""
    piece = b'x' * 4096
    if framing == 'chunked':
        piece = b'1000\r\n' + piece + b'\r\n'

    def handler(engine, conn, request_line):
        start = b'1000\r\ndata: ' + b'x' * 4090 + b'\r\n' if framing == 'chunked' else b'data: '
        conn.sendall(FRAMINGS[framing] + start)
        engine.send(conn, piece, every_s, forever=True)
    return handler


@pytest.mark.parametrize('framing', sorted(FRAMINGS))
def test_a_slow_endless_line_is_killed_at_the_deadline(framing):
    result, late_s, factors = run_case(endless(framing, 0.02), goal(budget_s=0.6))
    assert result.status == status.KILLED, result.message
    assert late_s <= LATE_S, late_s
    assert factors == UNMOVED


@pytest.mark.parametrize('framing', sorted(FRAMINGS))
def test_a_fast_endless_line_fails_at_the_line_cap(framing):
    result, late_s, factors = run_case(endless(framing, 0.0), goal(budget_s=5.0, policy=SKIP))
    check_failed(result, late_s, status.ERROR_REMOTE_HTTP, 'stream line is over')
    assert factors == UNMOVED


# --- headers -----------------------------------------------------------------------------------
def slowloris(engine, conn, request_line):
    """Drip a status line and headers one byte every 20 ms, for ever."""
    engine.send(conn, b'H', 0.02, forever=True)


def test_dripped_headers_are_killed_at_the_deadline_and_time_out_without_one():
    result, late_s, factors = run_case(slowloris, goal(budget_s=0.5))
    assert result.status == status.KILLED, result.message
    assert late_s <= LATE_S and factors == UNMOVED
    # Skip-Next: the headers' deadline (connect 0.2 s + idle 0.3 s) ends it.
    result, late_s, factors = run_case(slowloris, goal(budget_s=5.0, policy=SKIP),
                                       remote_connect_timeout_s=0.2,
                                       remote_idle_timeout_s=0.3)
    check_failed(result, late_s, status.ERROR_REMOTE_TIMEOUT, 'no response headers')
    assert result.total_time_s < 0.5 + 0.5  # the headers' deadline, and a prefill's poll


def redirect(engine, conn, request_line):
    conn.sendall(b'HTTP/1.1 301 Moved Permanently\r\nLocation: http://10.0.0.1/v1\r\n'
                 b'Content-Length: 0\r\n\r\n')


def short_length(engine, conn, request_line):
    """Content-Length covers two chunks; five come, and the end."""
    length = str(2 * len(_chunk(' a'))).encode()
    conn.sendall(OK_HEAD + b'Content-Length: ' + length + b'\r\n\r\n' + _chunk(' a') * 5
                 + _chunk('', 'length') + b'data: [DONE]\n\n')


def long_length(engine, conn, request_line):
    """Content-Length promises more than comes; then the engine closes."""
    conn.sendall(OK_HEAD + b'Content-Length: 100000\r\n\r\n' + _chunk(' a') * 3)


def bad_chunk(engine, conn, request_line):
    conn.sendall(OK_HEAD + b'Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n')


@pytest.mark.parametrize('handler,code,words', [
    (redirect, status.ERROR_REMOTE_HTTP, 'HTTP 301'),
    (short_length, status.ERROR_REMOTE_STREAM, 'ended before'),
    (long_length, status.ERROR_REMOTE_STREAM, 'ended before'),
    (bad_chunk, status.ERROR_REMOTE_STREAM, 'ended before')])
def test_framing_lies_end_with_their_code(handler, code, words):
    result, late_s, factors = run_case(handler, goal(budget_s=5.0))
    check_failed(result, late_s, code, words)
    assert factors == UNMOVED


# --- what the engine says about its answer -------------------------------------------------------
def test_a_lying_usage_does_not_set_the_answers_length():
    result, _, _ = run_case(healthy(n_tokens=5, usage={'completion_tokens': 200_000_000}),
                            goal(budget_s=5.0))
    assert result.status == status.COMPLETED, result.message
    assert result.response_tokens == 5


def ignores_max_tokens(engine, conn, request_line):
    conn.sendall(OK_HEAD + b'Connection: close\r\n\r\n')
    engine.send(conn, _chunk(' token'), 0.001, forever=True)


@pytest.mark.parametrize('policy', [KILL, SKIP, PARTIAL])
def test_an_engine_ignoring_max_tokens_is_cut_off(policy):
    request = goal(budget_s=5.0, policy=policy, n_max=32)
    result, late_s, factors = run_case(ignores_max_tokens, request)
    check_failed(result, late_s, status.ERROR_REMOTE_HTTP, 'ignored max_tokens')
    assert result.response_tokens <= 32 + MAX_TOKENS_SLACK
    assert factors == UNMOVED


def endless_comments(engine, conn, request_line):
    """Lines that are no data, for ever: the answer never comes."""
    conn.sendall(OK_HEAD + b'Connection: close\r\n\r\n')
    engine.send(conn, b': keep-alive\n', 0.01, forever=True)


def test_skip_next_ends_at_its_ceiling():
    request = goal(budget_s=0.2, policy=SKIP)
    result, _, factors = run_case(endless_comments, request, remote_idle_timeout_s=1.0)
    wcet_s = result.predicted_wcet_s
    ceiling_s = max(4.0 * wcet_s, 1.0)
    check_failed(result, 0.0, status.ERROR_REMOTE_TIMEOUT, 'ceiling')
    assert ceiling_s <= result.total_time_s <= ceiling_s + 0.2 + LATE_S
    assert factors == UNMOVED


@pytest.mark.parametrize('chunk', [
    b'data: {"choices": [{"text": 5, "finish_reason": null}]}\n\n',
    b'data: {"choices": [{"text": "a", "finish_reason": ["stop"]}]}\n\n',
    b'data: {"choices": [{"text": "a", "finish_reason": "stop"}], "usage": "many"}\n\n',
    b'data: {"choices": "a"}\n\n',
    b'data: {"choices": [1]}\n\n',
    b'data: [1, 2]\n\n',
    b'data: {"choices": [{"delta": "a", "finish_reason": null}]}\n\n',
    b'data: not json\n\n'])
def test_malformed_fields_end_remote_http(chunk):
    def handler(engine, conn, request_line):
        conn.sendall(OK_HEAD + b'Connection: close\r\n\r\n' + _chunk(' ok') + chunk)
        time.sleep(0.2)
    result, late_s, _ = run_case(handler, goal(budget_s=5.0))
    check_failed(result, late_s, status.ERROR_REMOTE_HTTP, 'stream')


# --- /models -------------------------------------------------------------------------------
def models_body(body, every_s=0.0, forever=False, head=b''):
    def handler(engine, conn, request_line):
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n'
                     b'Connection: close\r\n' + head + b'\r\n')
        engine.send(conn, body, every_s, forever)
    return handler


@pytest.mark.parametrize('body,words', [
    (b'[1, 2]', 'expected {"data"'), (b'{"data": [1]}', 'without a string "id"'),
    (b'{"data": "abc"}', 'expected {"data"'), (b'{}', 'expected {"data"'),
    (b'{"data": [{"id": 7}]}', 'without a string "id"'), (b'nonsense', 'JSONDecodeError')])
def test_models_of_a_wrong_shape_are_a_remote_error_naming_it(body, words):
    engine = RawEngine(models_body(body))
    try:
        with pytest.raises(client.RemoteError) as error:
            openai.list_models(client.Endpoint.parse(engine.url), 2.0)
        assert error.value.kind == client.HTTP and words in str(error.value)
    finally:
        engine.close()
    engine = RawEngine(models_body(b'{"data": [{"id": "m"}]}'))
    try:
        assert openai.list_models(client.Endpoint.parse(engine.url), 2.0) == ['m']
    finally:
        engine.close()


def test_an_endless_models_body_is_bounded_in_bytes_and_time():
    engine = RawEngine(models_body(b'x' * 65536, forever=True))
    rss_mb, start = _rss_mb(), time.monotonic()
    try:
        with pytest.raises(client.RemoteError) as error:
            openai.list_models(client.Endpoint.parse(engine.url), 2.0)
        assert 'over' in str(error.value) and time.monotonic() - start < 2.0 + LATE_S
        assert _rss_mb() - rss_mb <= RSS_MB
    finally:
        engine.close()
    engine = RawEngine(models_body(b'[', every_s=0.02, forever=True))  # a drip
    start = time.monotonic()
    try:
        with pytest.raises(client.RemoteError) as error:
            openai.list_models(client.Endpoint.parse(engine.url), 0.5)
        assert error.value.kind == client.TIMEOUT
        assert time.monotonic() - start < 0.5 + 0.5
    finally:
        engine.close()


# --- closing ----------------------------------------------------------------------------------
class _HeldEndpoint(client.Endpoint):
    """An endpoint whose connections wait in connect() until ``go`` is set."""

    started = go = None

    def connection(self, timeout_s):
        endpoint = self

        class Held(http.client.HTTPConnection):
            def connect(self):
                endpoint.started.set()
                endpoint.go.wait(5)
                super().connect()

        return Held(self.host, self.port, timeout=timeout_s)


def test_a_request_closed_while_connecting_is_never_sent():
    engine = RawEngine(healthy())
    try:
        endpoint = _HeldEndpoint(*client.Endpoint.parse(engine.url).__dict__.values())
        endpoint.started, endpoint.go = threading.Event(), threading.Event()
        stream = client.CompletionStream(endpoint, '/completions', {'prompt': 'x'}, 1.0, 1.0,
                                         parse=openai.parse_chunk)
        assert endpoint.started.wait(5)
        stream.close()
        endpoint.go.set()
        stream.join(2.0)
        assert not stream.reading
        time.sleep(0.1)
        assert engine.requests == 0 and stream.events.empty()
    finally:
        engine.close()


def test_implausibly_fast_observations_are_not_learned(caplog):
    model = RemoteTimeModel(LOOPBACK)
    model.observe_decode(20, 400, 1e-4)  # 400 steps in 0.1 ms
    model.observe_prefill(20, 1e-5)
    assert model.n_dropped == 2 and _factors(model) == UNMOVED
    assert 'not learned' in caplog.text
    model.observe_decode(20, 40, 0.5)  # a slow-down counts at once
    assert model.status(DECODE).speed_factor > 1.0
