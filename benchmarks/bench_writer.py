"""What AgentWriter costs the application, and how fast it delivers.

    pytest benchmarks/bench_writer.py --benchmark-only    # pytest-benchmark
    python benchmarks/bench_writer.py                      # no pytest: prints both tables

write cost     ``writer.write(trace)`` on the application thread next to
               ``encoder.encode_trace(trace)`` and ``encoder.put(trace)``
               alone, per trace, for a 1-span trace and a 51-span web request
               (slotted spans).  Rounds of 200 traces, the buffer emptied
               between rounds: at most ~2 MB buffered, as in a running writer
               (it flushes when the buffer holds half a payload, 2.5 MiB by
               default).  The writer's thread stays idle, so this is the
               caller's cost only.  Target: write <= encode_trace + 1 us.
               "(kept)" is encode_trace with its results kept for the
               round, as anything that buffers encoded traces keeps them:
               the plain loop reuses one freed block for every result,
               while a buffer (the writer's, or a list of parts) grows onto
               fresh memory and pays its page faults (about 1.3 per 27 KB
               v0.4 web trace).
throughput     1, 4 and 16 producer threads write web-request traces to the
               APM test agent (started here, as the tests do); spans per
               second until the producers return ("written") and until
               ``flush()`` reports everything delivered ("delivered"), next to
               one thread encoding the same traces with ``encode_traces``.
               The test agent decodes and checks every payload in Python,
               so "delivered" is bounded by it, not by the writer.  For v0.4
               and v0.5 the same producers also run through ddtrace 4.2.3's
               own AgentWriter (on ddtrace Spans of the same traces).
"""

import logging
import os
import sys
import threading
import time
import timeit

try:
    import pytest
except ImportError:  # script mode does not need pytest
    pytest = None

import spanpack
from spanpack import samples
from spanpack.writer import BUFFER_BYTES_SHARE

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.integration.agent import start_agent  # noqa: E402
from tests.integration.fault_server import FaultServer, refusing_url  # noqa: E402

BIG = 256 << 20
SHAPES = {"span_1": 0, "web_51": 50}
PRODUCERS = [1, 4, 16]
VERSIONS = ["v0.4", "v0.5", "v1.0"]
TRACES_PER_ROUND = 320  # of 51 spans: 16,320 spans a round


def _trace(children):
    return samples.as_slotted(samples.web_traces(1, children=children))[0]


class IdleWriter:
    """A writer whose thread never sends: its buffer is emptied by hand."""

    def __init__(self, version):
        self._refusing, url = refusing_url()
        # The encoder's bytes get 1/BUFFER_BYTES_SHARE of max_buffer_size: BIG here.
        self.writer = spanpack.AgentWriter(
            url, version=version, flush_interval=3600, max_buffer_size=BIG * BUFFER_BYTES_SHARE,
            max_payload_size=BIG,
        )
        self.writer._log_interval = self.writer._last_log = float("inf")  # emptying by hand counts "stopped"

    def empty(self):
        self.writer._take_buffer()  # (the writer's own thread stays idle meanwhile)

    def close(self):
        self.empty()
        logging.getLogger("spanpack.writer").disabled = True  # stop()'s summary of the emptied rounds
        try:
            self.writer.stop(timeout=0)
        finally:
            logging.getLogger("spanpack.writer").disabled = False
        self._refusing.close()


def _producers(writer, traces, threads, flush=None):
    """Spans/s until the producer threads return, and until ``flush(writer)``
    (default: ``writer.flush``) says everything was delivered."""
    per_thread = [traces[i::threads] for i in range(threads)]
    start = threading.Barrier(threads + 1)

    def produce(mine):
        start.wait(30)
        for trace in mine:
            writer.write(trace)

    workers = [threading.Thread(target=produce, args=(mine,)) for mine in per_thread]
    for worker in workers:
        worker.start()
    start.wait(30)
    began = time.perf_counter()
    for worker in workers:
        worker.join(120)
    written = time.perf_counter() - began
    if flush is None:
        assert writer.flush(timeout=120)
    else:
        flush(writer)
    delivered = time.perf_counter() - began
    return written, delivered


def _throughput_round(url, version, threads, traces):
    writer = spanpack.AgentWriter(url, version=version, flush_interval=0.2, max_buffer_size=BIG)
    try:
        written, delivered = _producers(writer, traces, threads)
        stats = writer.stats
    finally:
        writer.stop(timeout=10)
    assert stats["traces_dropped"] == 0, stats
    spans = samples.span_count(traces)
    return spans / written, spans / delivered


def _ddtrace_round(url, version, threads, traces):
    """The same producers through ddtrace 4.2.3's own AgentWriter (its spans)."""
    from ddtrace.internal.writer import AgentWriter as DdtraceAgentWriter

    writer = DdtraceAgentWriter(url, processing_interval=0.2, buffer_size=BIG, api_version=version,
                                report_metrics=False)
    try:
        written, delivered = _producers(writer, traces, threads, flush=lambda w: w.flush_queue())
    finally:
        writer.stop()
    spans = samples.span_count(traces)
    return spans / written, spans / delivered


# -- pytest-benchmark ------------------------------------------------------------

if pytest is not None:

    @pytest.fixture(scope="module")
    def agent():
        agent = start_agent()
        yield agent
        agent.stop()

    @pytest.mark.parametrize("version", VERSIONS)
    @pytest.mark.parametrize("shape", list(SHAPES))
    @pytest.mark.parametrize("how", ["encode_trace", "put", "write"])
    def test_write_cost(benchmark, version, shape, how):
        benchmark.group = "write cost %s %s" % (shape, version)
        trace = _trace(SHAPES[shape])
        idle = IdleWriter(version)
        encoder = idle.writer._new_encoder(version)  # the writer's limits, its own buffer
        calls = {"encode_trace": encoder.encode_trace, "put": encoder.put, "write": idle.writer.write}
        def empty():  # returns nothing: pytest-benchmark would take a result as arguments
            if how == "put":
                encoder.encode()
            else:
                idle.empty()

        call = calls[how]

        def round_of_200():  # pytest-benchmark allows one iteration per setup
            for _ in range(200):
                call(trace)

        benchmark.extra_info["traces_per_round"] = 200
        try:
            benchmark.pedantic(round_of_200, setup=empty, rounds=100, iterations=1)
            assert idle.writer.stats["traces_dropped"] == 0
        finally:
            idle.close()

    @pytest.fixture(scope="module")
    def sink():
        with FaultServer() as server:
            yield server

    @pytest.mark.parametrize("version", VERSIONS)
    @pytest.mark.parametrize("threads", PRODUCERS)
    @pytest.mark.parametrize("to", ["test_agent", "sink"])
    def test_throughput(benchmark, agent, sink, version, threads, to):
        benchmark.group = "throughput to the %s %s" % (to, version)
        traces = samples.as_slotted(samples.web_traces(TRACES_PER_ROUND))
        url = agent.base_url if to == "test_agent" else sink.url
        figures = []
        benchmark.pedantic(
            lambda: figures.append(_throughput_round(url, version, threads, traces)),
            rounds=3,
            iterations=1,
        )
        benchmark.extra_info["spans_per_s_written"] = max(f[0] for f in figures)
        benchmark.extra_info["spans_per_s_delivered"] = max(f[1] for f in figures)

    @pytest.mark.parametrize("version", VERSIONS)
    def test_throughput_encoder_alone(benchmark, version):
        benchmark.group = "throughput, encoder alone %s" % version
        traces = samples.as_slotted(samples.web_traces(TRACES_PER_ROUND))
        encoder = spanpack.TraceMsgPackEncoder(version, max_size=BIG)
        benchmark(encoder.encode_traces, traces)


# -- script mode ------------------------------------------------------------------


def _best_per_call(cases, arg, number=200, repeat=40):
    """Best time per call of each ``(fn, reset)`` case, the cases taking
    turns round by round (a load burst costs each a round, not one case all
    of its rounds).  ``reset`` empties what a round buffered, untimed, before
    and after it: a case that left megabytes buffered would otherwise change
    how the next case's buffer grows (fresh pages, page faults)."""
    best = [float("inf")] * len(cases)
    for _ in range(repeat):
        for i, (fn, reset) in enumerate(cases):
            reset()
            started = time.perf_counter()
            for _ in range(number):  # a plain loop: timeit would turn the GC off
                fn(arg)
            best[i] = min(best[i], (time.perf_counter() - started) / number)
            reset()
    return best


def main():
    print("write() cost per trace on the application thread (best of 40 interleaved rounds of 200 calls)")
    print("%-8s %-6s %14s %14s %10s %10s %18s %18s" % ("shape", "ver", "encode_trace", "(kept)", "put", "write",
                                                         "write-encode_trace", "write-(kept)"))
    for version in VERSIONS:
        for shape, children in SHAPES.items():
            trace = _trace(children)
            idle = IdleWriter(version)
            encoder = idle.writer._new_encoder(version)  # the writer's limits, its own buffer
            try:
                kept = []

                def encode_kept(trace, kept=kept, encoder=encoder):
                    kept.append(encoder.encode_trace(trace))

                encode, encode_kept_time, put, write = _best_per_call(
                    [(encoder.encode_trace, idle.empty), (encode_kept, kept.clear),
                     (encoder.put, encoder.encode), (idle.writer.write, idle.empty)],
                    trace,
                )
            finally:
                idle.close()
            print(
                "%-8s %-6s %11.2f us %11.2f us %7.2f us %7.2f us %15.2f us %15.2f us"
                % (shape, version, encode * 1e6, encode_kept_time * 1e6, put * 1e6, write * 1e6,
                   (write - encode) * 1e6, (write - encode_kept_time) * 1e6)
            )

    agent = start_agent()
    sink = FaultServer().start()
    try:
        traces = samples.as_slotted(samples.web_traces(TRACES_PER_ROUND))
        spans = samples.span_count(traces)
        print("\nspans/s (%d traces of 51 spans; best of 3): written = producers done," % TRACES_PER_ROUND)
        print("delivered = flush() done, to the APM test agent and to tests/integration/fault_server.py as a sink")
        print("%-6s %-22s %12s %16s %16s" % ("ver", "producers", "written", "delivered agent", "delivered sink"))
        for version in VERSIONS:
            encoder = spanpack.TraceMsgPackEncoder(version, max_size=BIG)
            alone = min(timeit.repeat(lambda: encoder.encode_traces(traces), number=1, repeat=5))
            print("%-6s %-22s %12.0f %16s %16s" % (version, "encode_traces alone", spans / alone, "-", "-"))
            for threads in PRODUCERS:
                to_agent = [_throughput_round(agent.base_url, version, threads, traces) for _ in range(3)]
                to_sink = [_throughput_round(sink.url, version, threads, traces) for _ in range(3)]
                print(
                    "%-6s %-22s %12.0f %16.0f %16.0f"
                    % (version, "%d thread%s" % (threads, "" if threads == 1 else "s"),
                       max(r[0] for r in to_agent + to_sink), max(r[1] for r in to_agent),
                       max(r[1] for r in to_sink))
                )
            if version == "v1.0" or not samples.ddtrace_available():
                continue  # ddtrace writes v0.4 and v0.5 only
            records = samples.web_traces(TRACES_PER_ROUND)
            for threads in PRODUCERS:
                # Fresh ddtrace Spans for every round: its writer may keep them.
                to_agent = [_ddtrace_round(agent.base_url, version, threads, samples.as_ddtrace(records))
                            for _ in range(3)]
                to_sink = [_ddtrace_round(sink.url, version, threads, samples.as_ddtrace(records))
                           for _ in range(3)]
                print(
                    "%-6s %-22s %12.0f %16.0f %16.0f"
                    % (version, "ddtrace writer, %d thr" % threads,
                       max(r[0] for r in to_agent + to_sink), max(r[1] for r in to_agent),
                       max(r[1] for r in to_sink))
                )
    finally:
        sink.close()
        agent.stop()


if __name__ == "__main__":
    main()
