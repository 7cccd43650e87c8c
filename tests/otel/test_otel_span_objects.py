"""encode_spans hands the encoder ext/otel_span.c's OtelSpan objects (the
mapped span's fields in read-only slots) instead of dict spans.  The bytes
must not depend on that: every payload equals the one the same encoder makes
of map_spans' dict spans, for spans of every rule table, made by the SDK's
tracer, with links and events, in every version and encoder mode."""

from __future__ import annotations

import sys
from typing import Any, Dict, List

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import Link, SpanKind, Status, StatusCode  # noqa: E402

from spanpack import AgentWriter, TraceMsgPackEncoder, otel  # noqa: E402
from tests.otel.spans import make_span  # noqa: E402
from tests.otel.transform_cases import CASES, SCOPE, SPAN_ID, TRACE_ID  # noqa: E402

pytestmark = pytest.mark.skipif(otel._C_PLAN_PARTS is None, reason="SPANPACK_OTEL_PYTHON is set")


def _sdk_spans() -> List[Any]:
    """Two traces from the SDK's tracer: errors, an exception event, links
    (one with a list attribute), a client span, a sampling priority."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc", "env": "prod", "n": 3}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("lib", "2")
    with tracer.start_as_current_span("root", kind=SpanKind.SERVER, attributes={
            "http.request.method": "GET", "http.response.status_code": 503, "sampling.priority": 2}) as root:
        with tracer.start_as_current_span("db", kind=SpanKind.CLIENT, attributes={"db.system": "mysql", "rows": 4},
                                          links=[Link(root.get_span_context(), {"n": 1, "tags": ["a", "b"]})]) as db:
            db.add_event("retry", {"attempt": 2, "ok": False, "codes": [1, 2]})
            db.record_exception(ValueError("v"))
            db.set_status(Status(StatusCode.ERROR, "failed"))
    with tracer.start_as_current_span("consumer", kind=SpanKind.CONSUMER,
                                      links=[Link(root.get_span_context())]):
        pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def _case_spans() -> List[Any]:
    return [make_span(trace_id=TRACE_ID + i, span_id=SPAN_ID, scope=SCOPE, resource=case["resource"], **case["span"])
            for i, case in enumerate(CASES)]


BATCHES = {"sdk": _sdk_spans, "transform_cases": _case_spans}
OPTIONS: List[Dict[str, Any]] = [
    {}, {"native_span_events": False}, {"strict": True}, {"lenient": True}, {"intern": False},
    {"default_meta": {"team": "t"}, "default_metrics": {"w": 1.5}},
]


@pytest.mark.parametrize("version, options", [
    (version, options) for version in ("v0.4", "v0.5", "v1.0") for options in OPTIONS
    if not (version == "v1.0" and "default_meta" in options)  # v1.0 has no default tags
], ids=lambda value: value if isinstance(value, str) else ",".join(value) or "defaults")
@pytest.mark.parametrize("batch", list(BATCHES))
def test_objects_give_the_bytes_of_dict_spans(batch, version, options):
    spans = BATCHES[batch]()
    mapped = otel._mapped_traces(spans, as_objects=True)
    assert all(type(span).__name__ == "OtelSpan" for trace in mapped for span in trace)
    encoder_options = otel._encoder_options(version, dict(options))
    expected = TraceMsgPackEncoder(version, **encoder_options).encode_traces(otel.map_spans(spans))
    assert otel.encode_spans(spans, version, **options) == expected
    assert TraceMsgPackEncoder(version, **encoder_options).encode_traces(mapped) == expected


def test_links_are_made_in_their_written_form_unless_the_rules_decline():
    """An SDK link becomes an OtelLink (its to_dict() form made by the
    mapping); one whose attribute key is a str subclass stays a dict link,
    judged by the encoder's rules as before.  Bytes equal either way."""

    class Key(str):
        pass

    spans = [make_span(trace_id=TRACE_ID, span_id=SPAN_ID, name="n", links=[
        {"trace_id": TRACE_ID, "span_id": 7, "tracestate": "k=v", "flags": 1, "attributes": [("a", "x"), ("n", 2)]},
        {"trace_id": 1, "span_id": 9, "attributes": [(Key("plain"), "y")]},
        {"trace_id": 1, "span_id": 10},
    ])]
    links = otel._mapped_traces(spans, as_objects=True)[0][0].links
    assert [type(link).__name__ for link in links] == ["OtelLink", "dict", "OtelLink"]
    assert links[0].to_dict() == {"trace_id": "%032x" % TRACE_ID, "span_id": "%016x" % 7,
                                  "attributes": {"a": "x", "n": "2"}, "tracestate": "k=v", "flags": 1}
    assert links[2].to_dict() == {"trace_id": "%032x" % 1, "span_id": "%016x" % 10, "flags": 0}
    copy = links[0].to_dict()
    copy["attributes"]["a"] = "changed"  # a copy: the link keeps its own
    assert links[0].to_dict()["attributes"]["a"] == "x"
    for version in ("v0.4", "v0.5", "v1.0"):
        options = otel._encoder_options(version, {})
        expected = TraceMsgPackEncoder(version, **options).encode_traces(otel.map_spans(spans))
        assert otel.encode_spans(spans, version) == expected


def test_events_are_made_as_otel_events_of_their_written_fields():
    """An SDK event becomes an OtelEvent: read-only, made only by the
    mapping, holding what a dict event holds (arrays as lists, attributes
    None when there are none), so spanpack._extras reads it as it reads a
    dict event; the bytes are those of dict events (see above)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("lib").start_as_current_span("s") as span:
        span.add_event("retry", {"attempt": 2, "codes": [1, 2]}, timestamp=5)
        span.add_event("plain", {"ok": True, "why": "x"}, timestamp=6)
        span.add_event("bare", timestamp=7)
    provider.shutdown()
    spans = list(memory.get_finished_spans())
    events = otel._mapped_traces(spans, as_objects=True)[0][0].events
    assert [type(event).__name__ for event in events] == ["OtelEvent"] * 3
    assert [(event.name, event.time_unix_nano, event.attributes) for event in events] == [
        ("retry", 5, {"attempt": 2, "codes": [1, 2]}), ("plain", 6, {"ok": True, "why": "x"}), ("bare", 7, None)]
    dict_events = otel.map_spans(spans)[0][0]["events"]  # map_spans keeps dict events
    assert [(event["name"], event["time_unix_nano"], event.get("attributes")) for event in dict_events] == [
        (event.name, event.time_unix_nano, event.attributes) for event in events]
    with pytest.raises(TypeError, match="cannot create"):
        type(events[0])()
    with pytest.raises(AttributeError):
        events[0].name = "other"
    for version in ("v0.4", "v0.5", "v1.0"):
        for options in ({}, {"native_span_events": False}):
            encoder_options = otel._encoder_options(version, dict(options))
            expected = TraceMsgPackEncoder(version, **encoder_options).encode_traces(otel.map_spans(spans))
            assert otel.encode_spans(spans, version, **options) == expected


def test_an_event_made_with_a_plain_dict_keeps_a_copy_of_it():
    """An SDK Event made with a plain dict (not one of the span's immutable
    BoundedAttributes) holds that caller's dict: the OtelEvent takes a copy,
    as a dict event does, so code that runs while later events are mapped
    (here a non-SDK event's property) and changes or empties the dict does
    not change what is written (found in review)."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import SpanContext, TraceFlags

    shared = {}

    class LateEvent:  # not an SDK class: read by spanpack.otel's rules in Python
        name, timestamp = "late", 2

        @property
        def attributes(self):
            shared.clear()
            return {}

    def spans():
        shared.clear()
        shared["k"] = "original"
        return [ReadableSpan(name="s", context=SpanContext(1, 2, False, TraceFlags(1)), resource=Resource({}),
                             events=[Event("e", shared, timestamp=1), LateEvent()], start_time=1, end_time=2)]

    for version in ("v0.4", "v0.5", "v1.0"):
        expected = TraceMsgPackEncoder(version, **otel._encoder_options(version, {})).encode_traces(
            otel.map_spans(spans()))
        assert b"original" in expected
        assert otel.encode_spans(spans(), version) == expected


def test_put_and_encode_take_objects_as_dict_spans():
    spans = _sdk_spans()
    by_objects, by_dicts = TraceMsgPackEncoder("v0.5"), TraceMsgPackEncoder("v0.5")
    for trace in otel._mapped_traces(spans, as_objects=True):
        by_objects.put(trace)
    for trace in otel.map_spans(spans):
        by_dicts.put(trace)
    assert by_objects.encode() == by_dicts.encode()


def test_an_otel_span_is_read_only_and_made_only_by_the_mapping():
    mapped = otel._mapped_traces(_sdk_spans(), as_objects=True)[0][0]
    cls = type(mapped)
    with pytest.raises(TypeError, match="cannot create"):
        cls()
    with pytest.raises(AttributeError):
        mapped.name = "other"
    with pytest.raises(AttributeError):
        mapped.tags = {}  # no instance dict: nothing but its fields
    assert not hasattr(mapped, "__dict__")
    if sys.version_info >= (3, 10):  # immutable heap types: a class attribute would reach every span
        traces = otel._mapped_traces(_sdk_spans(), as_objects=True)
        link_class = type(next(link for trace in traces for span in trace for link in getattr(span, "links", ())))
        event_class = type(next(event for trace in traces for span in trace for event in getattr(span, "events", ())))
        for immutable in (cls, link_class, event_class):
            with pytest.raises(TypeError):
                immutable.meta_struct = {"x": 1}  # type: ignore[union-attr]


def test_fields_renaming_keeps_dict_spans():
    """fields= renames an object span's attributes (not a dict span's keys):
    encode_spans then maps to dict spans, whose keys it leaves alone."""
    spans = _sdk_spans()
    options = {"fields": {"meta": "tags"}, "native_span_events": True}
    expected = TraceMsgPackEncoder("v0.4", **options).encode_traces(otel.map_spans(spans))
    assert otel.encode_spans(spans, fields={"meta": "tags"}) == expected
    assert b"db.system" in expected


class _RecordingWriter(AgentWriter):
    """An AgentWriter with a write() of its own: it keeps what it is given
    (then writes it as AgentWriter does)."""

    def write(self, trace: Any) -> None:
        self.recorded.append(trace)
        super().write(trace)


class _QuietWriter(AgentWriter):
    """A subclass that keeps AgentWriter's own write()."""


@pytest.mark.parametrize("writer_class, options, objects", [
    (AgentWriter, {}, True),
    (_QuietWriter, {}, True),
    (AgentWriter, {"fields": {"meta": "tags"}}, False),  # renamed fields: read as a dict span's keys
    (_RecordingWriter, {}, False),  # its write() may read and change spans as dicts
])
def test_the_exporter_gives_objects_to_agent_writers_own_write_only(writer_class, options, objects):
    writer = writer_class(url="http://127.0.0.1:9", **options)
    writer.recorded = []
    try:
        exporter = otel.DatadogSpanExporter(writer)
        assert exporter._takes_objects is objects
        spans = _sdk_spans()
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        writer.stop(timeout=1)
    if writer_class is _RecordingWriter:
        assert {type(span) for trace in writer.recorded for span in trace} == {dict}
        writer.recorded[0][0]["meta"].pop("span.kind")  # a dict of its own to change


def _span_with_links(links: List[Any]) -> Any:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, TraceFlags

    return ReadableSpan(name="n", context=SpanContext(0x1234, 0x55, False, TraceFlags(1)), resource=Resource({}),
                        attributes={}, links=links, start_time=10, end_time=20)


def _link(trace_id: int, span_id: int, flags: int = 0, attributes: Any = None, tracestate: str = "") -> Any:
    from opentelemetry.trace import SpanContext, TraceFlags, TraceState

    state = TraceState.from_header([tracestate]) if tracestate else None
    return Link(SpanContext(trace_id, span_id, False, TraceFlags(flags), state), attributes)


class _Key(str):
    pass


# Links at the edges of what the OtelLink form takes, and lists that mix it
# with dict links or fall back whole to spanpack._extras (whose rules judge).
EDGE_LINKS = {
    "ids at their limits": [_link(0, 0), _link(2**128 - 1, 2**64 - 1), _link(2**64, 2**63)],
    "ids beyond them": [_link(2**128, 1), _link(1, 2**64)],
    "flags at 2**31, 2**63 and 2**64": [_link(1, 2, 2**31), _link(1, 2, 2**63), _link(1, 2, 2**64)],
    "attribute values of every kind": [_link(1, 2, 1, {"s": "x", "b": True, "i": 2**70, "f": float("nan"),
                                                        "inf": float("-inf"), "seq": ("a", "b"), "n": (1, 2.5)})],
    "long and lone-surrogate text": [_link(1, 2, 0, {"long": "v" * 25_001, "exact": "v" * 25_000}),
                                     _link(3, 4, 0, {"bad": "\ud800"})],
    "a str subclass key beside plain links": [_link(1, 2), _link(3, 4, 0, {_Key("k"): "v"}), _link(5, 6, 1)] * 2,
    "more links than read ahead": [_link(i, i + 1, i % 256, {"i": i}, "k=%d" % i) for i in range(9)],
}


@pytest.mark.parametrize("options", [{}, {"lenient": True}, {"native_span_events": False}, {"intern": False}],
                         ids=lambda options: ",".join(options) or "defaults")
@pytest.mark.parametrize("case", list(EDGE_LINKS))
def test_links_at_the_edges_encode_as_dict_links_do(case, options):
    """Bytes equal to the dict links', or the same exception (type and
    message), in every version."""
    spans = [_span_with_links(EDGE_LINKS[case])]
    for version in ("v0.4", "v0.5", "v1.0"):
        encoder_options = otel._encoder_options(version, dict(options))

        def outcome(make: Any) -> Any:
            try:
                return make()
            except Exception as error:  # compared, not judged: both sides must agree
                return (type(error), str(error))

        expected = outcome(lambda: TraceMsgPackEncoder(version, **encoder_options).encode_traces(otel.map_spans(spans)))
        assert outcome(lambda: otel.encode_spans(spans, version, **options)) == expected, version
