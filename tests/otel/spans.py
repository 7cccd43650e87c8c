"""OpenTelemetry SDK spans built for the tests, and payloads decoded back
into plain Datadog spans to compare (imports the SDK: import it after
pytest.importorskip("opentelemetry.sdk"))."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import msgpack
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from tests.spans.test_one_meaning import CANONICAL

KINDS = {
    "internal": SpanKind.INTERNAL,
    "server": SpanKind.SERVER,
    "client": SpanKind.CLIENT,
    "producer": SpanKind.PRODUCER,
    "consumer": SpanKind.CONSUMER,
}
STATUSES = {"unset": StatusCode.UNSET, "ok": StatusCode.OK, "error": StatusCode.ERROR}

# The native span event attribute types of a v0.4 payload, by name.
_EVENT_TYPES = {0: "string", 1: "bool", 2: "int", 3: "double", 4: "array"}
_EVENT_VALUE_KEYS = {0: "string_value", 1: "bool_value", 2: "int_value", 3: "double_value"}


def context(trace_id: int, span_id: int, tracestate: str = "", flags: int = 0) -> SpanContext:
    state = TraceState.from_header([tracestate]) if tracestate else TraceState()
    return SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags), trace_state=state)


def make_span(
    *,
    trace_id: int,
    span_id: int,
    name: str,
    kind: str = "internal",
    parent_id: Optional[int] = None,
    start: int = 1_700_000_000_000_000_000,
    duration: int = 200_000_000,
    attributes: Sequence[Tuple[str, Any]] = (),
    resource: Sequence[Tuple[str, Any]] = (),
    events: Sequence[Tuple[str, int, Sequence[Tuple[str, Any]]]] = (),
    links: Sequence[Dict[str, Any]] = (),
    status: Tuple[str, Optional[str]] = ("unset", None),
    tracestate: str = "",
    scope: Tuple[str, Optional[str]] = ("", None),
    resource_object: Optional[Resource] = None,
    scope_object: Optional[InstrumentationScope] = None,
) -> ReadableSpan:
    """A finished ReadableSpan as the SDK keeps one (attribute order kept)."""
    code, description = status
    return ReadableSpan(
        name=name,
        context=context(trace_id, span_id, tracestate),
        parent=context(trace_id, parent_id) if parent_id is not None else None,
        resource=resource_object if resource_object is not None else Resource(dict(resource)),
        attributes=dict(attributes),
        events=[Event(event_name, dict(event_attributes), timestamp)
                for event_name, timestamp, event_attributes in events],
        links=[Link(context(link["trace_id"], link["span_id"], link.get("tracestate", ""), link.get("flags", 0)),
                    dict(link.get("attributes", ()))) for link in links],
        kind=KINDS[kind],
        status=Status(STATUSES[code], description),
        start_time=start,
        end_time=start + duration,
        instrumentation_scope=scope_object if scope_object is not None else InstrumentationScope(*scope),
    )


def _event_value(value: Dict[str, Any]) -> Tuple[str, Any]:
    kind = value["type"]
    if kind == 4:
        return ("array", [_event_value(item) for item in value["array_value"]["values"]])
    return (_EVENT_TYPES[kind], value[_EVENT_VALUE_KEYS[kind]])


def decode_v04(payload: bytes) -> List[List[Dict[str, Any]]]:
    """A v0.4 payload's traces, with native span events' typed attributes
    as (type name, value) pairs."""
    traces = msgpack.unpackb(payload, strict_map_key=False)
    for trace in traces:
        for span in trace:
            for event in span.get("span_events", ()):
                event["attributes"] = {k: _event_value(v) for k, v in event.get("attributes", {}).items()}
    return traces


def canonical(version: str, payload: bytes) -> List[List[Dict[str, Any]]]:
    """The traces of a payload of any version in one form (the suite's own
    canonical decoding, tests/spans/test_one_meaning.py)."""
    return CANONICAL[version](payload)
