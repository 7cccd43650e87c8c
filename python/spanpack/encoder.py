"""TraceMsgPackEncoder: the Python face of the C trace encoder."""

from __future__ import annotations

import platform
from typing import Dict

from ._spanpack import TraceEncoder

CONTENT_TYPE = "application/msgpack"


class TraceMsgPackEncoder(TraceEncoder):
    """Encode traces (lists of spans) into Datadog agent payloads.

    ``TraceMsgPackEncoder(version="v0.4", fields=None, *, max_size=20 MiB,
    max_item_size=None, max_payload_size=None, lenient=False, intern=True,
    native_span_events=False)``

    One-shot: :meth:`encode_traces`, or :meth:`encode_trace` + :meth:`join_encoded`.
    Buffered (for a writer thread): :meth:`put` from any thread, :meth:`encode`
    from the flusher.  See the README for the span input forms and the rules.
    """

    content_type = CONTENT_TYPE

    @property
    def endpoint(self) -> str:
        """The agent path this encoder's payloads go to, e.g. ``/v0.4/traces``."""
        return f"/{self.version}/traces"

    def headers(self, trace_count: int, tracer_version: str = "") -> Dict[str, str]:
        """HTTP headers for sending one payload of ``trace_count`` traces."""
        return payload_headers(trace_count, tracer_version)


def payload_headers(trace_count: int, tracer_version: str = "") -> Dict[str, str]:
    """The headers a tracer sends with a trace payload."""
    from . import __version__

    return {
        "Content-Type": CONTENT_TYPE,
        "X-Datadog-Trace-Count": str(trace_count),
        "Datadog-Meta-Lang": "python",
        "Datadog-Meta-Lang-Version": platform.python_version(),
        "Datadog-Meta-Lang-Interpreter": platform.python_implementation(),
        "Datadog-Meta-Tracer-Version": tracer_version or f"spanpack-{__version__}",
    }
