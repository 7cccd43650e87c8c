"""Traces made by ddtrace's own tracer, and spanpack timed against ddtrace on them.

The shapes are built through ddtrace's public tracer API and taken where
ddtrace's writer would take them (after every trace processor), so they are
the spans ddtrace's encoder really gets, native ones from ddtrace 4.3 on.
Every timed call encodes span objects made for it alone, once, as a tracer
does: nothing is re-encoded.  Used by ``python -m spanpack bench`` (its
ddtrace section, when ddtrace is installed), ``benchmarks/ddtrace_tracer.py``
(with the read floor) and the tests.  Importing this module imports ddtrace.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import ddtrace
from ddtrace.trace import tracer

from . import TraceMsgPackEncoder


class Recorder:
    """Stands in for ddtrace's trace writer: keeps what it is given."""

    def __init__(self) -> None:
        self.traces: List[list] = []

    def write(self, spans: Optional[list] = None) -> None:
        if spans:
            self.traces.append(list(spans))

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None  # flush_queue, stop, recreate...


def finished_traces(body: Callable[[], None], times: int = 1) -> List[list]:
    """Runs `body` (which traces with ddtrace's global tracer) `times` times
    and returns the traces ddtrace's writer would have been given; the
    tracer's own writer is put back afterwards."""
    aggregator = tracer._span_aggregator
    previous = aggregator.writer
    recorder = Recorder()
    aggregator.writer = recorder
    try:
        for _ in range(times):
            body()
    finally:
        aggregator.writer = previous
    return recorder.traces


# ---------------------------------------------------------------------------
# The shapes: per-span values (ids, hosts, resources), as a tracer writes them


def one_span() -> None:
    with tracer.trace("web.request", service="web", resource="GET /", span_type="web") as span:
        span.set_tag("http.method", "GET")


def web_with_children(children: int = 10, tags: int = 2) -> None:
    with tracer.trace("web.request", service="web", resource="GET /users/42", span_type="web") as root:
        root.set_tag("http.method", "GET")
        root.set_tag("http.url", "http://example.test/users/42")
        root.set_tag("http.status_code", 200)
        root.set_tag("component", "flask")
        for i in range(children):
            with tracer.trace("redis.command", service="redis", resource="GET user:%d" % i,
                              span_type="redis") as child:
                child.set_tag("db.system", "redis")
                child.set_tag("out.host", "cache-%d.internal" % (i % 3))
                for t in range(tags - 2):
                    child.set_tag("tag.%d" % t, "value-%d-%d" % (i, t))
                child.set_metric("db.row_count", i)


def web_50_children_40_tags() -> None:
    web_with_children(children=50, tags=40)


def errors_links_events_struct_tags() -> None:
    with tracer.trace("web.request", service="web", resource="POST /orders", span_type="web") as root:
        with tracer.trace("db.query", service="postgres", resource="INSERT", span_type="sql") as failing:
            try:
                raise ValueError("duplicate key")
            except ValueError:
                failing.set_exc_info(*sys.exc_info())
        with tracer.trace("queue.publish", service="kafka") as producer:
            producer.link_span(root.context, attributes={"link.kind": "follows", "n": 3, "ok": True})
            producer.set_link(trace_id=(7 << 64) | 9, span_id=11, tracestate="dd=s:1", flags=1,
                              attributes={"list": ["a", "b"], "x": 1.5})
            producer._add_event("retry", {"attempt": 2, "reason": "timeout", "ratio": 0.5,
                                          "flag": False, "codes": [1, 2, 3]}, 1_700_000_000_000_000_000)
            producer._add_event("sent")
            try:
                raise KeyError("missing")
            except KeyError as e:
                producer.record_exception(e)
            producer._set_struct_tag("appsec", {"triggers": [{"rule": "r-1"}], "score": 1.5})
        root.error = 1


# name -> (builder, traces per timed call)
SHAPES: Dict[str, Any] = {
    "one_span": (one_span, 100),
    "web_10_children": (web_with_children, 10),
    "web_50_children_40_tags": (web_50_children_40_tags, 2),
    "errors_links_events_struct_tags": (errors_links_events_struct_tags, 25),
}


# ---------------------------------------------------------------------------
# Timing


def ddtrace_encoder(version: str) -> Any:
    from ddtrace.internal._encoding import MsgpackEncoderV04, MsgpackEncoderV05

    cls = MsgpackEncoderV04 if version == "v0.4" else MsgpackEncoderV05
    return cls(64 << 20, 64 << 20)


def _put_encode(encoder: Any, traces: List[list]) -> Any:
    for trace in traces:
        encoder.put(trace)
    return encoder.encode()


# contender -> version -> a new encoder -> a function that encodes traces once
# (the encoder is made outside the timing, once, and kept for every round: a
# tracer's writer keeps its own for the life of the process).
Contender = Callable[[str], Callable[[], Callable[[List[list]], Any]]]
CONTENDERS: Dict[str, Contender] = {
    "ddtrace put+encode": lambda version: lambda: (
        lambda encoder: lambda traces: _put_encode(encoder, traces))(ddtrace_encoder(version)),
    "spanpack put+encode": lambda version: lambda: (
        lambda encoder: lambda traces: _put_encode(encoder, traces))(TraceMsgPackEncoder(version)),
    "spanpack encode_traces": lambda version: lambda: TraceMsgPackEncoder(version).encode_traces,
}


@dataclass
class ShapeTiming:
    shape: str
    version: str
    spans: int
    per_span: Dict[str, float]  # contender -> best seconds per span
    rounds: int
    # contender -> each round's seconds per span, in round order (the
    # contenders' times of one round side by side: see paired_ratio)
    per_round: Dict[str, List[float]] = field(default_factory=dict)

    def ratio(self, contender: str, against: str = "ddtrace put+encode") -> float:
        """The best time of `against` over the best time of `contender`."""
        return self.per_span[against] / self.per_span[contender]

    def paired_ratio(self, contender: str, against: str = "ddtrace put+encode") -> float:
        """The median over the rounds of `against`'s time over `contender`'s
        in the same round: the two calls a round apart at most, so a burst of
        load on the machine that lasts a round moves both (a best-of ratio
        compares two lucky moments, which on a busy machine come rarely and
        not alike for code that waits on memory more)."""
        return statistics.median(a / c for a, c in zip(self.per_round[against], self.per_round[contender]))


def time_shape(shape: str, version: str, rounds: int,
               extra: Optional[Dict[str, Callable[[], Callable[[List[list]], Any]]]] = None) -> ShapeTiming:
    """Best time per span of each contender over `rounds` rounds, and every
    round's; in each round every contender encodes traces made for it
    alone, once (the contenders take turns, the first one moving along each
    round, so that no contender always follows the same one), with the
    encoder it keeps from round to round, as a tracer's writer does."""
    body, count = SHAPES[shape]
    makers = {name: make(version) for name, make in CONTENDERS.items()}
    makers.update(extra or {})
    encoders = list((name, make()) for name, make in makers.items())
    per_round: Dict[str, List[float]] = {name: [] for name, _ in encoders}
    spans = 0
    for round_number in range(rounds):
        first = round_number % len(encoders)
        for name, encode in encoders[first:] + encoders[:first]:
            traces = finished_traces(body, count)
            spans = sum(map(len, traces))
            gc.collect()
            gc.disable()
            try:
                started = time.perf_counter()
                encode(traces)
                elapsed = time.perf_counter() - started
            finally:
                gc.enable()
            per_round[name].append(elapsed / spans)
    return ShapeTiming(shape, version, spans, {k: min(v) for k, v in per_round.items()}, rounds,
                       per_round)


def run(versions: Sequence[str] = ("v0.4", "v0.5"), rounds: int = 15,
        extra: Optional[Callable[[str], Dict[str, Callable[[], Callable[[List[list]], Any]]]]] = None,
        progress: Callable[[str], None] = lambda message: None) -> List[ShapeTiming]:
    results = []
    for shape in SHAPES:
        for version in versions:
            progress("ddtrace %s: %s %s" % (ddtrace.__version__, shape, version))
            results.append(time_shape(shape, version, rounds, extra(version) if extra else None))
    return results


def report(results: List[ShapeTiming]) -> str:
    """A table: the best ns per span of each contender, and ddtrace's time
    over spanpack's: best over best, and paired (the median of the rounds'
    ratios: ShapeTiming.paired_ratio)."""
    names = list(results[0].per_span)
    header = ["shape", "version", *("%s ns/span" % n for n in names),
              "x put+encode", "x encode_traces", "paired x put+encode", "paired x encode_traces"]
    rows = [header]
    for r in results:
        rows.append([r.shape, r.version, *("%.0f" % (r.per_span[n] * 1e9) for n in names),
                     "%.2f" % r.ratio("spanpack put+encode"), "%.2f" % r.ratio("spanpack encode_traces"),
                     "%.2f" % r.paired_ratio("spanpack put+encode"),
                     "%.2f" % r.paired_ratio("spanpack encode_traces")])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))) for row in rows)
