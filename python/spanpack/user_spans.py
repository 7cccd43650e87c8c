"""Span classes a tracer author writes, as sample shapes for the benchmarks.

Each shape holds spans of a class of one's own with the 12 core protocol
fields (ids, text, times, error, meta, metrics) and nothing for meta_struct,
links, events or origin, 6 str tags and 3 metrics: ``__slots__`` with only
those fields, ``__slots__`` with all 16 (spanpack's own sample form), a plain
class, ``@dataclass`` with and without ``slots=True``, ``attrs`` classes
slotted and not, a ``msgspec.Struct``, and a plain class whose
``duration_ns`` is a property computed from an end time; then variations of
the plain class: tag keys built per span (no two spans share a key object),
float metrics, unique tag values.

Spans carry values of their own, as a tracer's do: a resource with an id in
it (a request path, a query), a peer host name, a URL; constants (service,
operation names, most tag keys) are shared by every span, as a tracer's
literals are.  Every build makes new span objects and new per-span strings,
so a benchmark that builds before each timed call (``traces``; ``fresh``)
measures what a tracer does: each span encoded once.  ``SHAPES`` (one trace
of 1,000 spans) serves the instruction-count scripts, which encode the same
objects again on purpose.

Contenders for each (``contenders``), checked by ``check`` to decode to the
same spans before they are timed: spanpack ``encode_traces`` v0.4 and v0.5
on the objects themselves; msgspec encoding equivalent ``msgspec.Struct``
spans (its best case: built from the span objects before the timed call,
so msgspec never runs a getter) into the same v0.4 maps; and
``msgpack.packb`` of a ``to_dict()`` per span.  Each contender is a
``Contender``: ``prepare(traces)`` runs outside the timing, ``encode`` on
what it returned is timed.
"""

import dataclasses
import sys
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import spanpack
from spanpack._spanpack import SPAN_FIELDS

try:
    import attrs
except ImportError:
    attrs = None
try:
    import msgspec
except ImportError:
    msgspec = None

SPANS = 1000  # per call: TRACES traces of SPANS // TRACES spans, or one trace (SHAPES)
TRACES = 10
ALL = SPAN_FIELDS
CORE = tuple(name for name in ALL if name not in ("meta_struct", "links", "events", "origin"))
BASE_TIME = 1_700_000_000_000_000_000


def span_values(i: int, keys: str = "shared", metrics: str = "int", values: str = "shared",
                trace_id: int = 0x1234567890ABCDEF, root: bool = False) -> Dict[str, Any]:
    """The field values of span i of a shape (the root of its trace when `root`).

    Per span: the resource (a request path or a query with an id in it),
    the URL and the peer host; shared: service, names, the other tags (and
    with `values="unique"` no tag value repeats)."""
    if keys == "per_span":
        # Built at run time, as keys from decoded headers or f-strings are.
        names = [f"http.{part}" for part in ("method", "url", "route", "status_code")] + \
                [f"{part}.name" for part in ("component", "peer")]
    else:
        names = ["http.method", "http.url", "http.route", "http.status_code", "component.name", "peer.name"]
    user = 1_000_003 + i * 7919
    texts = ["GET", "/users/%d" % user, "/users/<id>", "200", "flask", "db-%d.users.internal" % (i % 50)]
    if values == "unique":
        texts = ["%s-%d-%d" % (text, i, n) for n, text in enumerate(texts)]
    meta = dict(zip(names, texts))
    if metrics == "float":
        numbers = {"_dd.measured": 1.0, "_sampling_priority_v1": 1.0, "process_id": 4242.5 + i}
    else:
        numbers = {"_dd.measured": 1, "_sampling_priority_v1": 1, "process_id": 4242}
    return {
        "trace_id": trace_id, "span_id": 0x1000 + i, "parent_id": 0 if root else 0x1000 + i - 1,
        "service": "users-api", "name": "flask.request" if root else "postgres.query",
        "resource": "GET /users/%d" % user if root else "SELECT * FROM users WHERE id = %d" % user,
        "span_type": "web" if root else "sql", "start_ns": BASE_TIME + i * 1000,
        "duration_ns": 5000 + i, "error": 0, "meta": meta, "metrics": numbers,
    }


def _to_dict(self) -> Dict[str, Any]:
    return {field: getattr(self, field) for field in CORE}


class SlotsCore:
    __slots__ = CORE
    to_dict = _to_dict


class SlotsAll:
    __slots__ = ALL
    to_dict = _to_dict


class Plain:
    to_dict = _to_dict


class PlainDuration:
    """duration_ns computed from an end time, as many span classes do."""

    to_dict = _to_dict

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


DataSpan = dataclasses.make_dataclass("DataSpan", [(n, Any) for n in CORE], namespace={"to_dict": _to_dict})
# dataclass(slots=True) is CPython 3.10's: the form is left out on 3.9.
SlotDataSpan: Optional[type] = (
    dataclasses.make_dataclass("SlotDataSpan", [(n, Any) for n in CORE], slots=True,
                               namespace={"to_dict": _to_dict})
    if sys.version_info >= (3, 10) else None
)


def _attrs_class(slots: bool) -> Optional[type]:
    if attrs is None:
        return None
    return attrs.make_class("AttrsSpan" if slots else "AttrsDictSpan", list(CORE), slots=slots)


def _struct_class() -> Optional[type]:
    if msgspec is None:
        return None
    return msgspec.defstruct("StructSpan", [(n, Any) for n in CORE])


def make_span(cls: type, values: Dict[str, Any]) -> Any:
    if cls is PlainDuration:
        span = cls()
        for name, value in values.items():
            if name != "duration_ns":
                setattr(span, name, value)
        span.end_ns = values["start_ns"] + values["duration_ns"]
        return span
    if dataclasses.is_dataclass(cls) or (attrs is not None and attrs.has(cls)) or \
            (msgspec is not None and issubclass(cls, msgspec.Struct)):
        return cls(**values)
    span = cls()
    for name, value in values.items():
        setattr(span, name, value)
    return span


FORMS: Dict[str, Optional[type]] = {
    "slots-core": SlotsCore, "slots-all16": SlotsAll, "plain": Plain, "dataclass": DataSpan,
    "dataclass-slots": SlotDataSpan, "attrs-slots": _attrs_class(True), "attrs-dict": _attrs_class(False),
    "msgspec-struct": _struct_class(), "property-duration": PlainDuration,
}
VARIATIONS: Dict[str, Dict[str, str]] = {
    "plain+keys-per-span": {"keys": "per_span"}, "plain+float-metrics": {"metrics": "float"},
    "plain+unique-values": {"values": "unique"},
}


def traces(shape: str, count: int = TRACES, spans: int = SPANS) -> List[List[Any]]:
    """`count` traces of `shape`, `spans` spans in all: new objects and new
    per-span strings on every call."""
    cls = FORMS.get(shape, Plain)
    options = VARIATIONS.get(shape, {})
    per_trace = spans // count
    return [[make_span(cls, span_values(t * per_trace + i, trace_id=0x1234567890ABCDEF + t, root=i == 0,
                                        **options))
             for i in range(per_trace)]
            for t in range(count)]


def shapes() -> Dict[str, Callable[[], List[Any]]]:
    """Each shape's builder of one trace of SPANS spans."""
    names = [name for name, cls in FORMS.items() if cls is not None] + list(VARIATIONS)
    return {name: (lambda name=name: traces(name, count=1)[0]) for name in names}


# Contenders that write v0.4 maps (their payloads are compared); the others are
# timed only.
CONTENDER_VERSION = {"spanpack v0.5": "v0.5"}


def _v04_map(span: Any) -> Dict[str, Any]:
    """The v0.4 map of a span, as the agent decodes it."""
    out = {"trace_id": span["trace_id"], "parent_id": span["parent_id"], "span_id": span["span_id"],
           "service": span["service"], "resource": span["resource"], "name": span["name"],
           "start": span["start_ns"], "duration": span["duration_ns"], "type": span["span_type"],
           "meta": span["meta"], "metrics": span["metrics"]}
    return out


class Contender(NamedTuple):
    """`prepare(traces)` outside the timing, then `encode(prepared)` timed."""

    prepare: Callable[[List[List[Any]]], Any]
    encode: Callable[[Any], bytes]


def _unchanged(traces: List[List[Any]]) -> List[List[Any]]:
    return traces


def contenders() -> Dict[str, Contender]:
    """spanpack v0.4 (the reference) and v0.5 on the objects, msgpack on a
    to_dict() per span (built in the timed call), msgspec on Structs built
    beforehand.  One encoder each, kept across calls, as a tracer keeps its."""
    v04 = spanpack.TraceMsgPackEncoder("v0.4")
    v05 = spanpack.TraceMsgPackEncoder("v0.5")
    found: Dict[str, Contender] = {
        "spanpack v0.4": Contender(_unchanged, v04.encode_traces),
        "spanpack v0.5": Contender(_unchanged, v05.encode_traces),
    }
    try:
        import msgpack
    except ImportError:
        msgpack = None
    if msgpack is not None:
        packb = msgpack.packb

        def packb_dicts(traces: List[List[Any]]) -> bytes:
            return packb([[_v04_map(s.to_dict() if hasattr(s, "to_dict") else {f: getattr(s, f) for f in CORE})
                           for s in trace] for trace in traces])

        found["msgpack.packb(to_dict)"] = Contender(_unchanged, packb_dicts)
    if msgspec is not None:
        V04 = msgspec.defstruct("V04Span", [("trace_id", int), ("parent_id", int), ("span_id", int),
                                            ("service", str), ("resource", str), ("name", str),
                                            ("start", int), ("duration", int), ("type", str),
                                            ("meta", dict), ("metrics", dict)], array_like=False)

        def structs(traces: List[List[Any]]) -> List[List[Any]]:
            return [[V04(**_v04_map({f: getattr(s, f) for f in CORE})) for s in trace] for trace in traces]

        found["msgspec Structs"] = Contender(structs, msgspec.msgpack.Encoder().encode)
    return found


def _decoded_v04(payload: bytes) -> Any:
    import msgpack

    traces = msgpack.unpackb(payload, strict_map_key=False)
    return [[{k: v for k, v in span.items() if k != "error"} for span in trace] for trace in traces]


def check(found: Dict[str, Contender], traces: List[List[Any]]) -> None:
    """Every v0.4 contender decodes to the spans spanpack's payload holds."""
    reference = _decoded_v04(found["spanpack v0.4"].encode(traces))
    for name, contender in found.items():
        if name.startswith("spanpack v0.4") or "v0.4" not in CONTENDER_VERSION.get(name, "v0.4"):
            continue
        if _decoded_v04(contender.encode(contender.prepare(traces))) != reference:
            raise AssertionError("%s decodes to other spans than spanpack's payload" % name)


SHAPES = shapes()
