"""The transport of the remote backends: a streamed HTTP request read on its own thread.

What a request and a stream chunk hold is the API's (server/backends/: openai.py's
WireFormat for OpenAI-compatible engines, llama.cpp's server, vLLM); this is the socket,
the server-sent events, the timeouts and the errors' kinds.

Why the standard library and not the ``openai`` package: a goal's thread must end a request
at its deadline from outside the blocking read (Kill, cancel), see each streamed token when
it arrives, and tell a refused connection from a timeout, a 429/503 and a stream cut short.
``http.client`` on a reader thread whose socket :meth:`CompletionStream.close` shuts down
does all of that in ~150 lines with no new dependency on the robot; the ``openai`` client's
retries and pooled connections would each have to be turned off for it.

Every event carries the monotonic time the reader saw it, so the time to the first token and
the steps are measured where they arrive, not when the goal's thread polls.

The server is not trusted (issue 58): a stream line and a non-streamed body are read up to a
cap, the response headers must arrive by a total deadline (a server dripping bytes resets
the socket's idle timeout with each one), every field of a chunk is checked for its type,
and :meth:`CompletionStream.close` shuts the socket itself down, whatever the response's
framing (http.client drops its own reference under HTTP/1.0 or ``Connection: close``).
"""

import dataclasses
import http.client
import json
import queue
import socket
import threading
import time
import urllib.parse
from typing import Optional

# Event kinds of a stream.
TEXT, END, ERROR = 'text', 'end', 'error'
# RemoteError kinds: one error code each (server/status.py ERROR_REMOTE_*).
UNREACHABLE = 'unreachable'   # the connection was refused, or the host is unknown
TIMEOUT = 'timeout'           # connecting, or the engine went silent mid-answer
BUSY = 'busy'                 # HTTP 429 or 503: the engine refuses more work now
HTTP = 'http'                 # any other HTTP error status, or an error object in the stream
STREAM_CUT = 'stream_cut'     # the stream ended without its end (the engine died mid-answer)
ERROR_KINDS = (UNREACHABLE, TIMEOUT, BUSY, HTTP, STREAM_CUT)
# The longest stream line read (one server-sent event's data: a token and its fields, a few
# hundred bytes from llama.cpp and vLLM; logprobs a few KB), bytes.
MAX_LINE_BYTES = 256 * 1024
# The longest non-streamed body read (/models), bytes.
MAX_BODY_BYTES = 4 * 1024 * 1024


class RemoteError(RuntimeError):
    """A request to the remote engine failed; ``kind`` is one of ``ERROR_KINDS``."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclasses.dataclass(frozen=True)
class StreamEvent:
    """One event of a stream; ``at_s``: when the reader saw it, monotonic seconds.

    TEXT (``text``, one streamed token), END (``finish_reason``, ``usage``: the server's
    token counts when it sent them) or ERROR (``error``).
    """

    kind: str
    at_s: float
    text: str = ''
    finish_reason: Optional[str] = None
    usage: Optional[dict] = None
    error: Optional[RemoteError] = None


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """An API base URL split for http.client: ``http://host:port/v1``."""

    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> 'Endpoint':
        """Return the Endpoint of ``url`` (ValueError when it is not http(s)://host...)."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ('http', 'https') or not parts.hostname:
            raise ValueError(f'remote_url must be http(s)://host[:port]/path, got {url!r}')
        port = parts.port or (443 if parts.scheme == 'https' else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip('/'))

    def connection(self, timeout_s: float) -> http.client.HTTPConnection:
        """Return an unopened connection whose connect waits at most ``timeout_s``."""
        kind = (http.client.HTTPSConnection if self.scheme == 'https'
                else http.client.HTTPConnection)
        return kind(self.host, self.port, timeout=timeout_s)


def _error_of(exc: BaseException, what: str) -> RemoteError:
    """Return the RemoteError of a socket-level failure ``exc`` while ``what``."""
    if isinstance(exc, RemoteError):
        return exc
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return RemoteError(TIMEOUT, f'timed out {what}')
    if isinstance(exc, (ConnectionRefusedError, socket.gaierror)):
        return RemoteError(UNREACHABLE, f'unreachable {what}: {exc}')
    if isinstance(exc, (http.client.IncompleteRead, http.client.RemoteDisconnected,
                        ConnectionResetError, BrokenPipeError)):
        return RemoteError(STREAM_CUT, f'connection cut {what}: {type(exc).__name__}')
    if isinstance(exc, OSError):
        return RemoteError(UNREACHABLE, f'{what}: {type(exc).__name__}: {exc}')
    return RemoteError(HTTP, f'{what}: {type(exc).__name__}: {exc}')


def _status_error(response) -> RemoteError:
    """Return the RemoteError of a non-200 response (its body's first 200 characters)."""
    try:
        body = response.read(2000).decode('utf-8', 'replace').strip()
    except Exception:  # the body is only the message's detail
        body = ''
    kind = BUSY if response.status in (429, 503) else HTTP
    return RemoteError(kind, f'HTTP {response.status} {response.reason}: {body[:200]}')


def _shut(sock) -> None:
    """Shut ``sock`` down (a blocked read on another thread returns at once); never raises."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected, or already closed
        pass


class _Watchdog:
    """Shuts ``sock`` down ``timeout_s`` seconds from now unless cancelled first.

    A total deadline: a socket's own timeout restarts with every byte, so a server dripping
    bytes never reaches it. A read blocked on another thread then returns at once.
    """

    def __init__(self, sock, timeout_s: float):
        self.expired = False
        self._timer = threading.Timer(timeout_s, self._expire, args=(sock,))
        self._timer.daemon = True
        self._timer.start()

    def _expire(self, sock) -> None:
        self.expired = True
        _shut(sock)

    def cancel(self) -> None:
        """Stop the watch (the deadline's work is done)."""
        self._timer.cancel()


def get_json(endpoint: Endpoint, path: str, timeout_s: float):
    """GET ``endpoint.base_path + path`` and return its JSON body (RemoteError on failure).

    timeout_s bounds the connect, and then the request, headers and body together; the body
    is read up to ``MAX_BODY_BYTES``.
    """
    connection = endpoint.connection(timeout_s)
    watchdog = None
    try:
        connection.connect()
        watchdog = _Watchdog(connection.sock, timeout_s)
        connection.request('GET', endpoint.base_path + path)
        response = connection.getresponse()
        if response.status != 200:
            raise _status_error(response)
        body = response.read(MAX_BODY_BYTES + 1)
        if len(body) > MAX_BODY_BYTES:
            raise RemoteError(HTTP, f'GET {path}: the body is over {MAX_BODY_BYTES} bytes')
        return json.loads(body)
    except Exception as exc:
        if watchdog is not None and watchdog.expired:
            raise RemoteError(TIMEOUT, f'GET {path} took over {timeout_s} s') from exc
        raise _error_of(exc, f'at GET {path}') from exc
    finally:
        if watchdog is not None:
            watchdog.cancel()
        connection.close()


def excerpt(value, n_chars: int = 80) -> str:
    """Return ``repr(value)`` cut to ``n_chars`` characters (for error messages)."""
    text = repr(value)
    return text if len(text) <= n_chars else text[:n_chars] + '...'


class CompletionStream:
    """One streamed request (``stream: true``) read on a thread of its own.

    endpoint: where. path: the API's endpoint (``/completions``, ``/chat/completions``,
    ...). body: the request (``stream`` is set here). parse(data) -> (texts, finish_reason,
    usage): the API's reading of one ``data:`` line (server/backends' WireFormat.parse_chunk);
    end_marker: the ``data:`` line that ends the stream (OpenAI's ``[DONE]``; None: the
    connection's end). connect_timeout_s: the longest the connection may take to
    open; idle_timeout_s: the longest the engine may stay silent once it is open (a prompt's
    prefill included); the response's headers must have arrived ``connect_timeout_s +
    idle_timeout_s`` after the connect. ``events`` receives StreamEvents: TEXT per token,
    then one END or one ERROR. :meth:`close` ends the request at once from any thread (the
    engines abort a generation whose client disconnects): the reader thread ends and
    nothing is queued after it; a request closed before its connection opened is not sent.
    """

    def __init__(self, endpoint: Endpoint, path: str, body: dict, connect_timeout_s: float,
                 idle_timeout_s: float, clock=time.monotonic, *, parse,
                 end_marker: Optional[bytes] = b'[DONE]'):
        self.endpoint, self.path = endpoint, path
        self.parse, self.end_marker = parse, end_marker
        self.body = dict(body, stream=True)
        self.connect_timeout_s, self.idle_timeout_s = connect_timeout_s, idle_timeout_s
        self.clock = clock
        self.events = queue.SimpleQueue()
        self.sent_s = None  # when the request was written, monotonic seconds
        self._closed = threading.Event()
        self._sock = None  # the connection's socket once open (kept past http.client's)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name='timebill-remote', daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        """Return True once :meth:`close` was called."""
        return self._closed.is_set()

    @property
    def reading(self) -> bool:
        """Return whether the reader thread still runs."""
        return self._thread.is_alive()

    def close(self) -> None:
        """End the request now: shut the socket down so the engine sees the client leave.

        Only a shutdown here: the reader thread, whose blocked read returns at once, closes
        the connection (closing its buffered reader from this thread would wait for the
        read to end).
        """
        self._closed.set()
        with self._lock:
            sock = self._sock
        if sock is not None:
            _shut(sock)

    def join(self, timeout_s: float = 1.0) -> None:
        """Wait for the reader thread to end (after END, ERROR or :meth:`close`)."""
        self._thread.join(timeout_s)

    def _put(self, kind: str, **fields) -> None:
        if not self._closed.is_set():
            self.events.put(StreamEvent(kind, self.clock(), **fields))

    def _read(self) -> None:
        what = f'at {self.endpoint.host}:{self.endpoint.port}'
        headers_s = self.connect_timeout_s + self.idle_timeout_s
        connection, watchdog = None, None
        try:
            connection = self.endpoint.connection(self.connect_timeout_s)
            if self._closed.is_set():
                return
            connection.connect()
            with self._lock:
                self._sock = connection.sock
            if self._closed.is_set():  # closed while connecting: send nothing
                return
            watchdog = _Watchdog(connection.sock, headers_s)
            self._send(connection)
            response = connection.getresponse()
            watchdog.cancel()
            if response.status != 200:
                raise _status_error(response)
            self._read_events(response)
        except Exception as exc:
            if watchdog is not None and watchdog.expired:
                exc = RemoteError(TIMEOUT, f'no response headers within {headers_s} s')
            if not self._closed.is_set():
                self._put(ERROR, error=_error_of(exc, what))
        finally:
            if watchdog is not None:
                watchdog.cancel()
            with self._lock:
                self._sock = None
            if connection is not None:
                connection.close()

    def _send(self, connection) -> None:
        connection.sock.settimeout(self.idle_timeout_s)
        payload = json.dumps(self.body).encode('utf-8')
        connection.request('POST', self.endpoint.base_path + self.path, body=payload,
                           headers={'Content-Type': 'application/json',
                                    'Accept': 'text/event-stream'})
        self.sent_s = self.clock()

    def _read_events(self, response) -> None:
        """Read the server-sent events until the end marker; TEXT per token, then END."""
        finish, usage = None, None
        while not self._closed.is_set():
            line = response.readline(MAX_LINE_BYTES + 1)
            if len(line) > MAX_LINE_BYTES:
                raise RemoteError(HTTP, f'a stream line is over {MAX_LINE_BYTES} bytes')
            if not line:
                if finish is None:
                    raise RemoteError(STREAM_CUT, 'the stream ended before the answer did')
                break
            line = line.strip()
            if not line.startswith(b'data:'):
                continue
            data = line[5:].strip()
            if self.end_marker is not None and data == self.end_marker:
                break
            texts, reason, chunk_usage = self.parse(data)
            usage = chunk_usage or usage
            finish = reason or finish
            for text in texts:
                self._put(TEXT, text=text)
        if finish is None and not self._closed.is_set():
            raise RemoteError(STREAM_CUT, 'the stream ended without a finish_reason')
        self._put(END, finish_reason=finish, usage=usage)
