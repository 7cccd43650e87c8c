"""spanpack against ddtrace 4.2.3's own encoders, byte for byte.

For hypothesis-built ddtrace Spans and for spans produced by a real ddtrace
tracer, every spanpack path (encode_traces, put + encode, encode_trace +
join_encoded) must return exactly the bytes of ddtrace's MsgpackEncoderV04 /
MsgpackEncoderV05 ``put`` + ``encode()``.  Where spanpack deliberately differs
(ddtrace's corrupt headers for 65,536-131,071 items) the test checks spanpack's
documented behaviour instead.
"""

from __future__ import annotations

import collections
import enum

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("ddtrace")

from ddtrace._trace.span import Span  # noqa: E402
from ddtrace.internal._encoding import MsgpackEncoderV04, MsgpackEncoderV05  # noqa: E402

import spanpack  # noqa: E402

from tests.support import (
    BIG,
    DEFAULT_MAX_SIZE,
    MAX_SPANS_PER_EXAMPLE,
    VERSIONS,
    assert_all_paths_equal,
    assert_lenient_paths,
    ddtrace_encoder,
    ddtrace_payload,
    largest_generated_trace,
    logical_traces,
    resolved_traces,
    spanpack_paths,
    to_ddtrace_trace,
    unpack,
)

PROPERTY = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# At most MAX_SPANS_PER_EXAMPLE spans (3 traces of 3), which ddtrace's
# reference buffer of BIG bytes holds: test_reference_buffer_holds_the_largest_example.
traces_lists = st.lists(logical_traces(), min_size=1, max_size=3)


def _span(name="n", service="s", resource="r", trace_id=1, span_id=2, **attributes):
    span = Span(name, service=service, resource=resource, trace_id=trace_id, span_id=span_id)
    span.start_ns = 5
    span.duration_ns = 7
    for key, value in attributes.items():
        setattr(span, key, value)
    return span


# ---------------------------------------------------------------------------
# Hypothesis: generated ddtrace spans


@PROPERTY
@given(traces=traces_lists)
def test_generated_spans_match_ddtrace(traces):
    """v0.4, v0.5, and v0.4 with native span events (ddtrace's
    DD_TRACE_NATIVE_SPAN_EVENTS), on the same generated traces."""
    dd_traces = [to_ddtrace_trace(trace) for trace in traces]
    for version, native in (("v0.4", False), ("v0.5", False), ("v0.4", True)):
        expected = ddtrace_payload(version, dd_traces, native_span_events=native)
        options = {"native_span_events": True} if native else {}
        results = spanpack_paths(version, dd_traces, "ddtrace", **options)
        try:
            assert_all_paths_equal(expected, results)
        except AssertionError as e:
            raise AssertionError("%s%s: %s" % (version, " native" if native else "", e)) from None


@settings(PROPERTY, max_examples=60)
@given(
    traces=st.lists(
        logical_traces(max_spans=2, v05_times=True, with_links=False, with_events=False, with_meta_struct=False),
        min_size=1,
        max_size=2,
    )
)
def test_v05_times_beyond_int64_clamped_like_ddtrace(traces):
    dd_traces = [to_ddtrace_trace(trace) for trace in traces]
    assert_all_paths_equal(ddtrace_payload("v0.5", dd_traces), spanpack_paths("v0.5", dd_traces, "ddtrace"))


_droppable_meta = st.one_of(st.integers(-5, 5), st.none(), st.floats(allow_nan=False), st.lists(st.integers(), max_size=2))
_droppable_metric = st.one_of(st.text(max_size=3), st.none(), st.lists(st.integers(), max_size=2))


@settings(PROPERTY, max_examples=100)
@given(
    version=st.sampled_from(VERSIONS),
    traces=st.lists(logical_traces(max_spans=3), min_size=1, max_size=2),
    bad_meta=st.lists(st.tuples(st.text(max_size=4), _droppable_meta), max_size=3),
    bad_metrics=st.lists(st.tuples(st.text(max_size=4), _droppable_metric), max_size=3),
    data=st.data(),
)
def test_lenient_mode_drops_like_ddtrace(version, traces, bad_meta, bad_metrics, data):
    """ddtrace silently skips meta values that are not text and metrics that
    are not numbers; spanpack's lenient mode drops the same entries, so the
    bytes are the same (and every drop is counted)."""
    dd_traces = [to_ddtrace_trace(trace) for trace in traces]
    spans = [span for trace in dd_traces for span in trace]
    for key, value in bad_meta:
        data.draw(st.sampled_from(spans))._meta[key] = value
    for key, value in bad_metrics:
        data.draw(st.sampled_from(spans))._metrics[key] = value
    expected_drops = sum(
        sum(1 for v in s._meta.values() if not isinstance(v, (str, bytes)))
        + sum(1 for v in s._metrics.values() if not isinstance(v, (int, float)))
        # v0.5 has no place for meta_struct: each entry is counted as dropped.
        + (len(s._meta_struct) if version == "v0.5" else 0)
        for s in spans
    )
    expected = ddtrace_payload(version, dd_traces)
    # put() buffers the whole payload, which 6 generated spans can take beyond
    # the default 20 MiB.
    encoder = spanpack.TraceMsgPackEncoder(
        version, "ddtrace", lenient=True, max_size=max(DEFAULT_MAX_SIZE, len(expected)))
    assert_lenient_paths(encoder, dd_traces, expected, expected_drops)


def test_reference_buffer_holds_the_largest_example():
    """The ddtrace reference encoder's fixed limit (BIG) holds the largest
    example the strategies can draw; spanpack's buffered path is sized per
    example (spanpack_paths), so only ddtrace's needs this bound."""
    [span] = to_ddtrace_trace(largest_generated_trace())
    for version in VERSIONS:
        largest = len(ddtrace_payload(version, [[span]]))
        assert largest > 4_000_000 if version == "v0.4" else largest > 100_000
        assert MAX_SPANS_PER_EXAMPLE * largest < BIG, (version, largest)


def test_trace_id_high_tag_added_where_ddtrace_encoder_does_not():
    """ddtrace's encoder writes only what the span's meta holds; its trace
    processor sets _dd.p.tid before encoding.  spanpack adds the tag itself
    when a 128-bit trace's first span lacks it (docs/wire-format.md), so
    byte-identity with ddtrace holds for spans that already carry it."""
    span = _span(trace_id=(0xABC << 64) | 5)
    for version in VERSIONS:
        theirs = unpack(ddtrace_payload(version, [[span]]))
        ours = unpack(spanpack.TraceMsgPackEncoder(version, "ddtrace").encode_traces([[span]]))
        if version == "v0.4":
            assert "meta" not in theirs[0][0]
            assert ours[0][0].pop("meta") == {"_dd.p.tid": "0000000000000abc"}
            assert ours == theirs
        else:
            assert theirs[1][0][0][9] == {}
            table, traces = ours
            assert {table[k]: table[v] for k, v in traces[0][0][9].items()} == {"_dd.p.tid": "0000000000000abc"}
    span._meta["_dd.p.tid"] = "0000000000000abc"
    for version in VERSIONS:
        assert_all_paths_equal(ddtrace_payload(version, [[span]]), spanpack_paths(version, [[span]], "ddtrace"))


def test_bool_metrics_are_written_as_ints_like_ddtrace():
    span = _span(_metrics={"yes": True, "no": False})
    for version in VERSIONS:
        assert_all_paths_equal(ddtrace_payload(version, [[span]]), spanpack_paths(version, [[span]], "ddtrace"))
    # the span map ends with metrics: {"yes": 1, "no": 0} as positive fixints, not msgpack true/false
    assert ddtrace_payload("v0.4", [[span]]).endswith(bytes.fromhex("a76d657472696373 82 a3796573 01 a26e6f 00"))


def test_strings_over_25000_chars_and_bytes_values():
    """Long str (code points) and long bytes values are cut the same way; the
    truncated forms of equal prefixes share one v0.5 table entry."""
    long_str = "\u00e9" * 25001
    span = _span(
        service="s" * 25000,
        resource="r" * 25001,
        _meta={
            "a": long_str,
            "b": "\u00e9" * 2486 + "<truncated>...",
            "c": b"x" * 30000,
            "d": "x" * 2486 + "<truncated>...",
            "e": "\U0001F600" * 25000,
            b"f": b"\xf0\x9f\x98\x80 bytes",
            "g": bytearray(b"v0.4 bytearray"),
        },
    )
    for version in VERSIONS:
        if version == "v0.5":
            del span._meta["g"]  # ddtrace's v0.5 table cannot hash a bytearray
        expected = ddtrace_payload(version, [[span]])
        assert_all_paths_equal(expected, spanpack_paths(version, [[span]], "ddtrace"))


def test_empty_traces_and_many_traces_per_payload():
    traces = [[], [_span()], [], [_span(span_id=i + 3, service="svc%d" % (i % 3)) for i in range(20)]]
    for version in VERSIONS:
        expected = ddtrace_payload(version, traces)
        assert_all_paths_equal(expected, spanpack_paths(version, traces, "ddtrace"))


def test_origin_with_nul_written_whole_in_v04():
    """docs/wire-format.md: ddtrace 4.2.3's v0.4 encoder cuts an origin at
    its first NUL (C strlen); spanpack writes it whole."""
    span = _span()
    span.context.dd_origin = "synth\x00etics"
    assert unpack(ddtrace_payload("v0.4", [[span]]))[0][0]["meta"]["_dd.origin"] == "synth"
    results = spanpack_paths("v0.4", [[span]], "ddtrace")
    assert unpack(results["encode_traces"])[0][0]["meta"] == {"_dd.origin": "synth\x00etics"}
    assert_all_paths_equal(results["encode_traces"], results)
    span.context.dd_origin = "synth"
    cut = ddtrace_payload("v0.4", [[span]])
    assert results["encode_traces"] == cut.replace(b"\xa5synth", b"\xabsynth\x00etics")


class _ContextWithoutMeta:
    """A context that only offers the dd_origin property ddtrace's encoder reads."""

    __slots__ = ("origin",)

    def __init__(self, origin):
        self.origin = origin

    @property
    def dd_origin(self):
        return self.origin


@pytest.mark.parametrize("version", VERSIONS)
def test_origin_read_from_context_meta_or_through_dd_origin(version):
    """fields="ddtrace" reads the origin from Context._meta (what the
    dd_origin property returns) and falls back to the property for a context
    without that dict; a missing context means no origin."""
    with_meta = _span()
    with_meta.context.dd_origin = "synthetics"
    expected = ddtrace_payload(version, [[with_meta]])
    assert_all_paths_equal(expected, spanpack_paths(version, [[with_meta]], "ddtrace"))

    property_only = _span()
    property_only.context = _ContextWithoutMeta("synthetics")
    assert_all_paths_equal(expected, spanpack_paths(version, [[property_only]], "ddtrace"))

    class OverridingContext(type(with_meta.context)):
        """A Context subclass whose dd_origin is not its _meta entry."""

        @property
        def dd_origin(self):
            return "synthetics"

    overriding = _span()
    overriding.context = OverridingContext(trace_id=overriding.trace_id, span_id=overriding.span_id)
    overriding.context._meta["_dd.origin"] = "stale"
    assert_all_paths_equal(expected, spanpack_paths(version, [[overriding]], "ddtrace"))

    no_context = _span()
    no_context.context = None
    no_origin = _span()
    assert_all_paths_equal(
        ddtrace_payload(version, [[no_origin]]), spanpack_paths(version, [[no_context]], "ddtrace")
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_origin_follows_context_classes_changed_between_traces(version):
    """The encoder keeps how each context class gives its origin from trace
    to trace: a class changed since, or another class in between, is read
    as it is now."""
    encoder = spanpack.TraceMsgPackEncoder(version, fields="ddtrace")

    def origin_written(context):
        span = _span()
        span.context = context
        payload = msgpack.unpackb(encoder.encode_traces([[span]]), strict_map_key=False)
        if version == "v0.5":
            strings, traces = payload
            meta = traces[0][0][9]
            return {strings[k]: strings[v] for k, v in meta.items()}.get("_dd.origin")
        return (payload[0][0].get("meta") or {}).get("_dd.origin")

    class Moving:
        __slots__ = ("dd_origin",)

        def __init__(self, origin):
            self.dd_origin = origin

    assert origin_written(Moving("first")) == "first"
    assert origin_written(_ContextWithoutMeta("other class")) == "other class"
    assert origin_written(Moving("again")) == "again"
    Moving.dd_origin = property(lambda self: "from the property")
    assert origin_written(Moving.__new__(Moving)) == "from the property"
    del Moving.dd_origin
    assert origin_written(Moving.__new__(Moving)) is None


@pytest.mark.parametrize("fields", [None, "ddtrace"])
def test_origin_follows_context_descriptor_classes_changed_between_traces(fields):
    """A span class's `context` given by an object of a Python class (a
    descriptor of one's own, a plain class value) is read again at each
    trace: that class can gain or lose __get__ and __set__ without the span
    class changing (found in review)."""
    from ddtrace._trace.context import Context

    first = Context(trace_id=1, span_id=2, dd_origin="first")
    second = Context(trace_id=1, span_id=2, dd_origin="second")

    class DataDescriptor:
        def __get__(self, span, owner):
            return first if span is not None else self

        def __set__(self, span, value):
            pass

    class WithDescriptor(Span):
        context = DataDescriptor()

    def origin_written(encoder, span):
        payload = msgpack.unpackb(encoder.encode_traces([[span]]), strict_map_key=False)
        return (payload[0][0].get("meta") or {}).get("_dd.origin")

    encoder = spanpack.TraceMsgPackEncoder("v0.4", fields=fields)
    span = WithDescriptor("n", service="s", resource="r", trace_id=1, span_id=2)
    span.start_ns, span.duration_ns = 5, 7
    assert origin_written(encoder, span) == "first"
    del DataDescriptor.__set__  # a non-data descriptor: the instance __dict__ wins
    span.__dict__["context"] = second
    assert span.context is second
    assert origin_written(encoder, span) == "second"

    class WithClassValue(Span):
        __slots__ = ()

    WithClassValue.context = first  # a plain class value
    slotted = Span.__new__(WithClassValue)  # (Span.__init__ would set the class value)
    for name, value in dict(name="n", service="s", resource="r", trace_id=1, span_id=2, parent_id=None,
                            start_ns=5, duration_ns=7, error=0, span_type=None, _meta={}, _metrics={}).items():
        object.__setattr__(slotted, name, value)
    assert origin_written(encoder, slotted) == "first"
    Context.__get__ = lambda context, span, owner: second
    try:
        assert slotted.context is second
        assert origin_written(encoder, slotted) == "second"
    finally:
        del Context.__get__


def test_long_origin_v05_table_entries_match_ddtrace():
    """ddtrace's v0.5 table keys a long origin by the whole string (the entry
    is written truncated), so it does not share an index with another string
    that truncates to the same text."""
    long_text = "x" * 25001
    span = _span(span_type=long_text)
    span.context.dd_origin = long_text
    expected = ddtrace_payload("v0.5", [[span]])
    assert len(unpack(expected)[0]) == 7  # "", _dd.origin, origin, s, n, r, span_type
    assert_all_paths_equal(expected, spanpack_paths("v0.5", [[span]], "ddtrace"))
    # Two traces with long origins that truncate alike: two entries.
    other = _span(span_id=3)
    other.context.dd_origin = "x" * 25002
    expected = ddtrace_payload("v0.5", [[span], [other]])
    assert_all_paths_equal(expected, spanpack_paths("v0.5", [[span], [other]], "ddtrace"))


def test_long_origin_written_truncated_in_v05_whole_in_v04():
    span = _span()
    span.context.dd_origin = "o" * 30000
    for version in VERSIONS:
        expected = ddtrace_payload(version, [[span]])
        assert_all_paths_equal(expected, spanpack_paths(version, [[span]], "ddtrace"))
    assert unpack(ddtrace_payload("v0.5", [[span]]))[0][2] == "o" * 2486 + "<truncated>..."
    assert unpack(ddtrace_payload("v0.4", [[span]]))[0][0]["meta"]["_dd.origin"] == "o" * 30000


def test_origin_with_nul_v05_matches_ddtrace():
    """In v0.5 the origin is a table entry and both keep the whole string."""
    span = _span()
    span.context.dd_origin = "synth\x00etics"
    expected = ddtrace_payload("v0.5", [[span]])
    assert "synth\x00etics" in unpack(expected)[0]
    assert_all_paths_equal(expected, spanpack_paths("v0.5", [[span]], "ddtrace"))


def test_v04_link_dropped_attributes_count_left_out():
    """Documented difference: ddtrace 4.2.3 writes a v0.4 link's
    dropped_attributes_count (libdatadog rejects the payload); spanpack leaves
    it out, and keeps it in v0.5's JSON links like ddtrace."""
    span = _span()
    span.set_link(trace_id=(5 << 64) | 6, span_id=7, flags=1, attributes={"a": "b", "c": "d"})
    span._links[0]._drop_attribute("c")
    reference = unpack(ddtrace_payload("v0.4", [[span]], v04_link_drops=True))[0][0]["span_links"]
    assert reference == [{"trace_id": 6, "span_id": 7, "attributes": {"a": "b"},
                          "dropped_attributes_count": 1, "flags": 2**31 + 1, "trace_id_high": 5}]
    ours = unpack(spanpack.TraceMsgPackEncoder("v0.4", "ddtrace").encode_traces([[span]]))[0][0]["span_links"]
    assert ours == [{"trace_id": 6, "span_id": 7, "attributes": {"a": "b"}, "flags": 2**31 + 1,
                     "trace_id_high": 5}]
    assert_all_paths_equal(ddtrace_payload("v0.4", [[span]]), spanpack_paths("v0.4", [[span]], "ddtrace"))
    expected = ddtrace_payload("v0.5", [[span]])
    assert '"dropped_attributes_count": 1' in unpack(expected)[0][-1]
    assert_all_paths_equal(expected, spanpack_paths("v0.5", [[span]], "ddtrace"))


@pytest.mark.parametrize(
    "version,attributes",
    [
        pytest.param("v0.5", {"error": None}, id="v05-error-None"),
        pytest.param("v0.5", {"duration_ns": None}, id="v05-duration-None"),
        pytest.param("v0.4", {"error": True}, id="v04-error-True"),
        pytest.param("v0.5", {"error": -7}, id="v05-error-negative"),
        pytest.param("v0.4", {"_events": "name=None"}, id="v04-event-name-None"),
        pytest.param("v0.5", {"_events": "name=5"}, id="v05-event-name-int"),
        pytest.param("v0.5", {"_events": "time=1.5"}, id="v05-event-time-float"),
        pytest.param("v0.4", {"_events": "time=1.5"}, id="v04-event-time-float"),
    ],
)
def test_unusual_field_values_match_ddtrace(version, attributes):
    """Values a ddtrace Span does not normally hold, where spanpack agrees
    (JSON events are whatever json.dumps makes of them)."""
    from ddtrace._trace.span import SpanEvent

    events = {"name=None": [SpanEvent(None, {}, 1)], "name=5": [SpanEvent(5, {"a": None}, 1)],
              "time=1.5": [SpanEvent("e", {}, 1.5)]}
    if attributes.get("_events") in events:
        attributes = dict(attributes, _events=events[attributes["_events"]])
    span = _span(**attributes)
    expected = ddtrace_payload(version, [[span]])
    assert_all_paths_equal(expected, spanpack_paths(version, [[span]], "ddtrace"))


def test_documented_differences_for_error_and_start():
    """docs/wire-format.md: error None or a float, v0.4 start_ns None."""
    encoder = spanpack.TraceMsgPackEncoder("v0.4", "ddtrace")
    assert unpack(ddtrace_payload("v0.4", [[_span(error=None)]]))[0][0]["error"] == 1
    assert "error" not in unpack(encoder.encode_traces([[_span(error=None)]]))[0][0]
    assert encoder.encode_traces([[_span(error=None)]]) == encoder.encode_traces([[_span(error=0)]])
    for version, error in (("v0.4", 0.5), ("v0.5", 1.0)):
        ddtrace_payload(version, [[_span(error=error)]])  # ddtrace accepts it
        with pytest.raises(TypeError, match=r"^trace 0, span 0, error"):
            spanpack.TraceMsgPackEncoder(version, "ddtrace").encode_traces([[_span(error=error)]])
    assert unpack(ddtrace_payload("v0.4", [[_span(start_ns=None)]]))[0][0]["start"] is None
    with pytest.raises(TypeError, match=r"^trace 0, span 0, start_ns"):
        encoder.encode_traces([[_span(start_ns=None)]])
    # v0.5 (ddtrace writes 0) refuses it too: every version takes the same traces.
    assert resolved_traces("v0.5", ddtrace_payload("v0.5", [[_span(start_ns=None)]]))[0][0][6] == 0
    with pytest.raises(TypeError, match=r"^trace 0, span 0, start_ns"):
        spanpack.TraceMsgPackEncoder("v0.5", "ddtrace").encode_traces([[_span(start_ns=None)]])


def test_native_span_event_attribute_keys_must_be_text():
    from ddtrace._trace.span import SpanEvent

    span = _span(_events=[SpanEvent("e", {1: "x"}, 1)])
    with pytest.raises(Exception):
        ddtrace_payload("v0.4", [[span]], native_span_events=True)
    with pytest.raises(TypeError, match=r"^trace 0, span 0, events"):
        spanpack.TraceMsgPackEncoder("v0.4", "ddtrace", native_span_events=True).encode_traces([[span]])


class _Level(enum.IntEnum):
    HIGH = 1


def test_meta_struct_exact_types_match_ddtrace():
    """Non-str keys inside the document, bytes and bytearray as bin, long
    strings not truncated."""
    span = _span(_meta_struct={"appsec": {1: 2, None: [b"x", bytearray(b"y"), 1.5, "z" * 30000, True]}})
    expected = ddtrace_payload("v0.4", [[span]])
    assert_all_paths_equal(expected, spanpack_paths("v0.4", [[span]], "ddtrace"))


@pytest.mark.parametrize(
    "value,ddtrace_document,spanpack_document",
    [
        ((1, 2), "Can not serialize [tuple] object", [1, 2]),
        ({"level": _Level.HIGH}, {"level": "Can not serialize [_Level] object"}, {"level": 1}),
        (collections.OrderedDict(a=1), "Can not serialize [OrderedDict] object", {"a": 1}),
        ({"n": 2**64}, {"n": "Integer value out of range"}, ValueError),
        ({"s": {1}}, {"s": "Can not serialize [set] object"}, TypeError),
    ],
    ids=["tuple", "int-subclass", "dict-subclass", "int-out-of-range", "set"],
)
def test_meta_struct_other_types_documented_difference(value, ddtrace_document, spanpack_document):
    """docs/wire-format.md: ddtrace replaces them with an error string,
    spanpack packs them as msgpack-python would, or raises."""
    span = _span(_meta_struct={"appsec": value})
    reference = unpack(ddtrace_payload("v0.4", [[span]]))[0][0]["meta_struct"]["appsec"]
    assert unpack(reference) == ddtrace_document
    encoder = spanpack.TraceMsgPackEncoder("v0.4", "ddtrace")
    if isinstance(spanpack_document, type):
        with pytest.raises(spanpack_document, match=r"^trace 0, span 0, meta_struct key 'appsec'"):
            encoder.encode_traces([[span]])
        return
    results = spanpack_paths("v0.4", [[span]], "ddtrace")
    assert_all_paths_equal(results["encode_traces"], results)
    document = unpack(results["encode_traces"])[0][0]["meta_struct"]["appsec"]
    assert unpack(document) == spanpack_document


# ---------------------------------------------------------------------------
# Spans from a real ddtrace tracer (processors set _dd.p.tid, _dd.origin, ...)


@pytest.fixture
def captured_traces():
    """Route the global tracer's finished traces into a list instead of the
    agent writer; restores the original writer afterwards."""
    from ddtrace.internal.writer.writer import TraceWriter
    from ddtrace.trace import tracer

    class CapturingWriter(TraceWriter):
        def __init__(self):
            self.traces = []

        def recreate(self, appsec_enabled=None):
            return self

        def stop(self, timeout=None):
            pass

        def write(self, spans=None):
            if spans:
                # What the agent writers do right before put(): the keep rate.
                spans[0]._metrics["_dd.tracer_kr"] = 1.0
                self.traces.append(spans)

        def flush_queue(self):
            pass

    aggregator = tracer._span_aggregator
    original = aggregator.writer
    writer = CapturingWriter()
    aggregator.writer = writer
    try:
        yield tracer, writer.traces
    finally:
        aggregator.writer = original


def test_real_tracer_spans_match_ddtrace(captured_traces):
    from ddtrace._trace._span_pointer import _SpanPointerDirection
    from ddtrace.trace import Context

    tracer, traces = captured_traces
    # A distributed trace arriving with a synthetics origin and a 128-bit id.
    tracer.context_provider.activate(
        Context(trace_id=(0xABC << 64) | 5, span_id=77, dd_origin="synthetics", sampling_priority=1)
    )
    with tracer.trace("web.request", service="web", resource="GET /", span_type="web") as root:
        root.set_tag("http.status_code", 200)
        root.set_tag("unicode", "h\u00e9llo \U0001F600")
        root.set_tag("big", 2**60)
        root.set_tag("flag", True)
        root.set_metric("ratio", 0.25)
        root.set_tag("long", "z" * 30000)
        root._add_event("cache.miss", {"key": "k", "hits": [1, 2], "ok": False}, 1_700_000_000)
        root._set_struct_tag("appsec", {"triggers": [{"rule": 1}], "raw": b"\x00\x01"})
        root._add_span_pointer("aws.s3.object", _SpanPointerDirection.DOWNSTREAM, "e3b0c442", {"x": 1})
        with tracer.trace("db.query", service="db", span_type="sql") as child:
            child.set_tag("sql.query", "SELECT 1")
            child.link_span(Context(trace_id=(1 << 100) + 3, span_id=9, sampling_priority=1), {"reason": "retry"})
            try:
                with tracer.trace("inner"):
                    raise KeyError("boom \u2603")
            except KeyError:
                pass
    # A local root trace: fresh 128-bit id, no origin.
    with tracer.trace("job", service="worker") as job:
        job.set_tag("attempt", 3)
    # An unfinished span is still encodable (a partial flush writes such spans).
    open_span = tracer.trace("still.open")
    with tracer.start_span("finished.child", child_of=open_span, activate=True):
        pass
    open_span.finish()

    assert len(traces) >= 3
    roots = [trace[0] for trace in traces]
    assert roots[0]._meta["_dd.p.tid"] == "0000000000000abc"
    assert roots[0]._meta["_dd.origin"] == "synthetics"
    assert all("_dd.p.tid" in span._meta for span in roots if span.trace_id >> 64)

    for version in VERSIONS:
        expected = ddtrace_payload(version, traces)
        assert_all_paths_equal(expected, spanpack_paths(version, traces, "ddtrace"))
    expected = ddtrace_payload("v0.4", traces, native_span_events=True)
    assert_all_paths_equal(
        expected, spanpack_paths("v0.4", traces, "ddtrace", native_span_events=True)
    )


# ---------------------------------------------------------------------------
# 65,536 items: ddtrace 4.2.3 writes a corrupt header, spanpack a valid one


def _ddtrace_puts(version, traces):
    encoder = ddtrace_encoder(version)
    for trace in traces:
        encoder.put(trace)
    [(payload, count)] = encoder.encode()
    assert count == len(traces)
    return payload


@pytest.mark.parametrize("version", VERSIONS)
def test_traces_count_below_corrupt_range_matches_ddtrace(version):
    span = _span()
    traces = [[span]] * 65535
    expected = _ddtrace_puts(version, traces)
    assert_all_paths_equal(expected, spanpack_paths(version, traces, "ddtrace"))
    decoded = unpack(expected)
    assert len(decoded if version == "v0.4" else decoded[1]) == 65535


@pytest.mark.parametrize("count", [65536])
@pytest.mark.parametrize("version", VERSIONS)
def test_traces_count_in_corrupt_range_is_valid_in_spanpack(version, count):
    span = _span()
    traces = [[span]] * count
    reference = _ddtrace_puts(version, traces)
    with pytest.raises(Exception):
        msgpack.unpackb(reference, strict_map_key=False)

    results = spanpack_paths(version, traces, "ddtrace")
    payload = results["encode_traces"]
    assert_all_paths_equal(payload, results)
    decoded = unpack(payload)
    if version == "v0.4":
        assert payload[:5] == b"\xdd" + count.to_bytes(4, "big")
        assert len(decoded) == count
        assert decoded[0] == decoded[-1] == unpack(ddtrace_payload("v0.4", [[span]]))[0]
    else:
        table, chunks = decoded
        assert table == ["", "_dd.origin", "s", "n", "r"]
        assert len(chunks) == count
        table_bytes = b"\x92\x95\xa0\xaa_dd.origin\xa1s\xa1n\xa1r"
        assert payload[: len(table_bytes) + 5] == table_bytes + b"\xdd" + count.to_bytes(4, "big")


def _table_trace(distinct):
    """One span adding `distinct` new strings to the v0.5 table: meta keys
    whose values are "" (index 0); service/resource None, name "" (index 0)."""
    span = _span(name="", service=None, resource=None)
    span._meta = {"k%06d" % i: "" for i in range(distinct)}
    return [span]


def test_string_table_65535_entries_matches_ddtrace():
    trace = _table_trace(65535 - 2)  # plus "" and "_dd.origin"
    expected = ddtrace_payload("v0.5", [trace])
    assert expected[1:4] == b"\xdc\xff\xff"
    table, _ = unpack(expected)
    assert len(table) == 65535
    assert_all_paths_equal(expected, spanpack_paths("v0.5", [trace], "ddtrace"))


@pytest.mark.parametrize("entries", [65536, 65537, 131071])
def test_string_table_in_corrupt_range_is_valid_in_spanpack(entries):
    trace = _table_trace(entries - 2)
    reference = ddtrace_payload("v0.5", [trace])
    with pytest.raises(Exception):
        msgpack.unpackb(reference, strict_map_key=False)

    results = spanpack_paths("v0.5", [trace], "ddtrace")
    payload = results["encode_traces"]
    assert_all_paths_equal(payload, results)
    assert payload[:6] == b"\x92\xdd" + entries.to_bytes(4, "big")
    table, chunks = unpack(payload)
    assert len(table) == entries
    assert table[:3] == ["", "_dd.origin", "k000000"]
    meta = chunks[0][0][9]
    assert len(meta) == entries - 2
    assert all(table[k].startswith("k") and table[v] == "" for k, v in meta.items())


def test_string_table_131072_entries_matches_ddtrace():
    """From 131,072 on ddtrace's header is right again."""
    trace = _table_trace(131072 - 2)
    expected = ddtrace_payload("v0.5", [trace])
    assert expected[:6] == b"\x92\xdd\x00\x02\x00\x00"
    assert_all_paths_equal(expected, spanpack_paths("v0.5", [trace], "ddtrace"))


def test_ddtrace_encoder_classes_are_the_reference():
    """Guard: the reference really is ddtrace 4.2.3's encoder."""
    import ddtrace

    assert ddtrace.__version__ == "4.2.3"
    assert ddtrace_encoder("v0.4").__class__ is MsgpackEncoderV04
    assert ddtrace_encoder("v0.5").__class__ is MsgpackEncoderV05
