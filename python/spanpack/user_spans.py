"""Span classes a tracer author writes, as sample shapes for the benchmarks.

Each shape is one trace of 1,000 spans with 6 str tags and 3 metrics, held by
a class of one's own with the 12 core protocol fields (ids, text, times,
error, meta, metrics) and nothing for meta_struct, links, events or origin:
``__slots__`` with only those fields, ``__slots__`` with all 16 (spanpack's
own sample form), a plain class, ``@dataclass`` with and without
``slots=True``, ``attrs`` classes slotted and not, a ``msgspec.Struct``, and
a plain class whose ``duration_ns`` is a property computed from an end time;
then variations of the plain class: tag keys built per span (no two spans
share a key object), float metrics, unique tag values.

Contenders for each (``contenders``), checked by ``check`` to decode to the
same spans before they are timed: spanpack ``encode_traces`` v0.4 and v0.5
on the objects themselves; msgspec encoding equivalent ``msgspec.Struct``
spans already built (its best case) into the same v0.4 maps; and
``msgpack.packb`` of a ``to_dict()`` per span.
"""

import dataclasses
import sys
from typing import Any, Callable, Dict, List, Optional

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

SPANS = 1000
ALL = SPAN_FIELDS
CORE = tuple(name for name in ALL if name not in ("meta_struct", "links", "events", "origin"))
BASE_TIME = 1_700_000_000_000_000_000


def span_values(i: int, keys: str = "shared", metrics: str = "int", values: str = "shared") -> Dict[str, Any]:
    """The field values of span i of a shape."""
    if keys == "per_span":
        # Built at run time, as keys from decoded headers or f-strings are.
        names = [f"http.{part}" for part in ("method", "url", "route", "status_code")] + \
                [f"{part}.name" for part in ("component", "peer")]
    else:
        names = ["http.method", "http.url", "http.route", "http.status_code", "component.name", "peer.name"]
    texts = ["GET", "/users/%d" % (i % 17), "/users/<id>", "200", "flask", "db-%d" % (i % 3)]
    if values == "unique":
        texts = ["%s-%d-%d" % (text, i, n) for n, text in enumerate(texts)]
    meta = dict(zip(names, texts))
    if metrics == "float":
        numbers = {"_dd.measured": 1.0, "_sampling_priority_v1": 1.0, "process_id": 4242.5 + i}
    else:
        numbers = {"_dd.measured": 1, "_sampling_priority_v1": 1, "process_id": 4242}
    return {
        "trace_id": 0x1234567890ABCDEF, "span_id": 0x1000 + i, "parent_id": 0x1000 + i - 1 if i else 0,
        "service": "users-api", "name": "flask.request" if i == 0 else "postgres.query",
        "resource": "GET /users/<id>" if i == 0 else "SELECT * FROM users WHERE id = ?",
        "span_type": "web" if i == 0 else "sql", "start_ns": BASE_TIME + i * 1000,
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
SlotDataSpan = dataclasses.make_dataclass("SlotDataSpan", [(n, Any) for n in CORE], slots=True,
                                          namespace={"to_dict": _to_dict})


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


def shapes() -> Dict[str, Callable[[], List[Any]]]:
    forms: Dict[str, Optional[type]] = {
        "slots-core": SlotsCore, "slots-all16": SlotsAll, "plain": Plain, "dataclass": DataSpan,
        "dataclass-slots": SlotDataSpan, "attrs-slots": _attrs_class(True),
        "attrs-dict": _attrs_class(False), "msgspec-struct": _struct_class(),
        "property-duration": PlainDuration,
    }
    built: Dict[str, Callable[[], List[Any]]] = {}
    for name, cls in forms.items():
        if cls is not None:
            built[name] = (lambda cls=cls: [make_span(cls, span_values(i)) for i in range(SPANS)])
    for name, options in {"keys-per-span": {"keys": "per_span"}, "float-metrics": {"metrics": "float"},
                          "unique-values": {"values": "unique"}}.items():
        built["plain+" + name] = (lambda options=options: [make_span(Plain, span_values(i, **options))
                                                            for i in range(SPANS)])
    return built


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


def contenders(spans: List[Any]) -> Dict[str, Callable[[], bytes]]:
    trace = [spans]
    v04 = spanpack.TraceMsgPackEncoder("v0.4")
    v05 = spanpack.TraceMsgPackEncoder("v0.5")
    found: Dict[str, Callable[[], bytes]] = {
        "spanpack v0.4": lambda: v04.encode_traces(trace),
        "spanpack v0.5": lambda: v05.encode_traces(trace),
    }
    try:
        import msgpack
    except ImportError:
        msgpack = None
    if msgpack is not None:
        found["msgpack.packb(to_dict)"] = lambda: msgpack.packb([[_v04_map(s.to_dict() if hasattr(s, "to_dict")
                                                                   else {f: getattr(s, f) for f in CORE})
                                                          for s in spans]])
    if msgspec is not None:
        V04 = msgspec.defstruct("V04Span", [("trace_id", int), ("parent_id", int), ("span_id", int),
                                            ("service", str), ("resource", str), ("name", str),
                                            ("start", int), ("duration", int), ("type", str),
                                            ("meta", dict), ("metrics", dict)], array_like=False)
        structs = [[V04(**_v04_map({f: getattr(s, f) for f in CORE})) for s in spans]]
        encoder = msgspec.msgpack.Encoder()
        found["msgspec Structs"] = lambda: encoder.encode(structs)
    return found


def _decoded_v04(payload: bytes) -> Any:
    import msgpack

    traces = msgpack.unpackb(payload, strict_map_key=False)
    return [[{k: v for k, v in span.items() if k != "error"} for span in trace] for trace in traces]


def check(fns: Dict[str, Callable[[], bytes]]) -> None:
    """Every v0.4 contender decodes to the spans spanpack's payload holds."""
    reference = _decoded_v04(fns["spanpack v0.4"]())
    for name, fn in fns.items():
        if name.startswith("spanpack v0.4") or "v0.4" not in CONTENDER_VERSION.get(name, "v0.4"):
            continue
        if _decoded_v04(fn()) != reference:
            raise AssertionError("%s decodes to other spans than spanpack's payload" % name)


SHAPES = shapes()
