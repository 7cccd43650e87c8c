"""``python -m spanpack bench``: spanpack against the other ways to build a trace payload.

For each sample shape (see :mod:`spanpack.samples`) and each contender, the
contender's payload is first decoded and compared with spanpack's; only
contenders that produce the same data are timed.  Timing uses
``time.perf_counter`` over repeated rounds (best and median of N, garbage
collector off while a round runs), the contenders of a shape taking turns
round by round so that load from other processes hits them alike; pytest is
not needed.

Contenders (the ones whose library is missing are skipped with a note):

v0.4 payloads
  spanpack encode_traces on SampleSpan slotted objects (the reference), on
  dict spans and on ddtrace Spans (``fields="ddtrace"``); spanpack put+encode
  on ddtrace Spans; ddtrace's own MsgpackEncoderV04 put+encode on the same
  ddtrace Spans; msgpack.packb and ormsgpack.packb of span maps in the v0.4
  structure, prebuilt or built from the slotted objects inside the timed call;
  msgspec.msgpack.Encoder on equivalent msgspec.Struct spans (renamed fields,
  omit_defaults=True); the floor, copying the final payload
  (``bytes(bytearray(payload))``).
v0.5 payloads
  spanpack on slotted objects (reference), dicts and ddtrace Spans,
  ddtrace's MsgpackEncoderV05 put+encode, and the floor.  v0.5 payloads are
  compared after resolving the string table, so the table order may differ.
v1.0 payloads
  spanpack on slotted objects (reference), dicts and ddtrace Spans, put+encode
  on ddtrace Spans, and the floor (no other Python encoder writes v1.0).  The
  "payload bytes" column compares sizes across the three versions.

Ratios are "contender time / spanpack time" on the same shape and version
(above 1: spanpack is faster).

Each timed call on the sample shapes encodes span objects built for it
alone, outside the timing, with new str objects for each span's own values
(a resource with an id, a URL, a host, random tag values; constants stay
shared), as a tracer encodes its spans once; peers get their dicts, Structs
or ddtrace Spans made from those spans, also outside the timing.
``--reencode`` times the same objects encoded again and again instead (a
cache's best case, labelled so in the output).

Then span classes of one's own (:mod:`spanpack.user_spans`: ``__slots__``
with only the core fields, plain classes, dataclasses, attrs, msgspec
Structs, a computed property, keys built per span, float metrics, unique
values) as a tracer encodes them: each timed call on 10 traces x 100 spans
built for it alone (per-span resource, URL and host), encoded once;
spanpack on the objects themselves against msgspec on equivalent Structs
built beforehand and ``msgpack.packb`` of a ``to_dict()`` per span; then
spanpack re-encoding one set, labelled so.

Then, when ddtrace is installed, traces made by ddtrace's own tracer
(:mod:`spanpack.ddtrace_shapes`: one span, a web span with 10 children, with
50 children of 40 tags, errors with links, events and struct tags), each
timed call on spans made for it alone and encoded once: ddtrace's
MsgpackEncoderV04/V05 put+encode against spanpack's put+encode and
encode_traces (``benchmarks/ddtrace_tracer.py`` adds the read floor).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import spanpack

from . import samples
from ._spanpack import ORIGIN_KEY

MASK64 = (1 << 64) - 1
BIG = 256 << 20  # buffer limits for put+encode contenders: never the bottleneck


# --------------------------------------------------------------------------------------------
# Inputs per shape


class ShapeInputs:
    """The traces of one shape in every form, built on first use."""

    def __init__(self, shape: str, quick: bool) -> None:
        self.shape = shape
        self.records = samples.build(shape, quick)
        self.spans = samples.span_count(self.records)
        self.traces = len(self.records)
        self._cache: Dict[str, Any] = {}

    def _get(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    @property
    def slotted(self) -> List[List[samples.SampleSpan]]:
        return self._get("slotted", lambda: samples.as_slotted(self.records))

    @property
    def dicts(self) -> List[List[dict]]:
        return self._get("dicts", lambda: samples.as_dicts(self.records))

    @property
    def ddtrace(self) -> List[List[Any]]:
        return self._get("ddtrace", lambda: samples.as_ddtrace(self.records))

    @property
    def v04_maps(self) -> List[List[dict]]:
        return self._get("v04_maps", lambda: v04_maps(self.slotted))

    @property
    def structs(self) -> List[List[Any]]:
        return self._get("structs", lambda: v04_structs(self.slotted))

    def form(self, name: str) -> Any:
        """The traces in form `name` (a property above, or "payload<version>": the
        reference payload, the floor's input), built once and kept: re-encoding."""
        if name.startswith("payload"):
            return self.reference(name[len("payload"):])
        return getattr(self, name)

    def fresh(self, name: str) -> Any:
        """The traces in form `name` made anew: new span objects (and dicts,
        Structs or ddtrace Spans made from them) and new str objects for each
        span's own values (samples.refresher), the same content every call."""
        if name.startswith("payload"):
            return self.reference(name[len("payload"):])  # the floor copies a finished payload
        records = self._get("refresh", lambda: samples.refresher(self.records))()
        if name == "slotted":
            return samples.as_slotted(records)
        if name == "dicts":
            return samples.as_dicts(records)
        if name == "ddtrace":
            return samples.as_ddtrace(records)
        if name == "v04_maps":
            return v04_maps(samples.as_slotted(records))
        if name == "structs":
            return v04_structs(samples.as_slotted(records))
        raise ValueError("unknown input form %r" % name)

    def reference(self, version: str) -> bytes:
        return self._get(
            "ref" + version,
            lambda: spanpack.TraceMsgPackEncoder(version, max_size=BIG).encode_traces(self.slotted),
        )

    def ddtrace_reference(self, version: str) -> bytes:
        """The reference for the ddtrace Spans: ddtrace's native spans give
        their tags back in an order of their own, which v1.0's attribute
        lists keep; so v1.0's reference is made from slotted objects holding
        the tags in that order (the other versions' maps compare as maps)."""
        if version != "v1.0" or not samples.ddtrace_keeps_tags_natively():
            return self.reference(version)

        def in_ddtrace_order() -> bytes:
            records = [[dict(record, meta=dict(span._get_str_attributes()),
                             metrics=dict(span._get_numeric_attributes()))
                        for record, span in zip(trace, spans)]
                       for trace, spans in zip(self.records, self.ddtrace)]
            encoder = spanpack.TraceMsgPackEncoder(version, max_size=BIG)
            return encoder.encode_traces(samples.as_slotted(records))

        return self._get("ddtrace-ref" + version, in_ddtrace_order)


def v04_maps(traces: Sequence[Sequence[Any]]) -> List[List[dict]]:
    """Span maps of the v0.4 payload, built from default-protocol span objects.

    Keys and rules as the reference tracer writes them: the trace's low 64-bit
    id on every span, parent_id only when set, error only when non-zero (as
    1), type only when not None, the trace origin added to every span's meta,
    meta and metrics only when non-empty.
    """
    out = []
    for trace in traces:
        first = trace[0]
        trace_id = first.trace_id & MASK64
        origin = first.origin
        spans = []
        for s in trace:
            span = {"trace_id": trace_id}
            if s.parent_id is not None:
                span["parent_id"] = s.parent_id
            span["span_id"] = s.span_id
            span["service"] = s.service
            span["resource"] = s.resource
            span["name"] = s.name
            span["start"] = s.start_ns
            span["duration"] = s.duration_ns
            if s.error:
                span["error"] = 1
            if s.span_type is not None:
                span["type"] = s.span_type
            meta = s.meta
            if origin is not None:
                meta = dict(meta)
                meta[ORIGIN_KEY] = origin
            if meta:
                span["meta"] = meta
            if s.metrics:
                span["metrics"] = s.metrics
            spans.append(span)
        out.append(spans)
    return out


_STRUCT_CLASS: Optional[type] = None


def msgspec_span_class() -> type:
    """A msgspec.Struct whose msgpack encoding is a v0.4 span map."""
    global _STRUCT_CLASS
    if _STRUCT_CLASS is None:
        import msgspec

        class V04Span(
            msgspec.Struct,
            kw_only=True,
            omit_defaults=True,
            rename={"start_ns": "start", "duration_ns": "duration", "span_type": "type"},
        ):
            trace_id: int
            parent_id: Optional[int] = None
            span_id: int
            service: Optional[str]
            resource: Optional[str]
            name: Optional[str]
            start_ns: Optional[int]
            duration_ns: Optional[int]
            error: int = 0
            span_type: Optional[str] = None
            meta: Dict[str, str] = msgspec.field(default_factory=dict)
            metrics: Dict[str, Any] = msgspec.field(default_factory=dict)

        _STRUCT_CLASS = V04Span
    return _STRUCT_CLASS


_STRUCT_NAMES = {"start": "start_ns", "duration": "duration_ns", "type": "span_type"}


def v04_structs(traces: Sequence[Sequence[Any]]) -> List[List[Any]]:
    """The v0.4 span maps as msgspec Structs (fields named as in the span protocol)."""
    cls = msgspec_span_class()
    return [
        [cls(**{_STRUCT_NAMES.get(k, k): v for k, v in span.items()}) for span in trace]
        for trace in v04_maps(traces)
    ]


# --------------------------------------------------------------------------------------------
# Contenders


@dataclass
class Contender:
    key: str
    label: str
    version: str
    family: str  # for the chart's colours and the summary
    requires: Tuple[str, ...]  # importable module names
    form: str  # the input it encodes: a ShapeInputs form ("slotted", "dicts", "ddtrace", ...)
    # make(inputs) -> the timed callable, taking an input of `form` and returning the payload bytes
    make: Callable[[ShapeInputs], Callable[[Any], bytes]]


def _sp_encode_traces(version: str, form: str) -> Callable[[ShapeInputs], Callable[[Any], bytes]]:
    def make(inputs: ShapeInputs) -> Callable[[Any], bytes]:
        fields = "ddtrace" if form == "ddtrace" else None
        return spanpack.TraceMsgPackEncoder(version, fields=fields, max_size=BIG).encode_traces

    return make


def _put_encode(encoder: Any) -> Callable[[List[list]], bytes]:
    put = encoder.put
    encode = encoder.encode

    def run(traces: List[list]) -> bytes:
        for trace in traces:
            put(trace)
        payloads = encode()
        if len(payloads) != 1:
            raise RuntimeError("expected one payload, got %d" % len(payloads))
        return payloads[0][0]

    return run


def _sp_put_encode(version: str) -> Callable[[ShapeInputs], Callable[[Any], bytes]]:
    def make(inputs: ShapeInputs) -> Callable[[Any], bytes]:
        encoder = spanpack.TraceMsgPackEncoder(
            version, fields="ddtrace", max_size=BIG, max_item_size=BIG, max_payload_size=BIG
        )
        return _put_encode(encoder)

    return make


def _dd_put_encode(version: str) -> Callable[[ShapeInputs], Callable[[Any], bytes]]:
    def make(inputs: ShapeInputs) -> Callable[[Any], bytes]:
        from ddtrace.internal._encoding import MsgpackEncoderV04, MsgpackEncoderV05

        cls = MsgpackEncoderV04 if version == "v0.4" else MsgpackEncoderV05
        return _put_encode(cls(BIG, BIG))

    return make


def _packb(module: str, prebuilt: bool) -> Callable[[ShapeInputs], Callable[[Any], bytes]]:
    def make(inputs: ShapeInputs) -> Callable[[Any], bytes]:
        packb = __import__(module).packb
        if prebuilt:
            return packb
        return lambda traces: packb(v04_maps(traces))

    return make


def _msgspec(inputs: ShapeInputs) -> Callable[[Any], bytes]:
    import msgspec

    return msgspec.msgpack.Encoder().encode


def _floor(inputs: ShapeInputs) -> Callable[[Any], bytes]:
    return lambda payload: bytes(bytearray(payload))


def _version_contenders(version: str, peers: List[Contender]) -> List[Contender]:
    """spanpack's four entry points on `version`, then the peers, then the floor."""
    return [
        Contender("spanpack-slotted", "spanpack encode_traces (slotted objects)", version, "spanpack",
                  (), "slotted", _sp_encode_traces(version, "slotted")),
        Contender("spanpack-dicts", "spanpack encode_traces (dicts)", version, "spanpack",
                  (), "dicts", _sp_encode_traces(version, "dicts")),
        Contender("spanpack-ddtrace", "spanpack encode_traces (ddtrace spans)", version, "spanpack",
                  ("ddtrace",), "ddtrace", _sp_encode_traces(version, "ddtrace")),
        Contender("spanpack-ddtrace-put", "spanpack put+encode (ddtrace spans)", version, "spanpack",
                  ("ddtrace",), "ddtrace", _sp_put_encode(version)),
        *peers,
        Contender("floor", "floor: bytes(bytearray(payload))", version, "floor", (), "payload" + version,
                  _floor),
    ]


def _ddtrace_contender(version: str) -> Contender:
    label = "ddtrace MsgpackEncoderV%s put+encode" % version[1:].replace(".", "")
    return Contender("ddtrace-put", label, version, "ddtrace", ("ddtrace",), "ddtrace",
                     _dd_put_encode(version))


def _packb_contender(module: str, prebuilt: bool) -> Contender:
    key, label = ("prebuilt", "prebuilt v0.4 dicts") if prebuilt else ("build", "+ building the dicts")
    return Contender("%s-%s" % (module, key), "%s.packb (%s)" % (module, label), "v0.4", module,
                     (module,), "v04_maps" if prebuilt else "slotted", _packb(module, prebuilt))


CONTENDERS: List[Contender] = [
    *_version_contenders("v0.4", [
        _ddtrace_contender("v0.4"),
        _packb_contender("msgpack", True), _packb_contender("msgpack", False),
        _packb_contender("ormsgpack", True), _packb_contender("ormsgpack", False),
        Contender("msgspec-structs", "msgspec Encoder (prebuilt Structs)", "v0.4", "msgspec",
                  ("msgspec",), "structs", _msgspec),
    ]),
    *_version_contenders("v0.5", [_ddtrace_contender("v0.5")]),
    *_version_contenders("v1.0", []),  # no other Python encoder writes v1.0
]
VERSIONS = ("v0.4", "v0.5", "v1.0")
REFERENCE_KEY = "spanpack-slotted"


def contenders(versions: Sequence[str] = VERSIONS) -> List[Contender]:
    return [c for c in CONTENDERS if c.version in versions]


def available(module: str) -> bool:
    if module == "ddtrace":
        return samples.ddtrace_available()
    try:
        __import__(module)
    except Exception:
        return False
    return True


# --------------------------------------------------------------------------------------------
# Checking outputs


def decode(payload: bytes, version: str) -> Any:
    """The payload's data (v0.5: the string table resolved into a v0.4-like shape;
    v1.0 as msgpack decodes it, strings streamed in order, so two v1.0 payloads
    hold the same data here only when they stream the same strings alike)."""
    import msgpack

    data = msgpack.unpackb(payload, strict_map_key=False)
    if version == "v0.5":
        data = expand_v05(data)
    return data


def expand_v05(data: Any) -> List[List[list]]:
    """Resolve a decoded v0.5 payload's string indexes.

    Each span becomes [service, name, resource, trace_id, span_id, parent_id,
    start, duration, error, meta (str -> str), metrics (str -> number), type].
    """
    table, traces = data
    out = []
    for trace in traces:
        spans = []
        for span in trace:
            if len(span) != 12:
                raise ValueError("v0.5 span with %d elements" % len(span))
            spans.append(
                [table[span[0]], table[span[1]], table[span[2]]]
                + list(span[3:9])
                + [
                    {table[k]: table[v] for k, v in span[9].items()},
                    {table[k]: v for k, v in span[10].items()},
                    table[span[11]],
                ]
            )
        out.append(spans)
    return out


def check(payload: bytes, reference: bytes, version: str, reference_data: Callable[[], Any]) -> str:
    """"same bytes", "same data" or "differs: <why>"."""
    if payload == reference:
        return "same bytes"
    try:
        data = decode(payload, version)
    except Exception as exc:  # corrupt payload
        return "differs: does not decode (%s: %s)" % (type(exc).__name__, str(exc)[:60])
    if data == reference_data():
        return "same data"
    return "differs: decoded data not equal"


# --------------------------------------------------------------------------------------------
# Timing


@dataclass
class Timing:
    best: float  # seconds per call
    median: float
    rounds: int
    number: int  # calls per round
    # each round's seconds per call, in order: round k of every contender
    # measured in the same pass (see paired_ratio)
    samples: List[float] = field(default_factory=list)


def paired_ratio(numerator: Timing, denominator: Timing) -> float:
    """The median over the rounds both took of the one's time over the
    other's in the same pass of turns: a burst of load lasting a pass moves
    both (best over best compares two lucky moments, which on a busy machine
    come rarely, and not alike for code that waits on memory more)."""
    return statistics.median(a / b for a, b in zip(numerator.samples, denominator.samples))


@dataclass
class Budget:
    round_time: float  # target seconds per round
    max_rounds: int
    min_rounds: int
    max_time: float  # seconds per contender, after calibration


DEFAULT_BUDGET = Budget(round_time=0.02, max_rounds=40, min_rounds=5, max_time=0.6)
QUICK_BUDGET = Budget(round_time=0.005, max_rounds=10, min_rounds=3, max_time=0.08)


def _calibrate(fn: Callable[[], Any], budget: Budget) -> int:
    """Calls per round so that a round lasts about budget.round_time."""
    gc.collect()
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    return max(1, int(budget.round_time / max(first, 1e-9)))


def _round(fn: Callable[[], Any], number: int) -> float:
    """Seconds per call over one round of `number` calls, the collector off."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - t0
    finally:
        if gc_was_enabled:
            gc.enable()
    return elapsed / number


def measure(fn: Callable[[], Any], budget: Budget) -> Timing:
    """Best and median seconds per call of fn(), over rounds of `number` calls."""
    return measure_interleaved([fn], budget)[0]


def measure_interleaved(fns: Sequence[Callable[[], Any]], budget: Budget) -> List[Timing]:
    """Like measure(), for several callables whose rounds take turns.

    One round of each callable, then the next round of each, and so on: a
    burst of load from other processes then hits every contender alike,
    which keeps best-of-N ratios fair on a shared machine.  Stops after
    budget.max_rounds rounds each, or once every callable has
    budget.min_rounds rounds and budget.max_time per callable has passed.
    """
    numbers = [_calibrate(fn, budget) for fn in fns]
    return _take_turns([lambda fn=fn, number=number: _round(fn, number)
                        for fn, number in zip(fns, numbers)], numbers, budget)


def _take_turns(rounds: Sequence[Callable[[], float]], numbers: Sequence[int], budget: Budget) -> List[Timing]:
    """One round of each (a call giving seconds per call), then the next of
    each, within `budget` (see measure_interleaved)."""
    times: List[List[float]] = [[] for _ in rounds]
    start = time.perf_counter()
    limit = budget.max_time * len(rounds)
    passes = 0
    while True:
        # The first to go moves along each pass: none always follows the same one.
        first = passes % len(rounds)
        order = list(range(first, len(rounds))) + list(range(first))
        passes += 1
        for i in order:
            if len(times[i]) < budget.max_rounds:
                times[i].append(rounds[i]())
        if all(len(t) >= budget.max_rounds for t in times):
            break
        if (time.perf_counter() - start > limit
                and all(len(t) >= budget.min_rounds for t in times)):
            break
    return [Timing(min(t), statistics.median(t), len(t), n, t) for t, n in zip(times, numbers)]


FRESH_CALLS = 8  # calls per round at most when every call gets inputs of its own (memory)
FRESH_SPANS = 8000  # the same bound in spans, for sample shapes of any size (a round of span_1: 8000 calls)


def _round_fresh(make: Callable[[], Any], fn: Callable[[Any], Any], number: int) -> float:
    """Seconds per call over `number` calls of fn, each on an input of its
    own made by make() before the timing starts (and dropped after it ends),
    the collector off."""
    inputs = [make() for _ in range(number)]
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for item in inputs:
            fn(item)
        elapsed = time.perf_counter() - t0
    finally:
        if gc_was_enabled:
            gc.enable()
    del inputs
    return elapsed / number


def measure_fresh(calls: Sequence[Tuple[Callable[[], Any], Callable[[Any], Any]]], budget: Budget,
                  max_calls: int = FRESH_CALLS) -> List[Timing]:
    """measure_interleaved() for (make, fn) pairs: fn(make()), where each
    timed call gets a fresh input, made outside the timing: new span objects
    encoded once, as a tracer encodes its spans.  Rounds of at most
    `max_calls` calls (each input is a whole set of traces)."""
    numbers = []
    for make, fn in calls:
        gc.collect()
        item = make()
        t0 = time.perf_counter()
        fn(item)
        first = time.perf_counter() - t0
        numbers.append(max(1, min(max_calls, int(budget.round_time / max(first, 1e-9)))))
    return _take_turns([lambda make=make, fn=fn, number=number: _round_fresh(make, fn, number)
                        for (make, fn), number in zip(calls, numbers)], numbers, budget)


# --------------------------------------------------------------------------------------------
# Running


@dataclass
class Result:
    shape: str
    version: str
    key: str
    label: str
    family: str
    spans: int
    traces: int
    status: str  # "same bytes" | "same data" | "differs: ..." | "skipped: ..." | "error: ..."
    payload_bytes: Optional[int] = None
    best: Optional[float] = None  # seconds per call
    median: Optional[float] = None
    rounds: int = 0
    number: int = 0
    ratio: Optional[float] = None  # best / spanpack reference best (same shape and version)
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def timed(self) -> bool:
        return self.best is not None

    @property
    def per_span(self) -> Optional[float]:
        return None if self.best is None else self.best / self.spans


def run(
    shapes: Sequence[str],
    quick: bool = False,
    versions: Sequence[str] = VERSIONS,
    progress: Callable[[str], None] = lambda msg: None,
    budget: Optional[Budget] = None,
    reencode: bool = False,
) -> Tuple[List[Result], List[str]]:
    """Check and time every available contender on every shape; (results, notes).

    Each timed call encodes span objects made for it alone, outside the timing
    (measure_fresh), or with `reencode` the same objects every call."""
    budget = budget or (QUICK_BUDGET if quick else DEFAULT_BUDGET)
    notes: List[str] = []
    missing = sorted({m for c in contenders(versions) for m in c.requires if not available(m)})
    for module in missing:
        skipped = [c for c in contenders(versions) if module in c.requires]
        notes.append(
            "%s is not installed: skipping %d contender(s) (%s); pip install %s"
            % (module, len(skipped), ", ".join(sorted({c.label for c in skipped})), module)
        )
    can_check = available("msgpack")
    if not can_check:
        notes.append("msgpack is not installed: outputs that differ from spanpack's bytes cannot be "
                     "decoded, and are reported as unchecked")

    results: List[Result] = []
    for n, shape in enumerate(shapes, 1):
        t0 = time.perf_counter()
        inputs = ShapeInputs(shape, quick)
        progress("[%d/%d] %s: %d trace(s), %d spans" % (n, len(shapes), shape, inputs.traces,
                                                        inputs.spans))
        to_time: List[Tuple[Result, Contender, Callable[[Any], bytes]]] = []
        for contender in contenders(versions):
            result = Result(shape, contender.version, contender.key, contender.label,
                            contender.family, inputs.spans, inputs.traces, status="")
            results.append(result)
            lacking = [m for m in contender.requires if m in missing]
            if lacking:
                result.status = "skipped: %s not installed" % ", ".join(lacking)
                continue
            version = contender.version
            try:
                fn = contender.make(inputs)
                payload = fn(inputs.fresh(contender.form))
            except Exception as exc:
                result.status = "error: %s: %s" % (type(exc).__name__, str(exc)[:80])
                progress("    %-44s %s %s" % (contender.label, version, result.status))
                continue
            result.payload_bytes = len(payload)
            reference = (inputs.ddtrace_reference(version) if "ddtrace" in contender.requires
                         else inputs.reference(version))
            if payload == reference:
                result.status = "same bytes"
            elif not can_check:
                result.status = "unchecked"
            else:
                result.status = check(
                    payload, reference, version,
                    lambda: inputs._get("data%s%d" % (version, id(reference)),
                                        lambda: decode(reference, version)),
                )
            del payload
            if result.status.startswith("differs"):
                progress("    %-44s %s %s (not timed)" % (contender.label, version, result.status))
                continue
            to_time.append((result, contender, fn))
        progress("    checked %d contenders; timing them in turns (%s)"
                 % (len(to_time), "re-encoding" if reencode else "fresh spans every call"))
        if reencode:
            timings = measure_interleaved(
                [lambda fn=fn, traces=inputs.form(c.form): fn(traces) for _, c, fn in to_time], budget)
        else:
            timings = measure_fresh(
                [(lambda form=c.form: inputs.fresh(form), fn) for _, c, fn in to_time], budget,
                max_calls=max(1, FRESH_SPANS // inputs.spans))
        reference_best: Dict[str, float] = {}
        for (result, _contender, _fn), timing in zip(to_time, timings):
            result.best, result.median = timing.best, timing.median
            result.rounds, result.number = timing.rounds, timing.number
            if result.key == REFERENCE_KEY:
                reference_best[result.version] = timing.best
            progress("    %-44s %s %9s/span" % (result.label, result.version,
                                                 fmt_time(result.per_span)))
        for result in results:
            if result.shape == shape and result.timed and result.version in reference_best:
                result.ratio = result.best / reference_best[result.version]
        progress("    (%.1f s)" % (time.perf_counter() - t0))
    return results, notes


USER_CLASSES_TITLE = ("Your own span class, fresh spans (10 traces x 100 spans built before each timed call, "
                      "each encoded once; time per span, and the ratio to spanpack v0.4): msgspec encodes "
                      "equivalent Structs built beforehand, msgpack packs a to_dict() per span; then "
                      "spanpack v0.4 re-encoding the same objects, which a tracer never does:")


SAMPLES_NOTE = ("The sample shapes below are fresh spans: every timed call encodes span objects built for it "
                "alone before the timing (with new str objects for each span's own values: a resource with "
                "an id, a URL, a host, random tag values), each encoded once, as a tracer does; peers get "
                "their dicts, Structs or ddtrace Spans made from those spans, also before the timing.")
SAMPLES_REENCODED_NOTE = ("The sample shapes below are re-encoded (--reencode): every call encodes the same "
                          "span objects again, which a tracer never does; without --reencode each call gets "
                          "fresh spans.")


def run_user_classes(quick: bool = False,
                     progress: Callable[[str], None] = lambda msg: None) -> str:
    """Time the span classes users write (spanpack.user_spans) on fresh
    spans, then spanpack v0.4 re-encoding one set (labelled so); a table."""
    from . import user_spans

    budget = QUICK_BUDGET if quick else DEFAULT_BUDGET
    labels: List[str] = []
    rows: List[Tuple[str, Dict[str, float]]] = []
    for name in user_spans.SHAPES:
        found = user_spans.contenders()
        user_spans.check(found, user_spans.traces(name))
        calls = [(lambda c=c: c.prepare(user_spans.traces(name)), c.encode) for c in found.values()]
        timings = measure_fresh(calls, budget)
        per_span = {label: t.best / user_spans.SPANS for label, t in zip(found, timings)}
        again = user_spans.traces(name)
        encode_again = found["spanpack v0.4"].encode
        per_span[REENCODED] = measure(lambda: encode_again(again), budget).best / user_spans.SPANS
        labels += [label for label in per_span if label not in labels]
        rows.append((name, per_span))
        progress("    your own span class: %-22s %9s/span" % (name, fmt_time(per_span["spanpack v0.4"])))
    out = [["span class (fresh spans, 6 tags, 3 metrics)"] + labels]
    for name, per_span in rows:
        base = per_span["spanpack v0.4"]
        out.append([name] + ["%s (%.2fx)" % (fmt_time(per_span[label]), per_span[label] / base)
                             if label in per_span else "-" for label in labels])
    return table(out, right=range(1, len(labels) + 1))


REENCODED = "spanpack v0.4 re-encoded"


# --------------------------------------------------------------------------------------------
# Reporting


def run_ddtrace_tracer(quick: bool = False, progress: Callable[[str], None] = lambda msg: None) -> str:
    """The table of spanpack.ddtrace_shapes: traces made by ddtrace's own
    tracer, each timed call on spans made for it alone, encoded once."""
    import ddtrace

    from . import ddtrace_shapes

    rounds = 5 if quick else 15
    results = ddtrace_shapes.run(rounds=rounds, progress=progress)
    return ("Traces made by ddtrace %s's own tracer (fresh spans every call, best of %d rounds); "
            "x = ddtrace's time / spanpack's, best over best, and paired (the median of each "
            "round's ratio):\n%s"
            % (ddtrace.__version__, rounds, ddtrace_shapes.report(results)))


def fmt_time(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return "%.3g %s" % (seconds / scale, unit)
    return "%.3g ns" % (seconds / 1e-9)


def fmt_rate(per_span: Optional[float]) -> str:
    if not per_span:
        return "-"
    rate = 1.0 / per_span
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if rate >= scale:
            return "%.3g%s" % (rate / scale, unit)
    return "%.3g" % rate


def columns(rows: List[List[str]], right: Sequence[int] = ()) -> List[str]:
    """The rows as lines of aligned columns (two spaces apart, no trailing blanks)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w)
                      for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in rows]


def table(rows: List[List[str]], right: Sequence[int]) -> str:
    """Aligned columns under a header line and a rule of dashes."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    header, *body = columns(rows, right)
    return "\n".join([header, "  ".join("-" * w for w in widths), *body])


def report(results: List[Result]) -> str:
    rows = [["shape", "ver", "contender", "time/span", "median/span", "spans/s", "x spanpack",
             "payload bytes", "check"]]
    previous = None
    for r in results:
        if previous is not None and r.shape != previous:
            rows.append([""] * len(rows[0]))
        previous = r.shape
        rows.append([
            r.shape, r.version, r.label,
            fmt_time(r.per_span),
            fmt_time(None if r.median is None else r.median / r.spans),
            fmt_rate(r.per_span),
            "-" if r.ratio is None else "%.2f" % r.ratio,
            "-" if r.payload_bytes is None else "{:,}".format(r.payload_bytes),
            r.status,
        ])
    return table(rows, right={3, 4, 5, 6, 7})


# The spanpack entry point each peer is measured against: ddtrace's put+encode
# against spanpack's put+encode on the same ddtrace Spans; every other contender
# against spanpack encode_traces on slotted objects (REFERENCE_KEY).
BASELINE = {"ddtrace-put": "spanpack-ddtrace-put"}

SUMMARY_TITLE = ("Peers vs spanpack, fresh spans every call (time ratio; ddtrace columns compare put+encode "
                 "on the same ddtrace Spans, the others compare with spanpack on slotted objects):")
SUMMARY_REENCODED_TITLE = SUMMARY_TITLE.replace("fresh spans every call", "re-encoding the same spans")
SUMMARY = [
    # (column title, version, contender key)
    ("ddtrace v0.4", "v0.4", "ddtrace-put"),
    ("ddtrace v0.5", "v0.5", "ddtrace-put"),
    ("msgpack prebuilt", "v0.4", "msgpack-prebuilt"),
    ("msgpack +build", "v0.4", "msgpack-build"),
    ("ormsgpack prebuilt", "v0.4", "ormsgpack-prebuilt"),
    ("ormsgpack +build", "v0.4", "ormsgpack-build"),
    ("msgspec Structs", "v0.4", "msgspec-structs"),
    ("floor v0.4", "v0.4", "floor"),
]


def peer_ratio(results: List[Result], shape: str, version: str, key: str) -> Optional[float]:
    """The contender's best time over its baseline's (BASELINE), or None if either was not timed."""
    index = {(r.shape, r.version, r.key): r for r in results}
    a = index.get((shape, version, key))
    b = index.get((shape, version, BASELINE.get(key, REFERENCE_KEY)))
    if a is None or b is None or not (a.timed and b.timed):
        return None
    return a.best / b.best


def summary(results: List[Result]) -> str:
    """Per shape: how many times longer each peer takes than spanpack."""
    index = {(r.shape, r.version, r.key): r for r in results}
    shapes = list(dict.fromkeys(r.shape for r in results))
    rows = [["shape"] + [title for title, *_ in SUMMARY]]
    for shape in shapes:
        row = [shape]
        for _title, version, key in SUMMARY:
            contender = index.get((shape, version, key))
            ratio = peer_ratio(results, shape, version, key)
            if contender is not None and contender.status.startswith("differs"):
                row.append("differs")
            else:
                row.append("-" if ratio is None else "%.2fx" % ratio)
        rows.append(row)
    return table(rows, right=set(range(1, len(rows[0]))))


def rounds_range(results: List[Result]) -> str:
    """The N of "best of N": the fewest and most timed rounds of any contender."""
    rounds = [r.rounds for r in results if r.timed]
    if not rounds:
        return "N"
    return str(min(rounds)) if min(rounds) == max(rounds) else "%d-%d" % (min(rounds), max(rounds))


# What the words in the table and chart mean (benchmarks/README.md has the details).
LEGEND = ("floor = copying the finished payload, bytes(bytearray(payload)): less than any encoder "
          "can spend.  differs = the contender's payload decodes to other data than spanpack's; "
          "it is reported, not timed.")
RATIO_NOTE = ("The number above a peer's bar is its time / spanpack's, as in the printed table "
              "(above 1: spanpack is faster): ddtrace against spanpack put+encode on the same "
              "ddtrace Spans, every other peer against spanpack encode_traces on slotted objects.")

# One look per contender key, the same in every panel: spanpack's entry points
# share a hue and differ in lightness and hatching; each peer library has its own hue.
BAR_STYLE: Dict[str, Dict[str, Any]] = {
    "spanpack-slotted": {"color": "#08306b"},
    "spanpack-dicts": {"color": "#4292c6", "hatch": "///"},
    "spanpack-ddtrace": {"color": "#9ecae1", "hatch": "..."},
    "spanpack-ddtrace-put": {"color": "#deebf7", "hatch": "xxx"},
    "ddtrace-put": {"color": "#31a354"},
    "msgpack-prebuilt": {"color": "#e6550d"}, "msgpack-build": {"color": "#fdae6b", "hatch": "///"},
    "ormsgpack-prebuilt": {"color": "#756bb1"}, "ormsgpack-build": {"color": "#bcbddc", "hatch": "///"},
    "msgspec-structs": {"color": "#d6616b"},
    "floor": {"color": "#969696"},
}


def fmt_ratio(ratio: float) -> str:
    return ("%.1f×" if ratio >= 1 else "%.2f×") % ratio


def shape_key(shapes: Sequence[str]) -> str:
    """One line per shape: its name and what it holds (as bench --list says)."""
    rows = [[name, samples.SHAPES[name].description] for name in shapes if name in samples.SHAPES]
    return "\n".join(columns(rows)) if rows else ""


def chart(results: List[Result], path: str, title: str) -> None:
    """A PNG bar chart: time per span (log scale, lower is better), a panel per
    payload version, one group of bars per shape, each peer's ratio above its bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    versions = [v for v in VERSIONS if any(r.version == v for r in results)]
    shapes = list(dict.fromkeys(r.shape for r in results))
    shapes_text = shape_key(shapes)
    key_lines = shapes_text.count("\n") + 1 if shapes_text else 0
    footer = 0.6 + 0.17 * key_lines  # inches below the last panel for the notes and shape key
    height = 7 * len(versions) + footer
    fig, axes = plt.subplots(len(versions), 1, squeeze=False,
                             figsize=(max(12, 1.6 * len(shapes)), height))
    for ax, version in zip(axes[:, 0], versions):
        keys = list(dict.fromkeys(r.key for r in results if r.version == version
                                  and (r.timed or r.status.startswith("differs"))))
        width = 0.85 / max(1, len(keys))
        tallest = 0.0
        for j, key in enumerate(keys):
            style = BAR_STYLE.get(key, {"color": "#444444"})
            xs, ys, label = [], [], None
            for i, shape in enumerate(shapes):
                x = i - 0.425 + width * (j + 0.5)
                match = [r for r in results
                         if r.shape == shape and r.version == version and r.key == key and r.timed]
                if match:
                    label = match[0].label
                    xs.append(x)
                    ys.append(match[0].per_span * 1e9)
                    ratio = peer_ratio(results, shape, version, key)
                    if ratio is not None and not key.startswith("spanpack-"):
                        ax.annotate(fmt_ratio(ratio), (x, ys[-1]), xytext=(0, 2),
                                    textcoords="offset points", rotation=90, ha="center",
                                    va="bottom", fontsize=7,
                                    bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none",
                                          "alpha": 0.8})  # legible over a taller neighbour
                elif any(r.shape == shape and r.version == version and r.key == key
                         and r.status.startswith("differs") for r in results):
                    # No bar: say why at its place, on the axis.
                    ax.annotate("differs (not timed)", (x, 0), xytext=(0, 3),
                                xycoords=("data", "axes fraction"), textcoords="offset points",
                                rotation=90, ha="center", va="bottom", fontsize=8,
                                color=style["color"])
            if xs:
                ax.bar(xs, ys, width, label=label, edgecolor="#08306b" if "hatch" in style else None,
                       linewidth=0.4, **style)
                tallest = max(tallest, max(ys))
        ax.set_yscale("log")
        if tallest:
            ax.set_ylim(top=tallest * 4)  # room for the ratios above the tallest bars
        ax.set_ylabel("ns per span, log scale: lower is better\n(best of %s rounds)"
                      % rounds_range(results))
        ax.set_title("%s payloads: time per span (lower is better)" % version)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, rotation=15)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.suptitle(title)
    bottom = footer / height
    fig.text(0.5, bottom - 0.1 / height, RATIO_NOTE + "\n" + LEGEND, ha="center", va="top", fontsize=8,
             wrap=True)
    if key_lines:
        fig.text(0.5, bottom - 0.5 / height, "shapes:\n" + shapes_text, ha="center", va="top",
                 multialignment="left", fontsize=8, family="monospace")
    fig.tight_layout(rect=(0, bottom, 1, 1 - 0.3 / height))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment() -> Dict[str, Any]:
    from importlib import metadata

    versions = {}
    for dist in ("spanpack", "ddtrace", "msgpack", "ormsgpack", "msgspec", "matplotlib"):
        try:
            versions[dist] = metadata.version(dist)
        except Exception:
            versions[dist] = None
    versions["spanpack"] = versions["spanpack"] or spanpack.__version__
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "system": platform.system(),
        "cpus": os.cpu_count(),
        "packages": versions,
    }


# --------------------------------------------------------------------------------------------
# Command line


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    if parser is None:
        parser = argparse.ArgumentParser(prog="python -m spanpack bench")
    # The docstring's first line, without its reST markup (argparse prints text as it is).
    parser.description = __doc__.strip().splitlines()[0].replace("``", "")
    parser.add_argument("--quick", action="store_true",
                        help="fewer and shorter rounds (%d-%d instead of %d-%d), smaller many_traces"
                        % (QUICK_BUDGET.min_rounds, QUICK_BUDGET.max_rounds,
                           DEFAULT_BUDGET.min_rounds, DEFAULT_BUDGET.max_rounds))
    parser.add_argument("--out", nargs="?", const="bench.png", default=None, metavar="PNG",
                        help="write a bar chart (default file name: bench.png)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--shapes", nargs="+", metavar="SHAPE", choices=samples.shape_names(),
                        default=None, help="shapes to run (default: all): %s"
                        % ", ".join(samples.shape_names()))
    parser.add_argument("--versions", nargs="+", choices=list(VERSIONS), default=list(VERSIONS),
                        help="payload versions to run (default: all)")
    parser.add_argument("--reencode", action="store_true",
                        help="encode the same span objects in every timed call (a cache's best case, "
                        "which a tracer never sees) instead of fresh spans built for each call")
    parser.add_argument("--list", action="store_true", help="list shapes and contenders, then exit")
    parser.add_argument("--no-user-classes", action="store_true",
                        help="skip the table of span classes of one's own (spanpack.user_spans)")
    parser.add_argument("--no-ddtrace-tracer", action="store_true",
                        help="skip the table of traces made by ddtrace's own tracer "
                        "(spanpack.ddtrace_shapes; run only when ddtrace is installed)")
    return parser


def listing(versions: Sequence[str]) -> str:
    """What bench --list prints: the shapes, then the contenders, in aligned columns."""
    shape_rows = [["  " + shape.name, shape.description] for shape in samples.SHAPES.values()]
    contender_rows = [["  " + c.version, c.label, "" if all(map(available, c.requires))
                       else "(missing: %s)" % ", ".join(c.requires)] for c in contenders(versions)]
    return "\n".join(["shapes:", *columns(shape_rows), "contenders:", *columns(contender_rows)])


def main(argv: Optional[Sequence[str]] = None, args: Optional[argparse.Namespace] = None) -> int:
    if args is None:
        args = build_parser().parse_args(argv)
    if args.list:
        print(listing(args.versions))
        return 0
    shapes = args.shapes or samples.shape_names()

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    results, notes = run(shapes, quick=args.quick, versions=args.versions, progress=progress,
                         reencode=args.reencode)
    user_classes = None if args.no_user_classes else run_user_classes(args.quick, progress)
    tracer_spans = None
    if not args.no_ddtrace_tracer and available("ddtrace"):
        tracer_spans = run_ddtrace_tracer(args.quick, progress)
    elapsed = time.perf_counter() - started
    for note in notes:
        print("note: " + note, file=sys.stderr)

    env = environment()
    print("spanpack %s, Python %s (%s), %s cpus; %s run in %.0f s; times are the best of %s rounds"
          % (env["packages"]["spanpack"], env["python"], env["implementation"], env["cpus"],
             "quick" if args.quick else "full", elapsed, rounds_range(results)))
    print("x spanpack = contender time / spanpack encode_traces(slotted objects) time, "
          "same shape and version (above 1: spanpack faster)")
    print(SAMPLES_REENCODED_NOTE if args.reencode else SAMPLES_NOTE)
    print()
    print(report(results))
    print()
    print(SUMMARY_REENCODED_TITLE if args.reencode else SUMMARY_TITLE)
    print(summary(results))
    print(LEGEND)
    if user_classes is not None:
        print()
        print(USER_CLASSES_TITLE)
        print(user_classes)
    if tracer_spans is not None:
        print()
        print(tracer_spans)
    for note in notes:
        print("note: " + note)

    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({
                "environment": env,
                "quick": args.quick,
                "reencode": args.reencode,
                "elapsed_s": elapsed,
                "notes": notes,
                "results": [
                    dict(r.__dict__, per_span=r.per_span) for r in results
                ],
            }, f, indent=1)
        print("wrote " + args.json, file=sys.stderr)
    if args.out:
        if not available("matplotlib"):
            print("note: matplotlib is not installed; no chart (pip install matplotlib)",
                  file=sys.stderr)
        else:
            chart(results, args.out,
                  "spanpack %s vs peers, Python %s, %s%s"
                  % (env["packages"]["spanpack"], env["python"],
                     "re-encoding the same spans" if args.reencode else "fresh spans every call",
                     " (quick)" if args.quick else ""))
            print("wrote " + args.out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
