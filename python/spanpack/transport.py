"""Sending a payload to a trace agent with the standard library."""

from __future__ import annotations

import urllib.request
from typing import Dict, Optional, Tuple

from .encoder import payload_headers


def send(
    payload: bytes,
    trace_count: int,
    url: str = "http://127.0.0.1:8126/v0.4/traces",
    *,
    headers: Optional[Dict[str, str]] = None,
    timeout: float = 10.0,
) -> Tuple[int, bytes]:
    """PUT one payload to ``url`` (the agent's ``/v0.4/traces`` or ``/v0.5/traces``).

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
