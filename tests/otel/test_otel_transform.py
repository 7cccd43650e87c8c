"""spanpack.otel against the Datadog transform's own cases and rules.

The cases of Datadog's Rust tracer (transform_cases.py) are built as SDK
ReadableSpans, encoded by spanpack.otel.encode_spans, decoded from the
payload and compared field by field; v0.5 and v1.0 payloads of the same
spans must decode to the same traces as v0.4.  The rule tests below pin the
naming derivations (operation name, resource, span type) one attribute set
at a time, each expected value read off the agent's rules (docs/otel.md).
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

pytest.importorskip("opentelemetry.sdk")

from spanpack import otel  # noqa: E402
from tests.otel.spans import canonical, decode_v04, make_span  # noqa: E402
from tests.otel.transform_cases import CASES, SCOPE, SPAN_ID, TRACE_ID  # noqa: E402

VERSIONS = ("v0.4", "v0.5", "v1.0")
START = 1_700_000_000_000_000_000
_FLAGS_SET = 1 << 31


def _case_span(case: Dict[str, Any]) -> Any:
    return make_span(trace_id=TRACE_ID, span_id=SPAN_ID, scope=SCOPE, resource=case["resource"], start=START,
                     **case["span"])


def _only_span(payload: bytes) -> Dict[str, Any]:
    traces = decode_v04(payload)
    assert len(traces) == 1 and len(traces[0]) == 1
    return traces[0][0]


def _link_as_rust_shows_it(link: Dict[str, Any]) -> Dict[str, Any]:
    """A decoded v0.4 link with what the wire leaves out when empty put back,
    and the 'flags present' bit (bit 31) checked and taken off."""
    assert link["flags"] & _FLAGS_SET
    return {
        "trace_id": link["trace_id"],
        "trace_id_high": link.get("trace_id_high", 0),
        "span_id": link["span_id"],
        "attributes": link.get("attributes", {}),
        "tracestate": link.get("tracestate", ""),
        "flags": link["flags"] & ~_FLAGS_SET,
    }


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_rust_tracer_transform_case(case):
    got = _only_span(otel.encode_spans([_case_span(case)]))
    expected = case["expected"]
    assert (got["trace_id"], got["span_id"], got.get("parent_id", 0)) == (TRACE_ID & (2**64 - 1), SPAN_ID, 0)
    assert (got["start"], got["duration"]) == (START, 200_000_000)
    for field in ("name", "resource", "service", "type", "error"):
        assert got.get(field, 0 if field == "error" else None) == expected[field], field
    extra_meta = {
        "otel.library.name": SCOPE[0],
        "otel.library.version": SCOPE[1],
        "_dd.p.tid": "%016x" % (TRACE_ID >> 64),
    }
    assert got["meta"] == {**expected["meta"], **extra_meta}
    assert got.get("metrics", {}) == {**expected["metrics"], "_sampling_priority_v1": 1.0}
    assert got.get("span_events", []) == expected["events"]
    assert [_link_as_rust_shows_it(link) for link in got.get("span_links", [])] == expected["links"]


@pytest.mark.parametrize("version", VERSIONS[1:])
def test_v05_and_v10_mean_what_v04_means(version):
    # One trace id per case, so that each is a trace of its own.
    spans = [make_span(trace_id=TRACE_ID + n, span_id=SPAN_ID, scope=SCOPE, resource=case["resource"],
                       **case["span"]) for n, case in enumerate(CASES)]
    v04 = canonical("v0.4", otel.encode_spans(spans))
    assert len(v04) == len(CASES)
    assert canonical(version, otel.encode_spans(spans, version)) == v04


def _mapped(kind: str, attributes: List[Any], resource: List[Any] = (), name: str = "span-name", **fields: Any):
    span = make_span(trace_id=TRACE_ID, span_id=SPAN_ID, kind=kind, name=name, attributes=attributes,
                     resource=resource, **fields)
    return _only_span(otel.encode_spans([span]))


# (kind, attributes, resource attributes) -> (operation name, resource, span type), each from the
# agent's rules: operation name by protocol, resource from method/route, messaging, RPC, GraphQL or DB
# statement, span type from kind and db.system.
NAMING = [
    ("server", [("http.request.method", "GET"), ("http.route", "/a")], [],
     ("http.server.request", "GET /a", "web")),
    ("client", [("http.method", "POST"), ("http.route", "/a")], [],
     ("http.client.request", "POST", "http")),
    ("server", [("http.request.method", "_OTHER")], [], ("http.server.request", "HTTP", "web")),
    ("client", [("db.system", "PostgreSQL"), ("db.statement", "SELECT 1")], [],
     ("postgresql.query", "SELECT 1", "db")),
    ("client", [("db.system", "postgresql"), ("db.statement", "SELECT 1")], [],
     ("postgresql.query", "SELECT 1", "sql")),
    ("client", [("db.system.name", "redis"), ("db.query.text", "GET k")], [], ("redis.query", "GET k", "redis")),
    ("client", [("db.system", "neo4j")], [], ("neo4j.query", "span-name", "db")),
    ("server", [("db.system", "mysql")], [], ("server.request", "span-name", "web")),
    ("consumer", [("messaging.system", "Kafka"), ("messaging.operation", "Receive"),
                  ("messaging.destination.name", "orders")], [],
     ("kafka.receive", "Receive orders", "custom")),
    ("internal", [("messaging.system", "kafka"), ("messaging.operation", "receive")], [],
     ("internal", "receive", "custom")),
    ("client", [("rpc.system", "aws-api"), ("rpc.service", "DynamoDB"), ("rpc.method", "GetItem")], [],
     ("aws.dynamodb.request", "GetItem DynamoDB", "http")),
    ("client", [("rpc.system", "aws-api")], [], ("aws.client.request", "span-name", "http")),
    ("server", [("rpc.system", "grpc"), ("rpc.method", "Get"), ("rpc.service", "Users")], [],
     ("grpc.server.request", "Get Users", "web")),
    ("client", [("faas.invoked_provider", "AWS"), ("faas.invoked_name", "Fn")], [],
     ("aws.fn.invoke", "span-name", "http")),
    ("server", [("faas.trigger", "Timer")], [], ("timer.invoke", "span-name", "web")),
    ("internal", [("graphql.operation.type", "query"), ("graphql.operation.name", "Users")], [],
     ("graphql.server.request", "query Users", "custom")),
    ("server", [("network.protocol.name", "AMQP")], [], ("amqp.server.request", "span-name", "web")),
    ("client", [], [], ("client.request", "span-name", "http")),
    ("producer", [], [], ("producer", "span-name", "custom")),
    ("internal", [("operation.name", "op"), ("resource.name", "res"), ("span.type", "typ")], [],
     ("op", "res", "typ")),
    # resource attributes come before the span's for resource and type
    ("server", [("http.route", "/span")], [("http.request.method", "PUT"), ("http.route", "/res")],
     ("server.request", "PUT /res", "web")),
    ("client", [("span.type", "span-type")], [("span.type", "res-type")], ("client.request", "span-name", "res-type")),
    # datadog.* attributes win over every rule
    ("server", [("datadog.name", "n"), ("datadog.resource", "r"), ("datadog.type", "t"), ("datadog.service", "s"),
                ("http.request.method", "GET")], [("service.name", "res-service")], ("n", "r", "t")),
]


@pytest.mark.parametrize("kind, attributes, resource, expected", NAMING)
def test_naming_rules(kind, attributes, resource, expected):
    got = _mapped(kind, attributes, resource)
    assert (got["name"], got["resource"], got["type"]) == expected


def test_service_from_span_then_resource_then_the_agent_default():
    assert _mapped("internal", [], [])["service"] == otel.DEFAULT_SERVICE == "otlpresourcenoservicename"
    assert _mapped("internal", [], [("service.name", "res")])["service"] == "res"
    assert _mapped("internal", [("service.name", "span")], [("service.name", "res")])["service"] == "span"
    assert _mapped("internal", [("service.name", "")], [("service.name", "res")])["service"] == "res"
    assert _mapped("internal", [("datadog.service", "dd"), ("service.name", "span")], [])["service"] == "dd"


def test_attribute_values_become_tags_and_metrics_as_the_agent_converts_them():
    got = _mapped("internal", [
        ("text", "t"), ("flag", True), ("off", False), ("int", 7), ("float", 2.5), ("whole", 3.0),
        ("words", ("a", "b")), ("ints", (1, 2)), ("flags", (True, False)), ("floats", (1.5, 2.0)),
        ("sampling.priority", 2), ("datadog.custom", "dropped"),
    ])
    meta, metrics = got["meta"], got["metrics"]
    assert {k: meta[k] for k in ("text", "flag", "off", "words", "ints", "flags", "floats")} == {
        "text": "t", "flag": "true", "off": "false", "words": '["a","b"]', "ints": "[1,2]",
        "flags": "[true,false]", "floats": "[1.5,2]",
    }
    assert {k: metrics[k] for k in ("int", "float", "whole")} == {"int": 7.0, "float": 2.5, "whole": 3.0}
    assert metrics["_sampling_priority_v1"] == 2.0 and "sampling.priority" not in metrics
    assert "datadog.custom" not in meta


def test_resource_attributes_become_tags_and_env_version_come_from_them():
    got = _mapped("internal", [("team", "span")], [
        ("service.name", "svc"), ("service.version", "1.2"), ("deployment.environment.name", "prod"),
        ("deployment.environment", "old"), ("container.id", "c1"), ("team", "resource"), ("process.pid", 42),
    ])
    meta = got["meta"]
    assert (meta["env"], meta["version"], meta["container.id"]) == ("prod", "1.2", "c1")
    assert meta["team"] == "span"  # the span's own attribute comes after the resource's
    assert meta["process.pid"] == "42"  # resource attributes are always tags, as text
    assert "service.name" not in meta
    assert _mapped("internal", [], [("deployment.environment", "old")])["meta"]["env"] == "old"
    assert _mapped("internal", [("datadog.env", "dd")], [("deployment.environment", "x")])["meta"]["env"] == "dd"


def test_guarded_tags_are_not_overwritten_once_set():
    got = _mapped("internal", [("datadog.version", "dd-v"), ("version", "attr-v"), ("env", "attr-env")],
                  [("service.version", "res-v"), ("env", "res-env")])
    assert (got["meta"]["version"], got["meta"]["env"]) == ("dd-v", "res-env")


def test_status_and_exception_events_set_the_error():
    ok = _mapped("internal", [], status=("ok", None))
    assert ok.get("error", 0) == 0 and ok["meta"]["otel.status_code"] == "Ok"
    assert "otel.status_description" not in ok["meta"]

    described = _mapped("internal", [], status=("error", "it broke"))
    assert described["error"] == 1
    assert described["meta"]["error.message"] == described["meta"]["otel.status_description"] == "it broke"

    by_code = _mapped("server", [("http.response.status_code", 503)], status=("error", None))
    assert by_code["meta"]["http.status_code"] == "503" and by_code["metrics"]["http.status_code"] == 503.0
    assert by_code["meta"]["error.message"] == "503"

    exception = [("exception", 5, [("exception.type", "ValueError"), ("exception.message", "bad"),
                                   ("exception.stacktrace", "tb")])]
    unset = _mapped("internal", [], events=exception)
    assert unset.get("error", 0) == 0
    assert unset["meta"]["_dd.span_events.has_exception"] == "true"
    assert not {"error.message", "error.type", "error.stack"} & set(unset["meta"])

    failed = _mapped("internal", [], events=exception, status=("error", "status text"))
    assert failed["error"] == 1
    assert {k: failed["meta"][k] for k in ("error.type", "error.message", "error.stack")} == {
        "error.type": "ValueError", "error.message": "bad", "error.stack": "tb"}


def test_datadog_error_attribute_stands_when_every_error_tag_is_given():
    got = _mapped("internal", [("datadog.error", 1), ("datadog.error.msg", "m"), ("datadog.error.type", "t"),
                               ("datadog.error.stack", "s")])
    assert got["error"] == 1
    assert (got["meta"]["error.message"], got["meta"]["error.type"], got["meta"]["error.stack"]) == ("m", "t", "s")


def test_client_and_producer_spans_are_measured():
    for kind in ("client", "producer"):
        assert _mapped(kind, [])["metrics"]["_dd.measured"] == 1.0
    for kind in ("server", "consumer", "internal"):
        assert "_dd.measured" not in _mapped(kind, [])["metrics"]
    assert _mapped("internal", [("_dd.measured", 1)])["metrics"]["_dd.measured"] == 1.0


def test_span_kind_tag_from_the_kind_or_the_datadog_attribute():
    assert _mapped("consumer", [])["meta"]["span.kind"] == "consumer"
    assert _mapped("consumer", [("datadog.span.kind", "server")])["meta"]["span.kind"] == "server"


def test_trace_ids_parent_and_times():
    trace_id = (0xABC << 64) | 0x123
    span = make_span(trace_id=trace_id, span_id=7, parent_id=5, name="x", start=START, duration=10)
    got = _only_span(otel.encode_spans([span]))
    assert (got["trace_id"], got["span_id"], got["parent_id"]) == (0x123, 7, 5)
    assert got["meta"]["otel.trace_id"] == "%032x" % trace_id
    assert got["meta"]["_dd.p.tid"] == "%016x" % 0xABC
    assert (got["start"], got["duration"]) == (START, 10)
    negative = make_span(trace_id=trace_id, span_id=8, name="x", start=START, duration=-10)
    assert _only_span(otel.encode_spans([negative]))["duration"] == 0


def test_spans_grouped_by_trace_id_with_the_priority_on_the_local_root():
    spans = [
        make_span(trace_id=1, span_id=11, parent_id=10, name="child"),
        make_span(trace_id=2, span_id=20, name="other"),
        make_span(trace_id=1, span_id=10, name="root", attributes=[("sampling.priority", 2)]),
        make_span(trace_id=1, span_id=12, parent_id=10, name="child2", attributes=[("sampling.priority", -1)]),
    ]
    traces = decode_v04(otel.encode_spans(spans))
    assert [[span["resource"] for span in trace] for trace in traces] == [["child", "root", "child2"], ["other"]]
    # the last sampling.priority of the trace, as the agent takes it, on the span whose parent is not here
    priorities = [span.get("metrics", {}).get("_sampling_priority_v1") for span in traces[0]]
    assert priorities == [None, -1.0, -1.0]
    assert traces[1][0]["metrics"]["_sampling_priority_v1"] == 1.0
    assert [trace[0]["meta"].get("_dd.p.tid") for trace in traces] == [None, None]


def test_tracestate_scope_and_scope_attributes():
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    try:
        scope = InstrumentationScope("lib", "1.0", None, {"scope.attr": "x"})
    except TypeError:  # an SDK before scope attributes (1.20)
        scope = InstrumentationScope("lib", "1.0", None)
    got = _only_span(otel.encode_spans([make_span(trace_id=1, span_id=2, name="n", tracestate="a=1,b=2",
                                                  scope_object=scope)]))
    meta = got["meta"]
    assert meta["w3c.tracestate"] == "a=1,b=2"
    assert (meta["otel.scope.name"], meta["otel.library.name"]) == ("lib", "lib")
    assert (meta["otel.scope.version"], meta["otel.library.version"]) == ("1.0", "1.0")
    if getattr(scope, "attributes", None):
        assert meta["scope.attr"] == "x"
    bare = _only_span(otel.encode_spans([make_span(trace_id=1, span_id=2, name="n")]))
    assert not {"w3c.tracestate", "otel.scope.name", "otel.library.name"} & set(bare["meta"])


def test_events_as_json_when_not_native_and_in_v05():
    span = make_span(trace_id=1, span_id=2, name="n", events=[("e", 9, [("k", "v")])])
    got = _only_span(otel.encode_spans([span], native_span_events=False))
    assert got["meta"]["events"] and "span_events" not in got
    assert canonical("v0.5", otel.encode_spans([span], "v0.5")) == canonical("v0.4", otel.encode_spans([span]))


def test_float_attribute_text_has_no_exponent():
    got = _mapped("internal", [("big", (1e21, 1.5e-7))])
    assert got["meta"]["big"] == "[1000000000000000000000,0.00000015]"


def test_encoder_options_are_passed_on():
    span = make_span(trace_id=1, span_id=2, name="n")
    got = _only_span(otel.encode_spans([span], default_meta={"team": "t"}))
    assert got["meta"]["team"] == "t"
    with pytest.raises(TypeError):
        otel.encode_spans([span], no_such_option=1)


def test_map_span_gives_the_dict_span_encoded():
    span = make_span(trace_id=1, span_id=2, name="n", kind="server")
    mapped = otel.map_span(span)
    assert (mapped["name"], mapped["span_type"], mapped["meta"]["span.kind"]) == ("server.request", "web", "server")


def test_early_tags_against_resource_and_scope_tags():
    """Rules 8-13 in the agent's order: span.kind and the other tags of rules
    8-11 are set before the resource's tags (which replace span.kind but not a
    guarded tag already set) and the scope's (which replace any)."""
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    resource = [("span.kind", "r-kind"), ("env", "r-env"), ("http.status_code", "r-code")]
    attributes = [("datadog.env", "d-env"), ("http.response.status_code", 200)]
    got = _mapped("server", attributes, resource)
    assert (got["meta"]["span.kind"], got["meta"]["env"], got["meta"]["http.status_code"]) == (
        "r-kind", "d-env", "200")
    try:
        scope = InstrumentationScope("lib", "1", None, {"span.kind": "s-kind", "http.status_code": "s-code"})
    except TypeError:
        pytest.skip("this SDK's scopes have no attributes")
    span = make_span(trace_id=TRACE_ID, span_id=SPAN_ID, kind="server", name="n", attributes=attributes,
                     resource=resource, scope_object=scope)
    meta = _only_span(otel.encode_spans([span]))["meta"]
    assert (meta["span.kind"], meta["env"], meta["http.status_code"]) == ("s-kind", "d-env", "s-code")


def test_encode_spans_gives_the_same_bytes_with_a_kept_encoder():
    """encode_spans keeps its encoder per thread and options: a later call
    gives what a fresh encoder gives, and another thread gets its own."""
    import threading

    from spanpack import TraceMsgPackEncoder

    spans = [_case_span(case) for case in CASES]
    fresh = TraceMsgPackEncoder("v0.4", native_span_events=True).encode_traces(otel.map_spans(spans))
    assert otel.encode_spans(spans) == otel.encode_spans(spans) == fresh
    assert otel.encode_spans(spans, "v0.5") == TraceMsgPackEncoder("v0.5").encode_traces(otel.map_spans(spans))
    kept = otel._encoders.kept
    seen = []
    thread = threading.Thread(target=lambda: seen.append((otel.encode_spans(spans), otel._encoders.kept)))
    thread.start()
    thread.join()
    assert seen[0][0] == fresh and seen[0][1] is not kept
