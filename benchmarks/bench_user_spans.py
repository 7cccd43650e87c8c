"""Span classes a tracer author writes, not only spanpack's samples.

    pytest benchmarks/bench_user_spans.py --benchmark-only --benchmark-group-by=group
    python benchmarks/bench_user_spans.py            # a table: per-span times and ratios

Each shape is one trace of 1,000 spans with 6 str tags and 3 metrics, the
fields a span class of one's own holds: the 12 core protocol fields (ids,
text, times, error, meta, metrics) and nothing for meta_struct, links,
events or origin.  The class forms: ``__slots__`` with only those fields,
``__slots__`` with all 16 (the project's own sample form), a plain class,
``@dataclass`` with and without ``slots=True``, ``attrs`` classes slotted and
not, a ``msgspec.Struct``, and a plain class whose ``duration_ns`` is a
property computed from an end time.  Then variations of the plain class:
tag keys built per span (f-strings: no two spans share a key object), float
metrics, and unique tag values.

Contenders, each checked to decode to the same spans before it is timed:

* spanpack ``encode_traces`` (v0.4 and v0.5) on the user's own objects;
* msgspec encoding equivalent ``msgspec.Struct`` spans (already built: its
  best case) into the same v0.4 maps;
* ``msgpack.packb`` of a ``to_dict()`` per span (what a tracer without an
  encoder of its own does).

No test asserts anything about timings.
"""

import dataclasses
import sys
import timeit
from typing import Any, Callable, Dict, List, Optional

import msgpack
import pytest

import spanpack

try:
    import attrs
except ImportError:  # pragma: no cover - attrs is a bench extra
    attrs = None
try:
    import msgspec
except ImportError:  # pragma: no cover
    msgspec = None

SPANS = 1000
CORE = ("trace_id", "span_id", "parent_id", "service", "name", "resource", "span_type",
        "start_ns", "duration_ns", "error", "meta", "metrics")
ALL = CORE + ("meta_struct", "links", "events", "origin")
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


_annotations = {name: Any for name in CORE}
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
        "msgpack.packb(to_dict)": lambda: msgpack.packb([[_v04_map(s.to_dict() if hasattr(s, "to_dict")
                                                                   else {f: getattr(s, f) for f in CORE})
                                                          for s in spans]]),
    }
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
    traces = msgpack.unpackb(payload, strict_map_key=False)
    return [[{k: v for k, v in span.items() if k != "error"} for span in trace] for trace in traces]


def check(shape_spans: List[Any], fns: Dict[str, Callable[[], bytes]]) -> None:
    reference = _decoded_v04(fns["spanpack v0.4"]())
    for name, fn in fns.items():
        if "v0.5" in name:
            continue
        assert _decoded_v04(fn()) == reference, name


SHAPES = shapes()


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("contender", ["spanpack v0.4", "spanpack v0.5", "msgpack.packb(to_dict)",
                                       "msgspec Structs"])
def test_user_span_class(benchmark, shape, contender):
    spans = SHAPES[shape]()
    fns = contenders(spans)
    if contender not in fns:
        pytest.skip("%s is not installed" % contender.split()[0])
    check(spans, fns)
    benchmark.group = "user class: " + shape
    benchmark.extra_info["spans"] = SPANS
    benchmark(fns[contender])


def main() -> int:
    rows = []
    for shape, build in SHAPES.items():
        spans = build()
        fns = contenders(spans)
        check(spans, fns)
        times = {}
        for name, fn in fns.items():
            fn()
            number = max(1, int(0.02 / max(1e-7, timeit.timeit(fn, number=1))))
            times[name] = min(timeit.repeat(fn, number=number, repeat=7)) / number / SPANS
        rows.append((shape, times))
    names = list(rows[0][1])
    print("per span, best of 7 rounds; ratio = contender / spanpack v0.4")
    print("%-28s" % "shape" + "".join("%26s" % n for n in names))
    for shape, times in rows:
        base = times["spanpack v0.4"]
        cells = ["%8.0f ns (%5.2fx)" % (times[n] * 1e9, times[n] / base) if n in times else "-" for n in names]
        print("%-28s" % shape + "".join("%26s" % c for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
