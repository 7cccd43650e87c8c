"""Shared helpers and hypothesis strategies for the span encoder tests.

* Encoding helpers: ddtrace 4.2.3's reference encoders (``put`` + ``encode``)
  and spanpack's three paths (``encode_traces``, ``put`` + ``encode``,
  ``encode_trace`` + ``join_encoded``).
* Strategies for the values a span carries (ids, text, tags, metrics,
  meta_struct documents, links, events) and for whole ddtrace Spans / traces.
* Plain span input forms (a __slots__ class, a class with properties, dicts)
  built from one "logical" span description, so that the same trace can be fed
  to spanpack in every input form.
* Small spans and entry points for the error tests: ``good_span``, spans whose
  properties run code or raise, ``feed`` (traces through one entry point) and
  the lenient mode's check over all three paths.

ddtrace is imported lazily: only the ddtrace-specific helpers need it.
"""

from __future__ import annotations

import contextlib
import tracemalloc
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import msgpack
from hypothesis import strategies as st

import spanpack
from spanpack._spanpack import MAX_TEXT_LEN, SPAN_FIELDS

U64 = (1 << 64) - 1
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1
# ddtrace's reference encoder gets one fixed buffer and item limit for every
# example: 64 MiB.  The largest span these strategies build encodes to about
# 4.6 MB in v0.4 (largest_generated_span() below), and the tests that feed
# ddtrace draw at most 3 traces of 3 spans, about 42 MB;
# test_spans_ddtrace.py::test_reference_buffer_holds_the_largest_example
# checks that bound against the strategies' own limits.
BIG = 1 << 26
MAX_SPANS_PER_EXAMPLE = 9
# spanpack's own default buffer limit (TraceMsgPackEncoder(max_size=None)).
DEFAULT_MAX_SIZE = 20 << 20

VERSIONS = ("v0.4", "v0.5")

# The protocol fields of the default (non-ddtrace) span form.
FIELDS = SPAN_FIELDS
# The fields every span of the reference tracer has (the others, meta_struct,
# links, events and origin, are optional extras).
CORE_FIELDS = tuple(name for name in FIELDS if name not in ("meta_struct", "links", "events", "origin"))


# ---------------------------------------------------------------------------
# Encoding helpers


def unpack(data: bytes) -> Any:
    """Decode a payload the way a test compares structures."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def ddtrace_encoder(version: str, native_span_events: bool = False):
    """A fresh ddtrace 4.2.3 encoder; native span events are snapshotted by
    MsgpackEncoderV04's constructor, so the agent config is switched only
    around the construction."""
    from ddtrace.internal._encoding import MsgpackEncoderV04, MsgpackEncoderV05
    from ddtrace.internal.settings._agent import config as agent_config

    cls = MsgpackEncoderV04 if version == "v0.4" else MsgpackEncoderV05
    previous = agent_config.trace_native_span_events
    agent_config.trace_native_span_events = native_span_events
    try:
        return cls(BIG, BIG)
    finally:
        agent_config.trace_native_span_events = previous


def ddtrace_payload(
    version: str, traces: Sequence[list], native_span_events: bool = False, v04_link_drops: bool = False
) -> bytes:
    """ddtrace's bytes for `traces` (put each, then encode()); one payload.

    spanpack deliberately leaves a v0.4 span link's dropped_attributes_count
    out (libdatadog rejects the payload for it; docs/wire-format.md), so for
    v0.4 the reference is ddtrace's encoding of the same links without a
    dropped-attribute count, unless `v04_link_drops` asks for ddtrace's
    literal output."""
    encoder = ddtrace_encoder(version, native_span_events)
    hidden = []
    if version == "v0.4" and not v04_link_drops:
        for trace in traces:
            for span in trace:
                for link in getattr(span, "_links", ()):
                    if getattr(link, "_dropped_attributes", 0):
                        hidden.append((link, link._dropped_attributes))
                        link._dropped_attributes = 0
    try:
        for trace in traces:
            encoder.put(list(trace))
    finally:
        for link, dropped in hidden:
            link._dropped_attributes = dropped
    result = encoder.encode()
    assert len(result) == 1, result
    payload, count = result[0]
    assert count == len(traces)
    return payload


def spanpack_paths(
    version: str, traces: Sequence[list], fields: Any = None, **options: Any
) -> Dict[str, bytes]:
    """spanpack's payload for `traces` from each of its three paths, each on a
    fresh encoder.  put+encode must give exactly one (payload, count) entry."""
    results = {}
    encoder = spanpack.TraceMsgPackEncoder(version, fields, **options)
    results["encode_traces"] = encoder.encode_traces([list(t) for t in traces])

    # The buffer holds exactly the one-shot payload's bytes (checked below),
    # which for generated traces can be far beyond the default 20 MiB limit
    # (9 spans of up to 4.6 MB each in v0.4); the limit is sized for the
    # example so the buffered path is never refused for size.
    buffered_options = dict(options)
    buffered_options.setdefault("max_size", max(DEFAULT_MAX_SIZE, len(results["encode_traces"])))
    encoder = spanpack.TraceMsgPackEncoder(version, fields, **buffered_options)
    for trace in traces:
        encoder.put(list(trace))
    assert len(encoder) == len(traces)
    size = encoder.size
    buffered = encoder.encode()
    assert len(buffered) == 1, buffered
    payload, count = buffered[0]
    assert count == len(traces)
    assert size == len(payload)
    assert len(encoder) == 0
    results["put+encode"] = payload

    encoder = spanpack.TraceMsgPackEncoder(version, fields, **options)
    parts = [encoder.encode_trace(list(t)) for t in traces]
    results["encode_trace+join_encoded"] = encoder.join_encoded(parts)
    return results


def assert_all_paths_equal(expected: bytes, results: Dict[str, bytes]) -> None:
    for path, payload in results.items():
        if payload != expected:
            raise AssertionError("%s differs from the reference: %s" % (path, describe_difference(expected, payload)))


def describe_difference(expected: bytes, got: bytes, context: int = 40) -> str:
    """Where two payloads first differ, with a little hex around it and a
    (shortened) decoded form of each."""
    at = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    start = max(0, at - context)
    return (
        "lengths %d/%d, first difference at byte %d\n expected ...%s...\n      got ...%s...\n"
        " expected (decoded) %s\n      got (decoded) %s"
        % (len(expected), len(got), at, expected[start:at + context].hex(), got[start:at + context].hex(),
           _short(_try_unpack(expected)), _short(_try_unpack(got)))
    )


def _short(value: Any, limit: int = 3000) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...<%d more chars>" % (len(text) - limit)


def _try_unpack(data: bytes) -> Any:
    try:
        return unpack(data)
    except Exception as e:  # a corrupt payload is part of the report
        return "<undecodable: %r>" % (e,)


# ---------------------------------------------------------------------------
# Value strategies

# Text: either from the whole of Unicode except surrogates (which cannot be
# UTF-8), or from a small alphabet that makes emoji / astral characters, NUL,
# control characters and JSON-escaped characters likely.
_ALPHABET = ("abcxyzABC0129 _.-/:\x00\n\t\x7f\u00e9\u00df\u20ac\u4e2d\u65e5"
             "\U0001F600\U0001F9D1\U00010348\U0010FFFF\ufeff\"\\")
short_text = st.one_of(
    st.text(alphabet=_ALPHABET, max_size=12),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=12),
)
medium_text = st.builds(
    lambda char, n: char * n,
    st.sampled_from(["a", "\u00e9", "\U0001F600"]),
    st.sampled_from([31, 32, 255, 256, 300]),
)
# Around the 25,000 code-point truncation limit.
TRUNCATION_LIMIT = MAX_TEXT_LEN
LONG_LENGTHS = (MAX_TEXT_LEN - 1, MAX_TEXT_LEN, MAX_TEXT_LEN + 1, 30000)


def _long(prefix: str, char: str, n: int) -> str:
    return (prefix + char * n)[:n]


LONG_CHARS = ("x", "\u00e9", "\u4e2d", "\U0001F600")
_long_chars = st.sampled_from(LONG_CHARS)
long_text = st.builds(_long, short_text, _long_chars, st.sampled_from(LONG_LENGTHS))
text = st.one_of(short_text, short_text, short_text, medium_text, long_text)
maybe_text = st.one_of(st.none(), st.just(""), text)
# Text without NUL, for the v0.4 origin (see test_origin_with_nul_matches_ddtrace).
text_no_nul = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)
# Trace origins (context.dd_origin) for byte-identity tests: without NUL,
# which ddtrace 4.2.3's v0.4 encoder cuts at (C strlen) and spanpack
# deliberately does not (docs/wire-format.md; its own test).
long_origin = st.builds(_long, text_no_nul, _long_chars, st.sampled_from(LONG_LENGTHS))
origins = st.one_of(st.none(), st.none(), st.just(""), text_no_nul, long_origin)


def _utf8_long_bytes(prefix: str, n: int) -> bytes:
    """Valid UTF-8 longer than 25,000 bytes whose first 2,486 bytes end on a
    character boundary (both encoders then cut at the same place)."""
    head = prefix.encode("utf-8")[:100].decode("utf-8", "ignore").encode("utf-8")
    return head + b"y" * (n - len(head))


long_bytes = st.builds(_utf8_long_bytes, short_text, st.sampled_from(LONG_LENGTHS))
utf8_bytes = st.one_of(short_text.map(lambda s: s.encode("utf-8")), long_bytes)
text_or_bytes = st.one_of(text, text, text, utf8_bytes)

_UINT_BOUNDARIES = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
                    2**63 - 1, 2**63, U64]
_INT_BOUNDARIES = [-1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, I64_MIN,
                   I64_MAX]

uint64s = st.one_of(st.sampled_from(_UINT_BOUNDARIES), st.integers(0, U64))
nonzero_uint64s = st.one_of(st.sampled_from(_UINT_BOUNDARIES[1:]), st.integers(1, U64))
int64s = st.one_of(
    st.sampled_from(_INT_BOUNDARIES + _UINT_BOUNDARIES[:-2]), st.integers(I64_MIN, I64_MAX)
)
trace_ids = st.one_of(
    uint64s,
    st.integers(U64 + 1, (1 << 128) - 1),
    st.sampled_from([1 << 64, (0xABC << 64) | 5, (1 << 128) - 1]),
)
# The error flag: ddtrace sets 0/1, but any int32 is carried in v0.5.
errors = st.one_of(st.sampled_from([0, 1]), st.booleans(), st.integers(-(2**31), 2**31 - 1))

metric_values = st.one_of(
    st.integers(I64_MIN, U64),
    st.sampled_from(_INT_BOUNDARIES + _UINT_BOUNDARIES),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, 0.5, float("nan"), float("inf"), float("-inf"), 1e300]),
    st.booleans(),
)
tag_keys = st.one_of(short_text, st.sampled_from(["_dd.origin", "env", "http.url", "events",
                                                  "_dd.span_links", "a" * 40]))
_meta_keys = st.one_of(tag_keys, tag_keys, tag_keys, utf8_bytes.filter(lambda b: len(b) < 40))
_metric_keys = st.one_of(tag_keys, tag_keys, tag_keys, short_text.map(str.encode))


def _many(prefix: str, count: int, value: Any) -> Dict[str, Any]:
    return {"%s%d" % (prefix, i): value for i in range(count)}


# Usually a few entries; sometimes more than 15 (map16 headers) cheaply.
MANY_ENTRIES = 40
meta_dicts = st.one_of(
    st.dictionaries(_meta_keys, text_or_bytes, max_size=6),
    st.builds(lambda many, few: {**many, **few},
              st.builds(_many, st.just("tag."), st.integers(14, MANY_ENTRIES), text),
              st.dictionaries(_meta_keys, text_or_bytes, max_size=2)),
)
metric_dicts = st.one_of(
    st.dictionaries(_metric_keys, metric_values, max_size=6),
    st.builds(_many, st.just("metric."), st.integers(14, MANY_ENTRIES), metric_values),
)

# meta_struct values: plain msgpack documents of exact types only.
_struct_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(I64_MIN, U64),
    st.floats(allow_nan=False),
    st.text(alphabet=_ALPHABET, max_size=40),
    st.binary(max_size=40),
)
struct_documents = st.recursive(
    _struct_leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.one_of(short_text, st.integers(0, 100)), children, max_size=5),
    ),
    max_leaves=15,
)
meta_struct_dicts = st.one_of(st.just({}), st.dictionaries(short_text, struct_documents, max_size=2))

# Link / event attribute values as ddtrace accepts them.
_attribute_scalars = st.one_of(
    short_text, st.booleans(), st.integers(I64_MIN, I64_MAX), st.floats(allow_nan=False, allow_infinity=False)
)
link_attributes = st.dictionaries(
    short_text,
    st.one_of(_attribute_scalars, st.lists(_attribute_scalars, max_size=3),
              st.lists(st.lists(_attribute_scalars, max_size=2), max_size=2)),
    max_size=4,
)
event_attributes = st.dictionaries(
    short_text, st.one_of(_attribute_scalars, st.lists(_attribute_scalars, max_size=3)), max_size=4
)


@st.composite
def link_specs(draw) -> Dict[str, Any]:
    """A span link as keyword arguments of ddtrace's Span.set_link."""
    return {
        "trace_id": draw(st.one_of(st.integers(1, U64), st.integers(1, (1 << 128) - 1))),
        "span_id": draw(nonzero_uint64s),
        "tracestate": draw(st.one_of(st.none(), st.just(""), short_text)),
        "flags": draw(st.one_of(st.none(), st.sampled_from([0, 1, 2**31 - 1]), st.integers(0, 2**32 - 1))),
        "attributes": draw(link_attributes),
        "dropped": draw(st.sampled_from([0, 0, 1, 3])),
    }


@st.composite
def event_specs(draw) -> Dict[str, Any]:
    """A span event as arguments of ddtrace's Span._add_event."""
    return {
        "name": draw(st.one_of(short_text, medium_text)),
        "attributes": draw(event_attributes),
        "timestamp": draw(st.integers(0, U64)),
    }


_link_lists = st.one_of(st.just([]), st.lists(link_specs(), min_size=1, max_size=2))
_event_lists = st.one_of(st.just([]), st.lists(event_specs(), min_size=1, max_size=2))


# ---------------------------------------------------------------------------
# Logical spans: one description, rendered as any input form


@st.composite
def logical_spans(
    draw,
    with_links: bool = True,
    with_events: bool = True,
    with_meta_struct: bool = True,
    v05_times: bool = False,
) -> Dict[str, Any]:
    """A span as a dict of protocol fields, within the values both spanpack
    and ddtrace encode without error (v0.4 start/duration stay int64)."""
    # v0.5 clamps times within 64 bits (negative to 0, above 2**63 - 1 to
    # that) as ddtrace does; beyond 64 bits both versions raise.
    times = st.integers(-(1 << 64) + 1, (1 << 64) - 1) if v05_times else int64s
    span = {
        "trace_id": draw(trace_ids),
        "span_id": draw(uint64s),
        "parent_id": draw(st.one_of(st.none(), uint64s)),
        "service": draw(maybe_text),
        "name": draw(maybe_text),
        "resource": draw(maybe_text),
        "span_type": draw(maybe_text),
        "start_ns": draw(times),
        "duration_ns": draw(st.one_of(st.none(), times)),
        "error": draw(errors),
        "meta": draw(meta_dicts),
        "metrics": draw(metric_dicts),
        "meta_struct": draw(meta_struct_dicts) if with_meta_struct else {},
        "links": draw(_link_lists) if with_links else [],
        "events": draw(_event_lists) if with_events else [],
    }
    return span


@st.composite
def logical_traces(draw, max_spans: int = 3, **kwargs: Any) -> Dict[str, Any]:
    """{"spans": [...], "origin": str|None}; the trace-level values come from
    the first span (trace_id, origin), and `_dd.p.tid` is set on the first
    span's meta for 128-bit ids the way ddtrace's TraceTagsProcessor does."""
    spans = draw(st.lists(logical_spans(**kwargs), min_size=1, max_size=max_spans))
    if draw(st.booleans()):  # usually one trace id for the whole chunk
        for span in spans[1:]:
            span["trace_id"] = spans[0]["trace_id"]
    origin = draw(origins)
    tid = spans[0]["trace_id"]
    if tid > U64:
        spans[0]["meta"]["_dd.p.tid"] = ("%032x" % tid)[:16]
    return {"spans": spans, "origin": origin}


def largest_generated_trace() -> Dict[str, Any]:
    """A one-span logical trace at least as large, encoded, as any span the
    strategies above build: every text at the longest length that is not
    truncated, in 4-byte characters; the most meta and metric entries; the
    largest meta_struct, links and events, roughly (they are a few KB of the
    span's ~4.6 MB)."""
    longest = TRUNCATION_LIMIT * max(LONG_CHARS, key=lambda c: len(c.encode("utf-8")))
    wide12, wide40 = "\U0001F600" * 12, "\U0001F600" * 40
    meta = _many("tag.", MANY_ENTRIES, longest)
    meta.update({"k" * 39: longest, "j" * 39: longest})  # the few extra entries, keys under 40 bytes
    attributes = {wide12 + str(i): [wide12] * 3 for i in range(4)}
    span = {
        "trace_id": (1 << 128) - 1, "span_id": U64, "parent_id": U64,
        "service": longest, "name": longest, "resource": longest, "span_type": longest,
        "start_ns": I64_MIN, "duration_ns": I64_MIN, "error": -(2**31),
        "meta": meta,
        "metrics": _many("metric.", MANY_ENTRIES, 1e300),
        "meta_struct": {wide12 + "1": [wide40] * 15, wide12 + "2": [wide40] * 15},
        "links": [{"trace_id": U64 + i, "span_id": U64 - i, "tracestate": wide12, "flags": 2**32 - 1,
                   "attributes": attributes, "dropped": 3} for i in range(2)],
        "events": [{"name": "\U0001F600" * 300, "attributes": attributes, "timestamp": U64}] * 2,
    }
    span["meta"]["_dd.p.tid"] = ("%032x" % span["trace_id"])[:16]
    return {"spans": [span], "origin": longest}


def _link_dict(spec: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "trace_id": spec["trace_id"],
        "span_id": spec["span_id"],
        "tracestate": spec["tracestate"],
        "flags": spec["flags"],
        "attributes": spec["attributes"],
        "dropped_attributes_count": spec["dropped"],
    }


def _event_dict(spec: Dict[str, Any]) -> Dict[str, Any]:
    return {"name": spec["name"], "time_unix_nano": spec["timestamp"], "attributes": spec["attributes"]}


def _dedup_links(specs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """ddtrace's set_link replaces an earlier link with the same span_id."""
    out: List[Dict[str, Any]] = []
    for spec in specs:
        for i, existing in enumerate(out):
            if existing["span_id"] == spec["span_id"]:
                out[i] = spec
                break
        else:
            out.append(spec)
    return out


def to_ddtrace_trace(trace: Dict[str, Any]) -> list:
    """ddtrace Spans carrying the logical trace (fields="ddtrace")."""
    from ddtrace._trace.span import Span

    spans = []
    for spec in trace["spans"]:
        span = Span("placeholder", trace_id=spec["trace_id"] or 1, span_id=spec["span_id"] or 1)
        span.trace_id = spec["trace_id"]
        span.span_id = spec["span_id"]
        span.parent_id = spec["parent_id"]
        span.service = spec["service"]
        span.name = spec["name"]
        span.resource = spec["resource"]
        span.span_type = spec["span_type"]
        span.start_ns = spec["start_ns"]
        span.duration_ns = spec["duration_ns"]
        span.error = spec["error"]
        span._meta.update(spec["meta"])
        span._metrics.update(spec["metrics"])
        span._meta_struct.update(spec["meta_struct"])
        for link in _dedup_links(spec["links"]):
            arguments = dict(link)
            dropped = arguments.pop("dropped")
            span.set_link(**arguments)
            span._links[-1]._dropped_attributes = dropped
        for event in spec["events"]:
            span._add_event(event["name"], event["attributes"], event["timestamp"])
        spans.append(span)
    spans[0].context.dd_origin = trace["origin"]
    return spans


class SlottedSpan:
    """The default protocol fields as __slots__ (read through slot offsets)."""

    __slots__ = FIELDS


class PropertySpan:
    """The default protocol fields as read-only properties over a dict."""

    def __init__(self, values: Dict[str, Any]) -> None:
        self._values = values


def _make_property(name: str) -> property:
    return property(lambda self: self._values[name])


for _name in FIELDS:
    setattr(PropertySpan, _name, _make_property(_name))
del _name


def _protocol_values(spec: Dict[str, Any], origin: Optional[str], first: bool) -> Dict[str, Any]:
    values = {key: spec[key] for key in FIELDS if key not in ("links", "events", "origin")}
    values["meta"] = dict(spec["meta"])
    values["metrics"] = dict(spec["metrics"])
    values["meta_struct"] = dict(spec["meta_struct"])
    values["links"] = [_link_dict(link) for link in _dedup_links(spec["links"])]
    values["events"] = [_event_dict(event) for event in spec["events"]]
    values["origin"] = origin if first else None
    return values


def to_form(trace: Dict[str, Any], form: str) -> list:
    """The logical trace as spans of one input form: "slots", "properties",
    "dict", "namespace" or "ddtrace"."""
    if form == "ddtrace":
        return to_ddtrace_trace(trace)
    spans = []
    for i, spec in enumerate(trace["spans"]):
        values = _protocol_values(spec, trace["origin"], i == 0)
        if form == "dict":
            spans.append(values)
        elif form == "slots":
            span = SlottedSpan()
            for key, value in values.items():
                setattr(span, key, value)
            spans.append(span)
        elif form == "properties":
            spans.append(PropertySpan(values))
        elif form == "namespace":
            # Links and events as plain objects too.
            values["links"] = [types.SimpleNamespace(**link) for link in values["links"]]
            values["events"] = [types.SimpleNamespace(**event) for event in values["events"]]
            spans.append(types.SimpleNamespace(**values))
        else:
            raise ValueError(form)
    return spans


INPUT_FORMS = ("slots", "properties", "dict", "namespace", "ddtrace")


def good_span(**overrides: Any) -> Dict[str, Any]:
    """A small valid dict span."""
    span = {
        "trace_id": 1,
        "span_id": 2,
        "parent_id": None,
        "service": "s",
        "name": "n",
        "resource": "r",
        "span_type": None,
        "start_ns": 5,
        "duration_ns": 7,
        "error": 0,
        "meta": {},
        "metrics": {},
    }
    span.update(overrides)
    return span


def hooked_property_span(values: Dict[str, Any], field: str, before_read: Callable[[], Any]) -> Any:
    """A span whose fields are read-only properties (of a class of its own)
    returning `values`; reading `field` first calls `before_read()`, which may
    change the trace, call the encoder or raise."""

    class PropertySpan:
        pass

    for name, value in values.items():
        if name == field:
            def getter(self: Any, _value: Any = value) -> Any:
                before_read()
                return _value
        else:
            def getter(self: Any, _value: Any = value) -> Any:
                return _value
        setattr(PropertySpan, name, property(getter))
    return PropertySpan()


def raising_property_span(values: Dict[str, Any], field: str, exception: BaseException) -> Any:
    """hooked_property_span whose `field` raises `exception` (that very object)."""

    def raise_it() -> None:
        raise exception

    return hooked_property_span(values, field, raise_it)


def feed(encoder: Any, path: str, traces: Sequence[Any]) -> Any:
    """`traces` through one entry point: "encode_traces" (returns the
    payload), "put" (returns None; the traces stay buffered) or "encode_trace"
    (returns the encoded parts, for join_encoded)."""
    if path == "encode_traces":
        return encoder.encode_traces(traces)
    if path == "put":
        for trace in traces:
            encoder.put(trace)
        return None
    return [encoder.encode_trace(trace) for trace in traces]


def one_payload(encoder: Any, path: str, traces: Sequence[Any]) -> bytes:
    """`traces` through one entry point (see `feed`), as the one payload it
    makes: encode_traces's, put()'s single encode() payload, or the join of
    encode_trace's parts."""
    fed = feed(encoder, path, traces)
    if path == "encode_traces":
        return fed
    if path == "put":
        [(payload, _count)] = encoder.encode()
        return payload
    return encoder.join_encoded(fed)


def assert_lenient_paths(encoder: Any, traces: Sequence[Any], expected: bytes, drops: int) -> None:
    """A fresh lenient `encoder` writes `expected` for `traces` through each of
    its three paths (encode_traces, put + encode, encode_trace +
    join_encoded), each path counting the `drops` dropped tags again."""
    assert encoder.encode_traces(traces) == expected
    assert encoder.dropped_tags == drops
    for trace in traces:
        encoder.put(trace)
    assert encoder.encode() == [(expected, len(traces))]
    assert encoder.dropped_tags == 2 * drops
    assert encoder.join_encoded([encoder.encode_trace(trace) for trace in traces]) == expected
    assert encoder.dropped_tags == 3 * drops


def resolved_traces(version: str, payload: bytes) -> Any:
    """The traces of a payload with v0.5 string indexes replaced by their
    strings, so traces from differently split payloads compare equal."""
    data = msgpack.unpackb(payload, strict_map_key=False)
    if version == "v0.4":
        return data
    table, traces = data
    assert table[:2] == ["", "_dd.origin"]
    assert len(set(table)) == len(table)
    out = []
    for trace in traces:
        spans = []
        for span in trace:
            assert len(span) == 12
            s = list(span)
            for i in (0, 1, 2, 11):
                s[i] = table[s[i]]
            s[9] = {table[k]: table[v] for k, v in s[9].items()}
            s[10] = {table[k]: v for k, v in s[10].items()}
            spans.append(s)
        out.append(spans)
    return out


@contextlib.contextmanager
def memory_grown() -> Iterator[Callable[[], int]]:
    """Traces allocations (tracemalloc) for the block, which gets a function
    returning the bytes allocated since the block began and still held."""
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        yield lambda: tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
