"""A streaming client of an OpenAI-compatible completions API (llama.cpp's server, vLLM).

Why the standard library and not the ``openai`` package: a goal's thread must end a request
at its deadline from outside the blocking read (Kill, cancel), see each streamed token when
it arrives, and tell a refused connection from a timeout, a 429/503 and a stream cut short.
``http.client`` on a reader thread whose socket :meth:`CompletionStream.close` shuts down
does all of that in ~150 lines with no new dependency on the robot; the ``openai`` client's
retries and pooled connections would each have to be turned off for it.

Every event carries the monotonic time the reader saw it, so the time to the first token and
the steps are measured where they arrive, not when the goal's thread polls.
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


def get_json(endpoint: Endpoint, path: str, timeout_s: float) -> dict:
    """GET ``endpoint.base_path + path`` and return its JSON body (RemoteError on failure)."""
    connection = endpoint.connection(timeout_s)
    try:
        connection.request('GET', endpoint.base_path + path)
        response = connection.getresponse()
        if response.status != 200:
            raise _status_error(response)
        return json.loads(response.read())
    except Exception as exc:
        raise _error_of(exc, f'at GET {path}') from exc
    finally:
        connection.close()


def list_models(endpoint: Endpoint, timeout_s: float) -> list:
    """Return the model ids the server's ``/models`` lists."""
    return [entry['id'] for entry in get_json(endpoint, '/models', timeout_s).get('data', [])]


class CompletionStream:
    """One streamed request (``stream: true``) read on a thread of its own.

    endpoint: where. path: ``/completions`` or ``/chat/completions``. body: the request
    (``stream`` is set here). connect_timeout_s: the longest the connection may take to
    open; idle_timeout_s: the longest the engine may stay silent once it is open (a prompt's
    prefill included). ``events`` receives StreamEvents: TEXT per token, then one END or
    one ERROR. :meth:`close` ends the request at once from any thread (the engines abort a
    generation whose client disconnects); nothing is queued after it.
    """

    def __init__(self, endpoint: Endpoint, path: str, body: dict, connect_timeout_s: float,
                 idle_timeout_s: float, clock=time.monotonic):
        self.endpoint, self.path = endpoint, path
        self.body = dict(body, stream=True)
        self.connect_timeout_s, self.idle_timeout_s = connect_timeout_s, idle_timeout_s
        self.clock = clock
        self.events = queue.SimpleQueue()
        self.sent_s = None  # when the request was written, monotonic seconds
        self._closed = threading.Event()
        self._connection = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name='timebill-remote', daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        """Return True once :meth:`close` was called."""
        return self._closed.is_set()

    def close(self) -> None:
        """End the request now: shut the socket down so the engine sees the client leave."""
        self._closed.set()
        with self._lock:
            connection = self._connection
        if connection is not None and connection.sock is not None:
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed by the other side
                pass
            connection.close()

    def join(self, timeout_s: float = 1.0) -> None:
        """Wait for the reader thread to end (after END, ERROR or :meth:`close`)."""
        self._thread.join(timeout_s)

    def _put(self, kind: str, **fields) -> None:
        if not self._closed.is_set():
            self.events.put(StreamEvent(kind, self.clock(), **fields))

    def _read(self) -> None:
        what = f'at {self.endpoint.host}:{self.endpoint.port}'
        try:
            self._open()
            response = self._connection.getresponse()
            if response.status != 200:
                raise _status_error(response)
            self._read_events(response)
        except Exception as exc:
            if not self._closed.is_set():
                self._put(ERROR, error=_error_of(exc, what))
        finally:
            with self._lock:
                connection, self._connection = self._connection, None
            if connection is not None:
                connection.close()

    def _open(self) -> None:
        connection = self.endpoint.connection(self.connect_timeout_s)
        with self._lock:
            if self._closed.is_set():
                raise RemoteError(HTTP, 'closed before it was sent')
            self._connection = connection
        connection.connect()
        connection.sock.settimeout(self.idle_timeout_s)
        payload = json.dumps(self.body).encode('utf-8')
        connection.request('POST', self.endpoint.base_path + self.path, body=payload,
                           headers={'Content-Type': 'application/json',
                                    'Accept': 'text/event-stream'})
        self.sent_s = self.clock()

    def _read_events(self, response) -> None:
        """Read the server-sent events until ``[DONE]``; TEXT per token, then END."""
        finish, usage = None, None
        while not self._closed.is_set():
            line = response.readline()
            if not line:
                if finish is None:
                    raise RemoteError(STREAM_CUT, 'the stream ended before the answer did')
                break
            line = line.strip()
            if not line.startswith(b'data:'):
                continue
            data = line[5:].strip()
            if data == b'[DONE]':
                break
            chunk = json.loads(data)
            if 'error' in chunk:
                raise RemoteError(HTTP, f'the engine reported: {chunk["error"]}')
            usage = chunk.get('usage') or usage
            for choice in chunk.get('choices') or ():
                text = choice.get('text')
                if text is None:  # the chat endpoint's delta; its role chunk is no token
                    text = (choice.get('delta') or {}).get('content') or None
                if choice.get('finish_reason'):
                    finish = choice['finish_reason']
                    if text:
                        self._put(TEXT, text=text)
                elif text is not None:
                    self._put(TEXT, text=text)
        if finish is None and not self._closed.is_set():
            raise RemoteError(STREAM_CUT, 'the stream ended without a finish_reason')
        self._put(END, finish_reason=finish, usage=usage)
