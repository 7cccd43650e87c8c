"""spanpack.otel against OpenTelemetry's own OTLP encoder, on the same spans.

    python benchmarks/otel_vs_otlp.py [--rounds N] [--spans N]   # a table: µs per span and the ratio
    python benchmarks/otel_vs_otlp.py --instructions            # the same under callgrind: instructions
    pytest benchmarks/otel_vs_otlp.py --benchmark-only --benchmark-group-by=group

Each shape is a batch of spans made by the OpenTelemetry SDK's own tracer
(TracerProvider, one resource and scope, 10 spans a trace), made afresh
before every timed call (nothing either side may cache from span objects it
saw before).  OTLP: ``opentelemetry.exporter.otlp.proto.common.trace_encoder
.encode_spans(spans).SerializeToString()``, the bytes OTel's OTLP/HTTP
exporter sends.  spanpack: ``spanpack.otel.encode_spans(spans)``, a v0.4
payload (the mapping to Datadog spans included).  The table's ratio is OTLP
time / spanpack time, both measured in the same run, round by round on the
same fresh spans (the order alternating), medians over the rounds.

Shapes: ``http_server`` (a server span with 10 attributes), ``db_client`` (a
client DB span, 5 attributes), ``events_links`` (an internal span with 3
attributes, 2 events one of them an exception, and 2 links).

``--instructions`` counts instructions instead (valgrind's callgrind, a
measure other jobs on the machine do not move): for each shape and
contender, one run encodes 3 fresh batches and one 13, each after one
warm-up batch; the same two runs without encoding are subtracted (making the
spans), so what is left is 10 batches' encoding, reported per span
(PYTHONHASHSEED=0 in every run, so that dict and set layouts agree).

No test asserts anything about timings.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any, Callable, Dict, List

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.common.trace_encoder")

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as otlp_encode_spans  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import Link, SpanKind, Status, StatusCode  # noqa: E402

from spanpack import otel  # noqa: E402

SPANS_PER_TRACE = 10
RESOURCE = {"service.name": "checkout", "service.version": "2.1", "deployment.environment.name": "prod",
            "host.name": "web-7", "container.id": "c0ffee"}


def _http_server(tracer: Any, n: int) -> None:
    with tracer.start_as_current_span("GET /cart/{id}", kind=SpanKind.SERVER, attributes={
        "http.request.method": "GET", "http.route": "/cart/{id}", "http.response.status_code": 200,
        "url.full": "https://shop.example/cart/%d" % n, "url.scheme": "https", "server.address": "shop.example",
        "server.port": 443, "client.address": "10.0.%d.%d" % (n // 256 % 256, n % 256),
        "user_agent.original": "Mozilla/5.0", "network.protocol.version": "1.1",
    }):
        pass


def _db_client(tracer: Any, n: int) -> None:
    with tracer.start_as_current_span("SELECT shop.carts", kind=SpanKind.CLIENT, attributes={
        "db.system": "postgresql", "db.name": "shop", "db.statement": "SELECT * FROM carts WHERE id = %d" % n,
        "server.address": "db.internal", "server.port": 5432,
    }):
        pass


def _events_links(tracer: Any, n: int) -> None:
    links = [Link(tracer.start_span("upstream-%d" % i).get_span_context(), {"link.index": i}) for i in range(2)]
    with tracer.start_as_current_span("process batch", links=links, attributes={
        "batch.size": n, "batch.queue": "orders", "retry": False,
    }) as span:
        span.add_event("batch.received", {"count": n, "source": "kafka"})
        try:
            raise ValueError("bad order %d" % n)
        except ValueError as error:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, "failed"))


SHAPES: Dict[str, Callable[[Any, int], None]] = {
    "http_server": _http_server,
    "db_client": _db_client,
    "events_links": _events_links,
}


class _Tracing:
    """One TracerProvider for the whole run, as an application keeps one: its
    resource and scope are the same objects in every batch, the spans new."""

    def __init__(self) -> None:
        self.memory = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create(RESOURCE))
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        self.tracer = self.provider.get_tracer("shop.instrumentation", "0.9")


_tracing: List[_Tracing] = []


def make_spans(shape: str, count: int) -> List[Any]:
    """`count` fresh finished spans of a shape, in traces of SPANS_PER_TRACE."""
    if not _tracing:
        _tracing.append(_Tracing())
    tracing = _tracing[0]
    tracing.memory.clear()
    make = SHAPES[shape]
    made = 0
    while made < count:
        with tracing.tracer.start_as_current_span("trace-root"):
            for _ in range(SPANS_PER_TRACE - 1):
                make(tracing.tracer, made)
        made += SPANS_PER_TRACE
    spans = [span for span in tracing.memory.get_finished_spans() if not span.name.startswith("upstream-")]
    tracing.memory.clear()
    return spans[:count]


CONTENDERS: Dict[str, Callable[[List[Any]], bytes]] = {
    "OTLP encode_spans + SerializeToString": lambda spans: otlp_encode_spans(spans).SerializeToString(),
    "spanpack.otel.encode_spans v0.4": lambda spans: otel.encode_spans(spans),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("contender", list(CONTENDERS))
def test_otel_encoders(benchmark, shape, contender):
    encode = CONTENDERS[contender]
    benchmark.group = "otel: " + shape
    benchmark.extra_info["spans"] = 100
    benchmark.pedantic(encode, setup=lambda: ((make_spans(shape, 100),), {}), rounds=30)


def compare(shape: str, count: int, rounds: int) -> Dict[str, float]:
    """Median µs per span of each contender and the ratio, measured round by
    round on the same fresh spans."""
    names = list(CONTENDERS)
    times: Dict[str, List[float]] = {name: [] for name in names}
    ratios: List[float] = []
    for name in names:  # warm up
        CONTENDERS[name](make_spans(shape, count))
    for round_number in range(rounds):
        spans = make_spans(shape, count)
        order = names if round_number % 2 == 0 else names[::-1]
        took = {}
        for name in order:
            gc.collect()
            start = time.perf_counter()
            CONTENDERS[name](spans)
            took[name] = time.perf_counter() - start
            times[name].append(took[name] / count * 1e6)
        ratios.append(took[names[0]] / took[names[1]])
    return {
        "otlp": statistics.median(times[names[0]]),
        "spanpack": statistics.median(times[names[1]]),
        "ratio": statistics.median(ratios),
    }


def _driver(shape: str, contender: str, batches: int) -> None:
    """(Run under callgrind by --instructions.)"""
    spans = [make_spans(shape, 100) for _ in range(batches + 1)]
    encode = CONTENDERS.get(contender)
    gc.disable()
    if encode is not None:
        for batch in spans:  # the first is the warm-up
            encode(batch)


def _instructions(shape: str, contender: str, batches: int) -> int:
    import os
    import re
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="otel-callgrind-") as temp:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + temp + "/out", sys.executable, __file__,
             "--driver", shape, contender, str(batches)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True,
            env=dict(os.environ, PYTHONHASHSEED="0"),  # the same dict and set layouts in every run
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError("no instruction count from valgrind:\n" + done.stderr[-2000:])
    return int(found.group(1))


def instructions_table() -> None:
    names = list(CONTENDERS)
    print("| shape | OTLP instructions/span | spanpack instructions/span | OTLP / spanpack |")
    print("| --- | --- | --- | --- |")
    for shape in SHAPES:
        per_span = {}
        for contender in ["none"] + names:
            few, many = (_instructions(shape, contender, batches) for batches in (3, 13))
            per_span[contender] = (many - few) / (10 * 100)
        otlp, spanpack = (per_span[name] - per_span["none"] for name in names)
        print("| %s | %.0f | %.0f | %.1fx |" % (shape, otlp, spanpack, otlp / spanpack))


def main() -> None:
    import sys

    if sys.argv[1:2] == ["--driver"]:
        _driver(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--spans", type=int, default=100)
    parser.add_argument("--instructions", action="store_true", help="count instructions under callgrind")
    args = parser.parse_args()
    if args.instructions:
        instructions_table()
        return
    print("| shape | OTLP µs/span | spanpack µs/span | OTLP / spanpack |")
    print("| --- | --- | --- | --- |")
    for shape in SHAPES:
        result = compare(shape, args.spans, args.rounds)
        print("| %s | %.2f | %.2f | %.1fx |" % (shape, result["otlp"], result["spanpack"], result["ratio"]))


if __name__ == "__main__":
    main()
