"""The OTel -> Datadog transform cases of Datadog's Rust tracer, as facts.

Source: DataDog/dd-trace-rs, datadog-opentelemetry/src/mappings/transform/
transform_tests.rs at 9d2fb0e83dfaa473eedf7be2a5e6450978fca342 (its
`test_cases()`, a port of the agent's own cases).  Each case: the resource's
attributes, the span (kind, name, attributes in order, events, links,
status, tracestate, instrumentation scope) and the Datadog span the
transform gives.  Written here as data; the inputs and expected values are
the Rust table's.

What the Rust table does not show and spanpack adds on purpose, checked by
test_otel_transform.py on top of each case (docs/otel.md says why):
`otel.library.name`/`otel.library.version` beside the scope tags (the
agent's current transform writes both), `_dd.p.tid` (the 128-bit trace id's
high half, which the Rust exporter carries elsewhere) and the trace's
`_sampling_priority_v1`.
"""

from __future__ import annotations

from typing import Any, Dict, List

TRACE_ID = 0x72DF520AF2BDE7A5240031EAD750E5F3
SPAN_ID = 0x240031EAD750E5F3
TRACE_ID_HEX = "72df520af2bde7a5240031ead750e5f3"
SCOPE = ("ddtracer", "v2")

# Two events: one plain, one exception (times in ns since the epoch).
EVENTS = [
    ("boom", 100, [("key", "Out of memory"), ("accuracy", 2.4)]),
    ("exception", 400, [("exception.message", "Out of memory"), ("exception.type", "mem"),
                        ("exception.stacktrace", "1/2/3")]),
]
EXPECTED_EVENTS = [
    {"name": "boom", "time_unix_nano": 100,
     "attributes": {"key": ("string", "Out of memory"), "accuracy": ("double", 2.4)}},
    {"name": "exception", "time_unix_nano": 400,
     "attributes": {"exception.message": ("string", "Out of memory"), "exception.type": ("string", "mem"),
                    "exception.stacktrace": ("string", "1/2/3")}},
]

LINKS = [
    {"trace_id": 0xFEDCBA98765432100123456789ABCDEF, "span_id": 0xABCDEF0123456789,
     "tracestate": "dd=asdf256,ee=jkl;128", "attributes": [("a1", "v1"), ("a2", "v2")]},
    {"trace_id": 0xABCDEF0123456789ABCDEF0123456789, "span_id": 0xFEDCBA9876543210},
    {"trace_id": 0xABCDEF0123456789ABCDEF0123456789, "span_id": 0xFEDCBA9876543210},
]
EXPECTED_LINKS = [
    {"trace_id": 81985529216486895, "trace_id_high": 18364758544493064720, "span_id": 12379813738877118345,
     "attributes": {"a1": "v1", "a2": "v2"}, "tracestate": "dd=asdf256,ee=jkl;128", "flags": 0},
    {"trace_id": 12379813738877118345, "trace_id_high": 12379813738877118345, "span_id": 18364758544493064720,
     "attributes": {}, "tracestate": "", "flags": 0},
    {"trace_id": 12379813738877118345, "trace_id_high": 12379813738877118345, "span_id": 18364758544493064720,
     "attributes": {}, "tracestate": "", "flags": 0},
]

_ERROR_FROM_EVENT = {"error.message": "Out of memory", "error.type": "mem", "error.stack": "1/2/3"}

CASES: List[Dict[str, Any]] = [
    {
        "name": "basic",
        "resource": [("service.name", "pylons"), ("service.version", "v1.2.3"), ("env", "staging")],
        "span": {
            "kind": "server", "name": "/path",
            "attributes": [("name", "john"), ("approx", 1.2), ("count", 2)],
            "events": EVENTS, "links": LINKS, "status": ("error", "Error"),
        },
        "expected": {
            "name": "server.request", "resource": "/path", "service": "pylons", "type": "web", "error": 1,
            "meta": {
                "name": "john", "otel.trace_id": TRACE_ID_HEX, "env": "staging", "otel.status_code": "Error",
                "otel.status_description": "Error", "otel.scope.name": "ddtracer", "otel.scope.version": "v2",
                "service.version": "v1.2.3", "version": "v1.2.3", **_ERROR_FROM_EVENT, "span.kind": "server",
                "_dd.span_events.has_exception": "true",
            },
            "metrics": {"approx": 1.2, "count": 2.0},
            "events": EXPECTED_EVENTS, "links": EXPECTED_LINKS,
        },
    },
    {
        "name": "complex",
        "resource": [("service.version", "v1.2.3"), ("service.name", "myservice"), ("peer.service", "mypeerservice")],
        "span": {
            "kind": "server", "name": "/path", "tracestate": "state=1",
            "attributes": [("name", "john"), ("peer.service", "userbase"), ("deployment.environment", "prod"),
                           ("http.request.method", "GET"), ("http.route", "/path"), ("approx", 1.2), ("count", 2),
                           ("span.kind", "server")],
            "events": EVENTS, "links": LINKS, "status": ("error", "Error"),
        },
        "expected": {
            "name": "http.server.request", "resource": "GET /path", "service": "myservice", "type": "web", "error": 1,
            "meta": {
                "name": "john", "deployment.environment": "prod", "otel.trace_id": TRACE_ID_HEX,
                "otel.status_code": "Error", "otel.status_description": "Error", "otel.scope.name": "ddtracer",
                "otel.scope.version": "v2", "service.version": "v1.2.3", "w3c.tracestate": "state=1",
                "version": "v1.2.3", **_ERROR_FROM_EVENT, "http.method": "GET", "http.route": "/path",
                "peer.service": "userbase", "span.kind": "server", "_dd.span_events.has_exception": "true",
            },
            "metrics": {"approx": 1.2, "count": 2.0},
            "events": EXPECTED_EVENTS, "links": EXPECTED_LINKS,
        },
    },
    {
        "name": "http_attributes",
        "resource": [
            ("service.name", "myservice"), ("service.version", "v1.2.3"), ("env", "staging"),
            ("client.address", "sample_client_address"), ("http.response.body.size", "sample_content_length"),
            ("http.response.status_code", "sample_status_code"), ("http.request.body.size", "sample_content_length"),
            ("http.request.header.referrer", "sample_referrer"), ("network.protocol.version", "sample_version"),
            ("server.address", "sample_server_name"), ("url.full", "sample_url"),
            ("user_agent.original", "sample_useragent"), ("http.request.header.example", "test"),
        ],
        "span": {
            "kind": "server", "name": "/path", "tracestate": "state=1",
            "attributes": [("name", "john"), ("http.request.method", "GET"), ("http.route", "/path"),
                           ("approx", 1.2), ("count", 2), ("analytics.event", "false"), ("service.name", "pylons")],
            "events": EVENTS, "links": LINKS, "status": ("error", "Error"),
        },
        "expected": {
            "name": "http.server.request", "resource": "GET /path", "service": "pylons", "type": "web", "error": 1,
            "meta": {
                "name": "john", "env": "staging", "otel.trace_id": TRACE_ID_HEX, "otel.status_code": "Error",
                "otel.status_description": "Error", "otel.scope.name": "ddtracer", "otel.scope.version": "v2",
                "service.version": "v1.2.3", "w3c.tracestate": "state=1", "version": "v1.2.3", **_ERROR_FROM_EVENT,
                "http.method": "GET", "http.route": "/path", "span.kind": "server",
                "_dd.span_events.has_exception": "true", "http.client_ip": "sample_client_address",
                "http.response.content_length": "sample_content_length", "http.status_code": "sample_status_code",
                "http.request.content_length": "sample_content_length", "http.referrer": "sample_referrer",
                "http.version": "sample_version", "http.server_name": "sample_server_name", "http.url": "sample_url",
                "http.useragent": "sample_useragent", "http.request.headers.example": "test",
            },
            "metrics": {"approx": 1.2, "count": 2.0, "_dd1.sr.eausr": 0.0},
            "events": EXPECTED_EVENTS, "links": EXPECTED_LINKS,
        },
    },
    {
        "name": "db_attributes",
        "resource": [("env", "staging"), ("service.name", "mongo")],
        "span": {
            "kind": "internal", "name": "/path",
            "attributes": [("operation.name", "READ"), ("resource.name", "/path"), ("span.type", "db"),
                           ("name", "john"), ("container.id", "cid"), ("k8s.container.name", "k8s-container"),
                           ("http.request.method", "GET"), ("http.route", "/path"), ("approx", 1.2), ("count", 2),
                           ("analytics.event", True)],
        },
        "expected": {
            "name": "READ", "resource": "/path", "service": "mongo", "type": "db", "error": 0,
            "meta": {
                "env": "staging", "container.id": "cid", "k8s.container.name": "k8s-container", "http.method": "GET",
                "http.route": "/path", "otel.status_code": "Unset", "otel.scope.name": "ddtracer",
                "otel.scope.version": "v2", "name": "john", "otel.trace_id": TRACE_ID_HEX, "span.kind": "internal",
            },
            "metrics": {"approx": 1.2, "count": 2.0, "_dd1.sr.eausr": 1.0},
            "events": [], "links": [],
        },
    },
]

# The two HTTP naming cases differ only in the status code attribute's key
# (the stable semantic conventions' and the old one); both give one span.
for _case_name, _status_key in (("http_naming_old_semconv", "http.response.status_code"),
                                ("http_naming", "http.status_code")):
    CASES.append({
        "name": _case_name,
        "resource": [("env", "staging"), ("service.name", "document-uploader")],
        "span": {
            "kind": "internal", "name": "POST /uploads/:document_id",
            "attributes": [("operation.name", "ddtracer.server"), ("http.request.method", "POST"),
                           ("url.path", "/uploads/4"), ("url.scheme", "https"),
                           ("http.route", "/uploads/:document_id"), (_status_key, "201"),
                           ("error.type", "WebSocketDisconnect")],
            "status": ("error", ""),
        },
        "expected": {
            "name": "ddtracer.server", "resource": "POST", "service": "document-uploader", "type": "custom",
            "error": 1,
            "meta": {
                "env": "staging", "otel.scope.name": "ddtracer", "otel.scope.version": "v2",
                "otel.status_code": "Error", "error.message": "201", "http.method": "POST", "url.path": "/uploads/4",
                "url.scheme": "https", "http.route": "/uploads/:document_id", "http.status_code": "201",
                "error.type": "WebSocketDisconnect", "otel.trace_id": TRACE_ID_HEX, "span.kind": "internal",
            },
            "metrics": {},
            "events": [], "links": [],
        },
    })
