"""Talking to a trace agent: a small HTTP/1.1 client whose every request is bounded.

Each request has one deadline for connect + send + receive (not a timeout per
socket read: a reply trickled a byte at a time still ends at the deadline),
and a reply is read only up to ``MAX_REPLY_SIZE`` bytes of body and
``MAX_HEAD_SIZE`` bytes of status line and headers: agent replies are small,
and anything larger is refused unread (``Reply.too_large``).

A failed request says whether the whole request body had been handed to the
kernel (``RequestFailed.body_sent``): after that point the agent may have the
payload even though no reply came, so a writer must not count it as lost; and
whether it ran into its deadline (``RequestFailed.timed_out``): an agent still
reading or answering, which a resend would give a second copy.
"""

from __future__ import annotations

import ipaddress
import os
import select
import socket
import threading
import time
import urllib.error
import urllib.parse
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple, Union

from .encoder import payload_headers

#: The largest reply body read; a longer one is refused (``Reply.too_large``).
MAX_REPLY_SIZE = 1 << 20
#: The largest status line + headers read; a longer head fails the request.
MAX_HEAD_SIZE = 64 << 10
#: The agent's port when a URL names none.
DEFAULT_AGENT_PORT = 8126
DEFAULT_AGENT_URL = "http://localhost:8126"
DEFAULT_AGENT_SOCKET = "/var/run/datadog/apm.socket"

_READ_CHUNK = 64 << 10


class RequestFailed(urllib.error.URLError):
    """No usable reply came.  ``body_sent``: the whole request had been sent;
    ``timed_out``: the request's deadline ended it (rather than the agent
    closing, resetting or answering something that is no HTTP reply).

    A ``urllib.error.URLError`` (so an ``OSError``), as ``send()`` raised when
    it was built on urllib; ``reason`` is the underlying error (for instance
    ``ConnectionRefusedError``) or a message.
    """

    def __init__(self, reason: Union[str, BaseException], body_sent: bool, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.body_sent = body_sent
        self.timed_out = timed_out

    def __str__(self) -> str:
        reason = self.reason
        if isinstance(reason, BaseException):
            return "%s: %s" % (type(reason).__name__, reason)
        return str(reason)


class ReplyTooLarge(OSError):
    """Raised by :func:`send` for a reply body over ``MAX_REPLY_SIZE``."""


class Reply(NamedTuple):
    status: int
    body: bytes
    #: The body was over MAX_REPLY_SIZE and was not read (``body`` is empty).
    too_large: bool = False


class AgentAddress(NamedTuple):
    scheme: str  # "http", "https" or "unix"
    host: str  # for the Host header (and the TCP connect)
    port: int  # 0 for unix
    socket_path: str  # unix only
    base_path: str  # a path prefix from the URL ("" or "/prefix"), put in front of every request path


def parse_agent_url(url: str, what: str = "agent URL") -> AgentAddress:
    """Check ``url`` (``http://host[:port][/prefix]``, ``https://...``, ``unix:///path``).

    A missing port is the agent's, 8126 (443 for https); a path is kept as a
    prefix of every request path (an agent behind a proxy).  Query strings,
    fragments and user info are refused: they would be silently ignored.
    """
    if not isinstance(url, str):
        raise TypeError("%s must be a str, not %s" % (what, type(url).__name__))
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError as error:
        raise ValueError("%s %r: %s" % (what, url, error)) from None
    if parts.query or parts.fragment:
        raise ValueError("%s %r: a query or fragment has no meaning for a trace agent" % (what, url))
    if parts.scheme == "unix":
        path = parts.path or parts.netloc
        if not path or (parts.netloc and parts.path):
            raise ValueError("%s %r: expected unix:///path/to/socket" % (what, url))
        return AgentAddress("unix", "localhost", 0, path, "")
    if parts.scheme not in ("http", "https"):
        raise ValueError("%s %r: the scheme must be http, https or unix" % (what, url))
    if parts.username is not None or parts.password is not None:
        raise ValueError("%s %r: user info is not supported" % (what, url))
    if not parts.hostname:
        raise ValueError("%s %r names no host" % (what, url))
    if ":" in parts.hostname:  # Python < 3.11 does not check a bracketed IPv6 literal
        try:
            ipaddress.IPv6Address(parts.hostname.split("%", 1)[0])
        except ValueError:
            raise ValueError("%s %r: %r is not an IPv6 address" % (what, url, parts.hostname)) from None
    if port is None:
        port = DEFAULT_AGENT_PORT if parts.scheme == "http" else 443
    if port == 0:
        raise ValueError("%s %r: port 0" % (what, url))
    return AgentAddress(parts.scheme, parts.hostname, port, "", parts.path.rstrip("/"))


def agent_url_from_env(environ: Optional[Mapping[str, str]] = None) -> str:
    """The trace agent's URL as a tracer configured by the environment finds it.

    ``DD_TRACE_AGENT_URL`` if set; else ``DD_AGENT_HOST`` / ``DD_TRACE_AGENT_PORT``
    (either one set; defaults localhost and 8126); else the agent's Unix socket
    if it exists; else ``http://localhost:8126``.  A bad value raises
    ``ValueError`` naming the variable and its value.
    """
    env = os.environ if environ is None else environ
    url = env.get("DD_TRACE_AGENT_URL", "").strip()
    if url:
        parse_agent_url(url, "DD_TRACE_AGENT_URL")
        return url
    host = env.get("DD_AGENT_HOST", "").strip()
    port_text = env.get("DD_TRACE_AGENT_PORT", "").strip()
    if host or port_text:
        port = DEFAULT_AGENT_PORT
        if port_text:
            try:
                port = int(port_text, 10)
            except ValueError:
                port = -1
            if not 0 < port < 65536:
                raise ValueError("DD_TRACE_AGENT_PORT=%r: expected a port number, 1 to 65535" % (port_text,))
        host = host or "localhost"
        if ":" in host and not host.startswith("["):
            host = "[%s]" % host  # an IPv6 literal
        url = "http://%s:%d" % (host, port)
        try:
            address = parse_agent_url(url, "DD_AGENT_HOST")
        except ValueError:
            address = None
        if address is None or address.base_path or address.port != port:
            raise ValueError(
                "DD_AGENT_HOST=%r: expected a host name or IP address only (no scheme, port or path); "
                "the port goes in DD_TRACE_AGENT_PORT (default %d), a whole URL in DD_TRACE_AGENT_URL"
                % (env.get("DD_AGENT_HOST", ""), DEFAULT_AGENT_PORT)
            )
        return url
    if os.path.exists(DEFAULT_AGENT_SOCKET):
        return "unix://" + DEFAULT_AGENT_SOCKET
    return DEFAULT_AGENT_URL


class AgentConnection:
    """One kept-alive connection to an agent; :meth:`request` reconnects as needed."""

    def __init__(self, address: AgentAddress) -> None:
        self.address = address
        self.host = address.host
        self.port = address.port
        self._sock: Optional[socket.socket] = None
        self._leftover = b""
        self._lookup: Optional[_NameLookup] = None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._leftover = b""
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def request(
        self, method: str, path: str, body: Optional[bytes], headers: Mapping[str, str], deadline: float
    ) -> Reply:
        """One request, all of it by ``deadline`` (``time.monotonic()``); raises RequestFailed."""
        body_sent = False
        try:
            sock = self._reusable_socket()
            if sock is None:
                sock = self._sock = self._connect(deadline)
            head = self._request_head(method, path, body, headers)
            _send_all(sock, head, deadline)
            if body:
                _send_all(sock, body, deadline)
            body_sent = True
            reply, keep = self._read_reply(sock, method, deadline)
        except RequestFailed:
            self.close()
            raise
        except (OSError, ValueError) as error:
            self.close()
            raise RequestFailed(error, body_sent, isinstance(error, socket.timeout)) from error
        except BaseException:
            self.close()
            raise
        if not keep:
            self.close()
        return reply

    def _reusable_socket(self) -> Optional[socket.socket]:
        sock = self._sock
        if sock is None:
            return None
        # An idle kept-alive connection the agent closed (or wrote to) is
        # readable: reconnect, rather than send a payload into it.
        try:
            readable = select.select([sock], [], [], 0)[0]
        except (OSError, ValueError):
            readable = [sock]
        if readable or self._leftover:
            self.close()
            return None
        return sock

    def _connect(self, deadline: float) -> socket.socket:
        address = self.address
        remaining = _remaining(deadline)
        if address.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(remaining)
                sock.connect(address.socket_path)
            except BaseException:
                sock.close()
                raise
            return sock
        sock = self._connect_tcp(deadline)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if address.scheme == "https":
                import ssl

                sock.settimeout(_remaining(deadline))
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=address.host)
        except BaseException:
            sock.close()
            raise
        return sock

    def _connect_tcp(self, deadline: float) -> socket.socket:
        """A connected TCP socket to the agent, by ``deadline``: each address
        the host name has, in turn, as ``socket.create_connection`` does."""
        errors: List[OSError] = []
        for family, kind, proto, _name, socket_address in self._addresses(deadline):
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(_remaining(deadline))
                sock.connect(socket_address)
            except OSError as error:
                sock.close()
                errors.append(error)
                continue
            except BaseException:
                sock.close()
                raise
            return sock
        if errors:
            try:
                raise errors[-1]
            finally:
                # The list holds the exception, whose traceback holds this
                # frame: without this the cycle (and the request's payload in
                # the frames above) would live until a garbage collection.
                errors.clear()
        raise OSError("%s has no address to connect to" % self.address.host)

    def _addresses(self, deadline: float) -> List[Tuple[Any, ...]]:
        """What getaddrinfo() says for the agent's host, by ``deadline``.

        getaddrinfo() takes no timeout (a resolver that does not answer holds
        it for as long as its own retries last), so a name other than an IP
        address is looked up on a thread of its own, waited for until the
        deadline.  A lookup still going then is kept: the next request waits
        for (or takes the answer of) the same one instead of starting
        another, so one connection never has more than one lookup thread."""
        host, port = self.address.host, self.address.port
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:  # an IP address: getaddrinfo() answers without asking anyone
            return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        lookup = self._lookup
        if lookup is None:
            try:
                lookup = self._lookup = _NameLookup(host, port)
            except RuntimeError:  # no new threads (the interpreter is shutting down): look up here
                return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        if not lookup.done.wait(_remaining(deadline)):
            raise socket.timeout("looking up %r took longer than the request's deadline" % host)
        self._lookup = None
        if lookup.error is not None:
            try:
                raise lookup.error
            finally:
                del lookup  # (the same cycle, through the lookup's reference to its error)
        return lookup.addresses

    def _request_head(self, method: str, path: str, body: Optional[bytes], headers: Mapping[str, str]) -> bytes:
        lines = ["%s %s%s HTTP/1.1" % (method, self.address.base_path, path), "Host: %s" % self._host_header()]
        lines.append("Content-Length: %d" % (len(body) if body else 0))
        for name, value in headers.items():
            if "\r" in name or "\n" in name or "\r" in str(value) or "\n" in str(value):
                raise ValueError("header %r: line breaks are not allowed" % (name,))
            lines.append("%s: %s" % (name, value))
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _host_header(self) -> str:
        address = self.address
        if address.scheme == "unix":
            return "localhost"
        host = "[%s]" % address.host if ":" in address.host else address.host
        return "%s:%d" % (host, address.port)

    def _read_reply(self, sock: socket.socket, method: str, deadline: float) -> Tuple[Reply, bool]:
        reader = _Reader(sock, deadline)
        head = reader.read_until(b"\r\n\r\n", MAX_HEAD_SIZE)
        status, version, reply_headers = _parse_head(head)
        keep = version == "HTTP/1.1" and "close" not in reply_headers.get("connection", "").lower()
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return Reply(status, b""), keep and 200 <= status
        encoding = reply_headers.get("transfer-encoding", "").lower()
        if "chunked" in encoding:
            body, too_large = reader.read_chunked(MAX_REPLY_SIZE)
            return Reply(status, b"" if too_large else body, too_large), keep and not too_large
        length_text = reply_headers.get("content-length")
        if length_text is None:
            body, too_large = reader.read_to_close(MAX_REPLY_SIZE)
            return Reply(status, b"" if too_large else body, too_large), False
        try:
            length = int(length_text, 10)
        except ValueError:
            length = -1
        if length < 0:
            raise ValueError("bad Content-Length %r" % (length_text[:40],))
        if length > MAX_REPLY_SIZE:
            return Reply(status, b"", True), False
        return Reply(status, reader.read_exact(length)), keep


class _NameLookup:
    """One getaddrinfo() for a host, on a daemon thread (see ``AgentConnection._addresses``)."""

    def __init__(self, host: str, port: int) -> None:
        self.done = threading.Event()
        self.addresses: List[Tuple[Any, ...]] = []
        self.error: Optional[OSError] = None
        thread = threading.Thread(
            target=self._run, args=(host, port), name="spanpack-agent-lookup", daemon=True
        )
        thread.start()

    def _run(self, host: str, port: int) -> None:
        try:
            self.addresses = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        except OSError as error:
            # Without its traceback (this frame): kept with one, the error
            # would hold this frame, which holds self, which holds the error.
            self.error = error.with_traceback(None)
        except BaseException as error:  # (UnicodeError is a ValueError: a host name IDNA refuses)
            self.error = OSError("looking up %r failed: %s: %s" % (host, type(error).__name__, error))
        finally:
            self.done.set()


class _Reader:
    """Reads from a socket, each recv bounded by what is left of one deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buffer = b""

    def _more(self) -> None:
        self.sock.settimeout(_remaining(self.deadline))
        data = self.sock.recv(_READ_CHUNK)
        if not data:
            raise ConnectionError("the agent closed the connection before the reply ended")
        self.buffer += data

    def read_until(self, marker: bytes, limit: int) -> bytes:
        while True:
            end = self.buffer.find(marker)
            if end >= 0:
                data, self.buffer = self.buffer[:end], self.buffer[end + len(marker) :]
                return data
            if len(self.buffer) > limit:
                raise ValueError("reply head or chunk line over %d bytes" % limit)
            self._more()

    def read_exact(self, length: int) -> bytes:
        while len(self.buffer) < length:
            self._more()
        data, self.buffer = self.buffer[:length], self.buffer[length:]
        return data

    def read_chunked(self, limit: int) -> Tuple[bytes, bool]:
        parts: List[bytes] = []
        total = 0
        for _ in range(1 << 20):  # a bound on the number of chunks, besides their size
            line = self.read_until(b"\r\n", 1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise ValueError("bad chunk size line %r" % (line[:40],)) from None
            if size < 0:
                raise ValueError("bad chunk size %d" % size)
            if size == 0:
                for _ in range(100):  # trailers
                    if not self.read_until(b"\r\n", 1024):
                        return b"".join(parts), False
                raise ValueError("too many trailers")
            total += size
            if total > limit:
                return b"", True
            parts.append(self.read_exact(size))
            if self.read_exact(2) != b"\r\n":
                raise ValueError("a chunk does not end with CRLF")
        return b"", True

    def read_to_close(self, limit: int) -> Tuple[bytes, bool]:
        while len(self.buffer) <= limit:
            self.sock.settimeout(_remaining(self.deadline))
            data = self.sock.recv(_READ_CHUNK)
            if not data:
                return self.buffer, False
            self.buffer += data
        return b"", True


def _parse_head(head: bytes) -> Tuple[int, str, Dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or len(status_line[1]) != 3:
        raise ValueError("not an HTTP reply: %r" % (lines[0][:60],))
    try:
        status = int(status_line[1], 10)
    except ValueError:
        raise ValueError("not an HTTP status: %r" % (lines[0][:60],)) from None
    if not 100 <= status < 600:
        raise ValueError("not an HTTP status: %r" % (lines[0][:60],))
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError("bad header line %r" % (line[:60],))
        headers[name.strip().lower()] = value.strip()
    return status, status_line[0], headers


def _remaining(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise socket.timeout("the request's deadline passed")
    return remaining


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    # sendall's timeout bounds the whole call (Python >= 3.5), not each send.
    sock.settimeout(_remaining(deadline))
    sock.sendall(data)


def agent_connection(url: str, timeout: float = 0.0) -> AgentConnection:
    """An unopened connection to ``url`` (see :func:`parse_agent_url`)."""
    return AgentConnection(parse_agent_url(url))


def send(
    payload: bytes,
    trace_count: int,
    url: str = "http://127.0.0.1:8126/v0.4/traces",
    *,
    headers: Optional[Dict[str, str]] = None,
    timeout: float = 10.0,
) -> Tuple[int, bytes]:
    """PUT one payload to ``url`` (the agent's ``/v0.4/traces``, ``/v0.5/traces`` or ``/v1.0/traces``).

    Returns ``(status, body)``; HTTP errors are returned, not raised, so a
    writer can log the agent's reason (e.g. 400 on a payload it cannot decode).

    ``timeout`` bounds the whole request (connect, send, reply).  Raises
    :class:`RequestFailed`, a ``urllib.error.URLError`` (an ``OSError``), when
    no reply came (connection refused, reset, the deadline): its ``reason`` is
    the underlying error, its ``body_sent`` says whether the payload had been
    sent whole.  A reply body over ``MAX_REPLY_SIZE`` (1 MiB) raises
    :class:`ReplyTooLarge`, also an ``OSError``, unread.
    """
    address = parse_agent_url(url)
    all_headers = payload_headers(trace_count)
    if headers:
        all_headers.update(headers)
    base = address._replace(base_path="")
    connection = AgentConnection(base)
    try:
        reply = connection.request("PUT", address.base_path or "/", payload, all_headers, time.monotonic() + timeout)
    finally:
        connection.close()
    if reply.too_large:
        raise ReplyTooLarge("the agent's reply is over %d bytes" % MAX_REPLY_SIZE)
    return reply.status, reply.body
