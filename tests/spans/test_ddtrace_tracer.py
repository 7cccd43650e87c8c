"""spanpack on the spans ddtrace's own tracer makes, against ddtrace's own encoder.

Whichever ddtrace is installed (the [test] extra's 4.2.3, whose Span is pure
Python; CI's ddtrace matrix, scripts/ci_ddtrace.sh, runs this module again with
the native spans of later release lines), traces are made through ddtrace's
tracer API and taken where ddtrace's writer would take them (after every
trace processor, so with the trace-level tags ddtrace adds), then encoded by
ddtrace's MsgpackEncoderV04/V05 (put + encode) and by each spanpack entry
point: the bytes must be equal.  v1.0 payloads of the same traces must mean
what v0.4's mean (the canonical forms of test_one_meaning.py).
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, List

import pytest

pytest.importorskip("ddtrace")

import ddtrace  # noqa: E402
from ddtrace._trace.span import Span  # noqa: E402
from ddtrace.trace import Context, tracer  # noqa: E402

import spanpack  # noqa: E402
from spanpack import ddtrace_shapes  # noqa: E402

from tests.spans.test_one_meaning import CANONICAL  # noqa: E402
from tests.support import assert_all_paths_equal, ddtrace_payload, spanpack_paths  # noqa: E402

# Each form spanpack can be asked to read ddtrace's spans in: by default (the
# class recognised) and with fields="ddtrace".
FIELDS = (None, "ddtrace")
# (version, native span events): v0.4 and v0.5 as ddtrace's writer sends
# them by default, and v0.4 with DD_TRACE_NATIVE_SPAN_EVENTS.
ENCODINGS = (("v0.4", False), ("v0.5", False), ("v0.4", True))


@pytest.fixture
def finished_traces():
    """Calls a function that traces with ddtrace's global tracer and returns
    the traces ddtrace's writer would have been given."""

    def run(body: Callable[[], None]) -> List[list]:
        traces = ddtrace_shapes.finished_traces(body)
        assert traces, "the tracer finished no trace"
        return traces

    return run


# ---------------------------------------------------------------------------
# Traces made through ddtrace's API: the benchmark's shapes
# (spanpack.ddtrace_shapes) and the features ddtrace writes


def tag_and_metric_types() -> None:
    with tracer.trace("worker.job", service="jobs", resource="nightly") as span:
        span.set_tag("text", "value")
        span.set_tag("integer", 42)
        span.set_tag("big.integer", 1 << 60)
        span.set_tag("negative", -7)
        span.set_tag("real", 2.5)
        span.set_tag("flag", True)
        span.set_tag("nothing", None)
        span.set_tag("raw", b"bytes")
        span.set_tag("items", [1, "two"])
        span.set_tag("mapping", {"k": "v"})
        span.set_tag("unicode", "h\u00e9llo \u2603")
        span.set_tags({"many.a": "1", "many.b": 2})
        span.set_metric("metric.int", 3)
        span.set_metric("metric.float", 0.25)
        span.set_metrics({"metric.more": 1e300, "metric.small": -1e-300})
        span.set_tag("manual.keep")


def distributed_with_origin() -> None:
    """A trace continued from a propagated context: origin, sampling priority
    and decision maker, _dd.p.* tags, a 128-bit trace id."""
    parent = Context(trace_id=(0x6B15 << 96) | (0xABC << 64) | 12345, span_id=777, dd_origin="synthetics",
                     sampling_priority=2, meta={"_dd.p.dm": "-4", "_dd.p.usr.id": "dXNlcg=="})
    tracer.context_provider.activate(parent)
    try:
        with tracer.trace("web.request", service="web", resource="GET /health") as root:
            root.set_tag("http.method", "GET")
            with tracer.trace("child"):
                pass
    finally:
        tracer.context_provider.activate(None)


def manual_drop_64_bit() -> None:
    parent = Context(trace_id=42, span_id=43, sampling_priority=-1, meta={"_dd.p.dm": "-3"})
    tracer.context_provider.activate(parent)
    try:
        with tracer.trace("background") as span:
            span.set_tag("manual.drop")
    finally:
        tracer.context_provider.activate(None)


SHAPES: Dict[str, Callable[[], None]] = {
    **{name: body for name, (body, _count) in ddtrace_shapes.SHAPES.items()},
    "tag_and_metric_types": tag_and_metric_types,
    "distributed_with_origin": distributed_with_origin,
    "manual_drop_64_bit": manual_drop_64_bit,
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("fields", FIELDS, ids=["recognised", "fields=ddtrace"])
def test_tracer_spans_encode_as_ddtrace_encodes_them(finished_traces, shape, fields):
    traces = finished_traces(SHAPES[shape])
    for version, native in ENCODINGS:
        expected = ddtrace_payload(version, traces, native_span_events=native)
        options = {"native_span_events": True} if native else {}
        try:
            assert_all_paths_equal(expected, spanpack_paths(version, traces, fields, **options))
        except AssertionError as e:
            raise AssertionError("ddtrace %s, %s%s: %s" % (
                ddtrace.__version__, version, " native events" if native else "", e)) from None


def test_every_shape_carries_tags_and_metrics(finished_traces):
    """The comparison above is not vacuous: ddtrace's own encoder writes tags
    and metrics on every span of these traces, and spanpack writes them too."""
    for shape, body in SHAPES.items():
        traces = finished_traces(body)
        payload = spanpack.TraceMsgPackEncoder("v0.4").encode_traces(traces)
        for trace in CANONICAL["v0.4"](payload):
            for span in trace:
                assert span["meta"], (shape, span["name"])
            assert any(span["metrics"] for span in trace), shape


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_v10_means_what_v04_means(finished_traces, shape):
    traces = finished_traces(SHAPES[shape])
    canonical = {
        version: CANONICAL[version](spanpack.TraceMsgPackEncoder(version, native_span_events=True).encode_traces(traces))
        for version in ("v0.4", "v1.0")
    }
    assert canonical["v1.0"] == canonical["v0.4"]


# ---------------------------------------------------------------------------
# Longer traces of native spans, and dict spans among them: what a lenient
# encoder writes of valid spans, and an error naming the bad span.


def _web_trace(count: int) -> list:
    def body() -> None:
        with tracer.trace("web.request", service="web", resource="GET /"):
            for i in range(count - 1):
                with tracer.trace("db.query", service="db", resource="q-%d" % i) as child:
                    child.set_tag("k", "v-%d" % i)
                    child.set_metric("rows", i)

    [trace] = ddtrace_shapes.finished_traces(body)
    return trace


def _dict_span(trace: list, span_id: int, **overrides) -> dict:
    span = {"trace_id": trace[0].trace_id, "span_id": span_id, "parent_id": trace[0].span_id,
            "service": "d", "name": "dict", "resource": "r", "span_type": None, "start_ns": 1,
            "duration_ns": 2, "error": 0, "meta": {"d": "x"}, "metrics": {}}
    span.update(overrides)
    return span


@pytest.mark.parametrize("version", ["v0.4", "v0.5", "v1.0"])
def test_long_and_mixed_traces_give_the_bytes_a_lenient_encoder_gives(version):
    """Traces of 2 to 13 native spans, and one with dict spans among them."""
    traces = [_web_trace(count) for count in (2, 3, 4, 5, 8, 9, 13)]
    mixed = _web_trace(11)
    for position in (1, 4, 8):
        mixed.insert(position, _dict_span(mixed, 900 + position))
    traces.append(mixed)
    expected = spanpack.TraceMsgPackEncoder(version, lenient=True).encode_traces(traces)
    assert_all_paths_equal(expected, spanpack_paths(version, traces))


@pytest.mark.parametrize("version", ["v0.4", "v0.5", "v1.0"])
def test_a_bad_span_among_native_spans_is_the_one_named(version):
    """A dict span refused when written, among native spans: the error
    names it, and an encoder is left as before the trace."""
    for position in (1, 4, 6):
        trace = _web_trace(9)
        trace.insert(position, _dict_span(trace, 77, meta=5))
        encoder = spanpack.TraceMsgPackEncoder(version)
        encoder.put(_web_trace(2))
        size = encoder.size
        with pytest.raises(TypeError) as info:
            encoder.put(trace)
        assert str(info.value) == "trace 0, span %d, meta: expected a dict, not int" % position
        assert (len(encoder), encoder.size) == (1, size)


# ---------------------------------------------------------------------------
# Never partial: a ddtrace Span class spanpack cannot read whole is refused


def _native() -> bool:
    """Does this ddtrace keep tags behind accessors only (4.9 and later)?"""
    return not hasattr(Span, "_meta")


def _subclass_with(name: str, value) -> type:
    return type("Renamed", (Span,), {"__slots__": (), name: value})


class _LookAlike:
    """A class spanpack takes for ddtrace's Span (by module and name) that
    keeps its tags neither way: like a ddtrace release that renamed them."""

    def __init__(self):
        self.trace_id, self.span_id, self.parent_id, self.name = 1, 2, None, "n"
        self.service = self.resource = self.span_type = None
        self.start_ns, self.duration_ns, self.error = 5, 7, 0


_LookAlike.__module__ = "ddtrace._trace.span"
_LookAlike.__name__ = _LookAlike.__qualname__ = "Span"


@pytest.mark.parametrize("version", ["v0.4", "v0.5", "v1.0"])
def test_unknown_ddtrace_layout_is_refused_naming_version_and_field(version):
    """A ddtrace Span class with its tags neither in ddtrace's attributes nor
    behind its accessors is refused, never written without them."""
    with pytest.raises(TypeError) as raised:
        spanpack.TraceMsgPackEncoder(version).encode_traces([[_LookAlike()]])
    message = str(raised.value)
    assert "ddtrace %s" % ddtrace.__version__ in message
    assert "meta" in message and "_get_str_attributes" in message


@pytest.mark.skipif(not _native(), reason="ddtrace's native spans only")
@pytest.mark.parametrize("accessor", ["_get_str_attributes", "_get_numeric_attributes", "_has_links",
                                      "_get_events", "_has_meta_structs"])
def test_each_native_accessor_is_required_to_be_callable(accessor):
    """An accessor replaced by a property (a data descriptor, as a renamed
    field would be) is refused naming it."""
    span = _subclass_with(accessor, property(lambda self: {}))("n", service="s", trace_id=1, span_id=2)
    span.finish()
    with pytest.raises(TypeError, match=accessor):
        spanpack.TraceMsgPackEncoder("v0.4").encode_traces([[span]])


def _tags_plus(self, extra):
    return {**Span._get_str_attributes(self), **extra} if _native() else dict(self._meta, **extra)


@pytest.mark.skipif(not hasattr(Span, "_get_str_attributes"), reason="ddtrace's accessors only")
@pytest.mark.parametrize("how", ["partialmethod", "instance override"])
def test_wrapped_or_overridden_accessor_is_called_as_ddtrace_calls_it(how):
    """An accessor wrapped into a callable that is no plain method, or
    overridden on an instance, is called through attribute lookup, as
    ddtrace's encoder calls it: the same bytes as ddtrace's."""
    if how == "partialmethod":
        cls = _subclass_with("_get_str_attributes", functools.partialmethod(_tags_plus, {"added": "x"}))
        span = cls("op", service="svc", resource="res", trace_id=5, span_id=6)
    else:
        span = type("WithDict", (Span,), {})("op", service="svc", resource="res", trace_id=5, span_id=6)
        span._get_str_attributes = functools.partial(_tags_plus, span, {"added": "y"})
    span.set_tag("k", "v")
    span.finish()
    for version in ("v0.4", "v0.5"):
        assert_all_paths_equal(ddtrace_payload(version, [[span]]), spanpack_paths(version, [[span]]))


def test_subclass_of_ddtrace_span_is_read_like_span(finished_traces):
    """A tracer author's subclass of ddtrace's Span (with an instance
    __dict__) is read through ddtrace's accessors too."""
    Sub = type("Sub", (Span,), {})
    span = Sub("op", service="svc", resource="res", trace_id=5, span_id=6)
    span.set_tag("k", "v")
    span.set_metric("m", 2)
    span.finish()
    for version in ("v0.4", "v0.5"):
        expected = ddtrace_payload(version, [[span]])
        assert_all_paths_equal(expected, spanpack_paths(version, [[span]]))


@pytest.mark.skipif(not _native(), reason="ddtrace's native spans only")
@pytest.mark.parametrize("version", ["v0.4", "v0.5", "v1.0"])
def test_trace_id_overridden_by_a_subclass_is_checked_on_every_span(version):
    """Native spans' trace_id getter (ddtrace's own, always an int) is not
    called for each span; a subclass whose trace_id is its own property is
    read and checked at every span, the first one included."""
    cls = _subclass_with("trace_id", property(lambda self: "not an int" if self.span_id == 3 else 9))
    spans = [cls("op", service="svc", trace_id=9, span_id=i) for i in (1, 2, 3)]
    for span in spans:
        span.finish()
    with pytest.raises(TypeError, match=r"span 2.*trace_id"):
        spanpack.TraceMsgPackEncoder(version).encode_traces([spans])
    first_bad = [cls("op", service="svc", trace_id=9, span_id=3)]
    first_bad[0].finish()
    with pytest.raises(TypeError, match="trace_id"):
        spanpack.TraceMsgPackEncoder(version).encode_traces([first_bad])


def _lazy_context_property() -> bool:
    """Is Span.context ddtrace's lazy property over the `_context` slot
    (4.16), which spanpack reads straight from the slot once it is set?"""
    return isinstance(Span.__dict__.get("context"), property) and "_context" in getattr(Span, "__slots__", ())


def _child_chunks() -> List[list]:
    """Chunks of a continued trace that hold only a child span, as a partial
    flush sends them: the child's context is built by the property when
    first asked for (its slot is None until then); in the second chunk it
    was asked for already.  The child carries the trace's `_dd.p.tid`, as
    ddtrace's processors give a chunk's first span."""
    chunks = []
    for trace in ddtrace_shapes.finished_traces(distributed_with_origin, 2):
        root = next(span for span in trace if span.parent_id == 777)
        child = next(span for span in trace if span.parent_id != 777)
        child.set_tag("_dd.p.tid", root.get_tag("_dd.p.tid"))
        chunks.append([child])
    chunks[1][0].context
    return chunks


@pytest.mark.skipif(not _lazy_context_property(), reason="ddtrace's lazy Span.context only")
def test_lazy_context_read_from_its_slot_or_built_by_the_property():
    for version in ("v0.4", "v0.5"):
        chunks = _child_chunks()
        assert chunks[0][0]._context is None and chunks[1][0]._context is not None
        got = spanpack_paths(version, chunks)
        assert chunks[0][0]._context is not None  # built by the property, as ddtrace's encoder builds it
        assert_all_paths_equal(ddtrace_payload(version, chunks), got)
        assert all(span["meta"]["_dd.origin"] == "synthetics"
                   for chunk in CANONICAL[version](got["encode_traces"]) for span in chunk)


def _refuse(self):
    raise RuntimeError("context asked")


@pytest.mark.skipif(not _lazy_context_property(), reason="ddtrace's lazy Span.context only")
@pytest.mark.parametrize("how", ["subclass property", "class property replaced", "getter code replaced",
                                 "property re-initialised"])
def test_context_property_not_ddtraces_own_is_run(monkeypatch, how):
    """The slot stands for the property only while the property is
    ddtrace's own, with its own getter and code: any other is run, by an
    encoder that read spans of the class through the slot before too."""
    span = Span("op", service="svc", resource="res", trace_id=5, span_id=6)
    span.finish()
    encoders = [spanpack.TraceMsgPackEncoder(version) for version in ("v0.4", "v0.5")]
    for encoder in encoders:
        encoder.encode_traces([[span]])  # the slot read
    lazy = Span.__dict__["context"]
    getter, setter = lazy.fget, lazy.fset
    try:
        if how == "subclass property":
            span = _subclass_with("context", property(_refuse))("op", service="svc", trace_id=5, span_id=6)
            span.finish()
        elif how == "class property replaced":
            monkeypatch.setattr(Span, "context", property(_refuse))
        elif how == "getter code replaced":
            monkeypatch.setattr(getter, "__code__", _refuse.__code__)
        else:  # another getter in the same property object: the class itself unchanged
            lazy.__init__(_refuse, setter)
        assert span._context is not None
        for encoder in encoders:
            with pytest.raises(RuntimeError, match="context asked"):
                encoder.encode_traces([[span]])
    finally:
        if how == "property re-initialised":
            lazy.__init__(getter, setter)
