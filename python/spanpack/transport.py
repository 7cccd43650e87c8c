"""Sending a payload to a trace agent with the standard library."""

from __future__ import annotations

import http.client
import os
import socket
import urllib.parse
import urllib.request
from typing import Dict, Mapping, Optional, Tuple

from .encoder import payload_headers


def send(
    payload: bytes,
    trace_count: int,
    url: str = "http://127.0.0.1:8126/v0.4/traces",
    *,
    headers: Optional[Dict[str, str]] = None,
    timeout: float = 10.0,
) -> Tuple[int, bytes]:
    """PUT one payload to ``url`` (the agent's ``/v0.4/traces``, ``/v0.5/traces`` or
    ``/v1.0/traces``).

    Returns ``(status, body)``; HTTP errors are returned, not raised, so a
    writer can log the agent's reason (e.g. 400 on a payload it cannot decode).

    Raises ``urllib.error.URLError`` when no agent answers at ``url``
    (connection refused, unknown host, connect timeout), and ``OSError`` such
    as ``TimeoutError`` when the connection fails after that; URLError is an
    OSError, so ``except OSError`` catches both.
    """
    all_headers = payload_headers(trace_count)
    if headers:
        all_headers.update(headers)
    request = urllib.request.Request(url, data=payload, headers=all_headers, method="PUT")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


# -- Agent connections (used by spanpack.AgentWriter) ------------------------

DEFAULT_AGENT_URL = "http://localhost:8126"
DEFAULT_AGENT_SOCKET = "/var/run/datadog/apm.socket"


def agent_url_from_env(environ: Optional[Mapping[str, str]] = None) -> str:
    """The trace agent's URL as a tracer configured by the environment finds it.

    ``DD_TRACE_AGENT_URL`` if set; else ``DD_AGENT_HOST`` / ``DD_TRACE_AGENT_PORT``
    (either one set; defaults localhost and 8126); else the agent's Unix socket
    if it exists; else ``http://localhost:8126``.
    """
    env = os.environ if environ is None else environ
    url = env.get("DD_TRACE_AGENT_URL", "").strip()
    if url:
        return url
    host = env.get("DD_AGENT_HOST", "").strip()
    port = env.get("DD_TRACE_AGENT_PORT", "").strip()
    if host or port:
        host = host or "localhost"
        if ":" in host and not host.startswith("["):  # an IPv6 literal
            host = "[%s]" % host
        return "http://%s:%s" % (host, port or "8126")
    if os.path.exists(DEFAULT_AGENT_SOCKET):
        return "unix://" + DEFAULT_AGENT_SOCKET
    return DEFAULT_AGENT_URL


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix domain socket (the agent's ``apm.socket``)."""

    def __init__(self, path: str, timeout: float) -> None:
        # The Host header needs a name; the agent ignores it on its socket.
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def agent_connection(url: str, timeout: float) -> http.client.HTTPConnection:
    """An unopened keep-alive connection to ``http://host[:port]`` or ``unix:///path``."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "unix":
        path = parts.path or parts.netloc
        if not path:
            raise ValueError("agent URL %r names no socket path" % (url,))
        return UnixHTTPConnection(path, timeout)
    if parts.scheme == "http":
        if not parts.hostname:
            raise ValueError("agent URL %r names no host" % (url,))
        return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    if parts.scheme == "https":
        return http.client.HTTPSConnection(parts.hostname or "", parts.port or 443, timeout=timeout)
    raise ValueError("agent URL %r: the scheme must be http, https or unix" % (url,))
