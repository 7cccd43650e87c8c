"""A trace intake on 127.0.0.1 that fails on purpose, for the AgentWriter tests.

It speaks just enough HTTP/1.1 (keep-alive, Content-Length bodies) to be a
trace agent: ``GET /info`` lists the endpoints it was given, and a trace
``PUT`` is answered by the next action of its script (then by ``rule``, then
200).  Actions:

``"ok"``                 200 ``{"rate_by_service": {...}}``
``("status", code)``     that status, with a short text body
``"reset_before_body"``  reset the connection once the headers are read
``"reset_after_body"``   read the whole body, then reset without answering
``"close_after_body"``   read the whole body, then close (an orderly FIN)
                         without answering: a proxy whose upstream failed
``"slow"``               read the body and answer nothing until ``release()``
                         (or 10 s), then close
``"garbage"``            read the body, answer bytes that are not HTTP, close
``"truncated"``          read the body, answer half a status line, close
``"trickle"``            read the body, answer a status line and then one
                         header byte every 50 ms (at most 10 s), never ending
``"huge"``               read the body, answer 200 with an endless chunked body
                         (until the client goes, at most 64 MiB)
``"deep_json"``          read the body, answer 200 with JSON nested 100,000 deep
``"ok_then_close"``      answer 200 (keep-alive as far as the client can tell),
                         then close the connection: an agent's idle timeout

``info_body`` (bytes), when set, is the ``/info`` reply's body instead of the
endpoints.  A payload counts as accepted when a 2xx answer was begun for it
(``"huge"``, ``"deep_json"``, ``"ok"``); ``kept`` also has the ones read whole
and not refused with a status (the agent may have kept those).

Every payload body the server read whole is decoded (v0.4, v0.5, and v1.0
with tests/v10_decoder.py) into
``received`` (with its bytes as ``body`` when ``keep_bodies`` is set); those
it answered with 2xx also go to ``accepted``.  A writer's
delivered traces are exactly the accepted ones.

With ``upstream`` (an agent's base URL) the server is a proxy in front of
that agent: a trace request whose action is ``"ok"`` is forwarded there and
the agent's reply relayed (recorded as accepted when it is a 2xx); the other
actions are the proxy's own faults, the upstream never sees those requests.

``refusing_url()`` gives an address where connections are refused: a bound
TCP socket that never listens.
"""

from __future__ import annotations

import collections
import http.client
import json
import socket
import struct
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple, Union

import msgpack

from tests.v10_decoder import decode as v10_decode

HOST = "127.0.0.1"
#: A bound on everything that waits, so a broken test fails instead of hanging.
IO_TIMEOUT = 10.0
RATES = {"rate_by_service": {"service:,env:": 1.0}}

Action = Union[str, Tuple[str, int]]


class Payload:
    """One decoded trace payload."""

    def __init__(self, path: str, headers: Dict[str, str], body: bytes, keep_body: bool = False) -> None:
        self.path = path
        self.headers = headers
        self.size = len(body)
        #: the payload's bytes, when the server keeps them (``keep_bodies``)
        self.body: Optional[bytes] = body if keep_body else None
        #: (trace_id, span count) per trace
        self.traces: List[Tuple[int, int]] = decode_traces(path, body)

    @property
    def trace_ids(self) -> List[int]:
        return [trace_id for trace_id, _ in self.traces]


def decode_traces(path: str, body: bytes) -> List[Tuple[int, int]]:
    if path == "/v0.5/traces":
        _strings, traces = msgpack.unpackb(body, raw=False, strict_map_key=False)
        return [(trace[0][3], len(trace)) for trace in traces]
    if path == "/v0.4/traces":
        traces = msgpack.unpackb(body, raw=False, strict_map_key=False)
        return [(trace[0]["trace_id"], len(trace)) for trace in traces]
    if path == "/v1.0/traces":
        chunks = v10_decode(body).get(11, [])
        # The trace id's low 64 bits, as v0.4 and v0.5 carry them.
        return [(int.from_bytes(chunk.get(6, bytes(16))[8:], "big"), len(chunk.get(4, ())))
                for chunk in chunks]
    return []  # a version this helper does not decode


class FaultServer:
    def __init__(self, endpoints: Sequence[str] = ("/v0.4/traces", "/v0.5/traces"),
                 upstream: Optional[str] = None) -> None:
        self.endpoints = list(endpoints)
        self.upstream = upstream
        self.info_status = 200
        self.script: Deque[Action] = collections.deque()
        #: Called with (path, Payload or None) when the script is empty; None means "ok".
        self.rule: Optional[Callable[[str, Optional[Payload]], Optional[Action]]] = None
        self.received: List[Payload] = []
        self.accepted: List[Payload] = []
        self.kept: List[Payload] = []
        self.info_body: Optional[bytes] = None
        #: keep each payload's bytes (Payload.body) for tests that decode them whole
        self.keep_bodies = False
        self.requests: List[str] = []  # paths of the trace PUTs whose headers were read
        self.connections = 0
        self.errors: List[str] = []
        self.port = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._release = threading.Event()
        self._listener: Optional[socket.socket] = None
        self._holder: Optional[socket.socket] = None
        self._accept_thread: Optional[threading.Thread] = None
        self._open: List[socket.socket] = []
        # Connections in the middle of a request (head read, answer not yet sent),
        # and connections stop() has cut: see stop().
        self._busy: set = set()
        self._cut: set = set()
        self._threads: List[threading.Thread] = []
        self._running = False

    @property
    def url(self) -> str:
        return "http://%s:%d" % (HOST, self.port)

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> "FaultServer":
        """Listen (on the same port again after stop())."""
        listener = _port_socket(self.port)
        listener.listen(64)
        listener.settimeout(0.05)  # the accept loop polls its stop flag
        self.port = listener.getsockname()[1]
        self._listener = listener
        # The port was held since stop(); now the listener has it too.
        holder, self._holder = self._holder, None
        if holder is not None:
            holder.close()
        self._running = True
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept_thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and close every connection (connects are then refused).

        Idle connections are cut at once.  A request already being handled is
        answered first, as an agent that shuts down does, so that ``accepted``
        stays exactly what the writer was told was delivered: cutting a
        connection between recording a payload and answering it would leave a
        payload the server counts and the writer never hears of.
        """
        self._running = False
        if self._accept_thread is not None:
            self._accept_thread.join(IO_TIMEOUT)
        if self._listener is not None:
            # While stopped the port stays bound, to a socket that does not
            # listen: connects are refused, and no other socket can take the
            # port before start() (a restart cannot fail or reach a stranger).
            if self._holder is None:
                self._holder = _port_socket(self.port)
            self._listener.close()
            self._listener = None
        self._release.set()
        with self._lock:
            conns, self._open = self._open, []
            threads, self._threads = self._threads, []
            idle = [conn for conn in conns if conn not in self._busy]
            self._cut.update(idle)
        for conn in idle:
            try:  # wakes a handler blocked reading this connection
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in threads:
            thread.join(IO_TIMEOUT)
        with self._lock:
            self._cut.clear()
            self._busy.clear()
        self._release.clear()

    def release(self) -> None:
        """Let "slow" requests finish (they close without an answer)."""
        self._release.set()

    def __enter__(self) -> "FaultServer":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop, and give the port up."""
        self.stop()
        holder, self._holder = self._holder, None
        if holder is not None:
            holder.close()

    # -- what arrived --------------------------------------------------------

    def accepted_ids(self) -> List[int]:
        with self._lock:
            return [tid for p in self.accepted for tid in p.trace_ids]

    def received_ids(self) -> List[int]:
        with self._lock:
            return [tid for p in self.received for tid in p.trace_ids]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = IO_TIMEOUT) -> bool:
        """Wait until ``predicate()`` (checked on every request) holds; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    # -- serving -------------------------------------------------------------

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while self._running:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(IO_TIMEOUT)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self._lock:
                self.connections += 1
                self._open.append(conn)
                self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            for _ in range(10_000):  # a bound on one connection's requests
                request = _read_head(reader)
                if request is None:
                    return
                method, path, headers = request
                with self._lock:
                    if conn in self._cut:  # stop() came first: no answer, nothing recorded
                        return
                    self._busy.add(conn)
                try:
                    if not self._handle(conn, reader, method, path, headers):
                        return
                finally:
                    with self._lock:
                        self._busy.discard(conn)
                if not self._running:  # answered; the server is stopping
                    return
        except (OSError, ValueError):
            return
        finally:
            reader.close()
            conn.close()
            with self._changed:
                self._changed.notify_all()

    def _handle(self, conn, reader, method: str, path: str, headers: Dict[str, str]) -> bool:
        length = int(headers.get("content-length", "0"))
        if method == "GET" and path == "/info":
            body = self.info_body if self.info_body is not None else json.dumps({"endpoints": self.endpoints}).encode()
            _reply(conn, self.info_status, body)
            return True
        with self._changed:
            self.requests.append(path)
            action: Optional[Action] = self.script.popleft() if self.script else None
            self._changed.notify_all()
        if action == "reset_before_body":
            _reset(conn)
            return False
        body = _read_exact(reader, length)
        payload = None
        if path in ("/v0.4/traces", "/v0.5/traces", "/v1.0/traces") and method == "PUT":
            payload = Payload(path, headers, body, self.keep_bodies)
            count = headers.get("x-datadog-trace-count")
            if count != str(len(payload.traces)):
                self.errors.append("X-Datadog-Trace-Count %s for %d traces" % (count, len(payload.traces)))
        with self._changed:
            if payload is not None:
                self.received.append(payload)
            if action is None and self.rule is not None:
                action = self.rule(path, payload)
            self._changed.notify_all()
        action = action or "ok"
        refused = isinstance(action, tuple) and not 200 <= action[1] < 300
        if payload is not None and not refused:
            with self._changed:
                self.kept.append(payload)
        if action in ("huge", "deep_json") and payload is not None:
            with self._changed:
                self.accepted.append(payload)
                self._changed.notify_all()
        if action == "reset_after_body":
            _reset(conn)
            return False
        if action == "close_after_body":
            return False  # (_serve closes the connection)
        if action == "slow":
            self._release.wait(IO_TIMEOUT)
            return False
        if action == "garbage":
            conn.sendall(b"\x00\xff this is no HTTP reply\r\n\r\n")
            return False
        if action == "truncated":
            conn.sendall(b"HTTP/1.1 20")
            return False
        if action == "trickle":
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(200):
                if self._release.wait(0.05):
                    break
                conn.sendall(b"X")  # raises once the client has gone
            return False
        if action == "huge":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"%x\r\n%s\r\n" % (1 << 16, b"x" * (1 << 16))
            for _ in range(1024):
                conn.sendall(chunk)  # raises once the client has gone
            return False
        if action == "deep_json":
            _reply(conn, 200, b"[" * 100_000 + b"]" * 100_000)
            return True
        if action == "ok_then_close" and payload is not None:
            with self._changed:
                self.accepted.append(payload)
                self._changed.notify_all()
            _reply(conn, 200, json.dumps(RATES).encode())
            return False
        if action != "ok" and not isinstance(action, tuple):
            # reset_before_body from a rule comes too late (the body is read): a test bug.
            with self._changed:
                self.errors.append("action %r cannot be used here" % (action,))
            return False
        status = 200 if action == "ok" else action[1]
        if payload is None and status == 200:
            status = 404  # not a trace endpoint this server knows
        body_out = json.dumps(RATES).encode() if status == 200 else b"fault server says %d" % status
        if self.upstream is not None and status == 200:
            status, body_out = _forward(self.upstream, method, path, headers, body)
        if 200 <= status < 300:
            # Recorded before the answer, so it is there when the writer learns of it.
            with self._changed:
                self.accepted.append(payload)
                self._changed.notify_all()
        _reply(conn, status, body_out)
        return True


def _forward(upstream: str, method: str, path: str, headers: Dict[str, str], body: bytes) -> Tuple[int, bytes]:
    """One request to the upstream agent; its status and body."""
    host, _, port = upstream.split("://", 1)[1].rstrip("/").partition(":")
    sent = {name: value for name, value in headers.items() if name not in ("host", "content-length", "connection")}
    connection = http.client.HTTPConnection(host, int(port or 80), timeout=IO_TIMEOUT)
    try:
        connection.request(method, path, body=body, headers=sent)
        reply = connection.getresponse()
        return reply.status, reply.read()
    finally:
        connection.close()


def _port_socket(port: int) -> socket.socket:
    """A TCP socket bound to ``port`` on HOST (0: a free one), shareable with
    the other sockets of this server (SO_REUSEPORT) and no one else's."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((HOST, port))
    return sock


def _read_head(reader) -> Optional[Tuple[str, str, Dict[str, str]]]:
    line = reader.readline(65536)
    if not line:
        return None
    method, path, _version = line.decode("latin-1").split(" ", 2)
    headers: Dict[str, str] = {}
    for _ in range(200):
        line = reader.readline(65536)
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return method, path, headers


def _read_exact(reader, length: int) -> bytes:
    body = reader.read(length)
    if len(body) != length:
        raise ValueError("short body")
    return body


def _reply(conn: socket.socket, status: int, body: bytes) -> None:
    head = "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (status, len(body))
    conn.sendall(head.encode("latin-1") + body)


def _reset(conn: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0) rather than an orderly FIN."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    conn.close()


def refusing_url() -> Tuple[socket.socket, str]:
    """A URL where connections are refused, and the socket that holds its port.

    A bound TCP socket that does not listen makes the kernel refuse connects,
    and no other process can take the port while it is held.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((HOST, 0))
    return sock, "http://%s:%d" % (HOST, sock.getsockname()[1])
