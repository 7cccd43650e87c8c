"""The application thread's cost of a finished trace in ddtrace's writer, with
and without ``spanpack.ddtrace.install()``.

    /tmp/dd4.16.0/bin/python benchmarks/ddtrace_put_cost.py               # both, 5 rounds each
    /tmp/dd4.16.0/bin/python benchmarks/ddtrace_put_cost.py --traces 3000 --rounds 9

Runs with whichever ddtrace the interpreter has (spanpack importable, e.g.
PYTHONPATH=python after ``setup.py build_ext --inplace``).  Each round is a
fresh child process in one mode ("ddtrace" or "spanpack", alternating) that
traces web requests with ddtrace's tracer API (a web span and 10 database
children with the tags integrations set), each finished trace going through
ddtrace's span aggregator and trace processors to its real writer (its
NativeWriter by default).  Timed on the application thread, per trace:

* ``write``: the writer's ``write(spans)``, everything ddtrace's writer does
  on the application thread for a finished trace (its counters, the keep
  rate tag, ``encoder.put()``);
* ``put``: the encoder's ``put(spans)`` alone (the encoder is wrapped in a
  forwarding proxy for this, in both modes alike).

The writer's flush thread never runs (its interval is an hour): the
benchmark empties the encoder itself between batches, untimed, and sends
nothing (DD_TRACE_AGENT_URL points at a closed port).  Printed: the median
over rounds of each round's median and 90th percentile, in ns per trace.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD_ENV = {
    "DD_TRACE_AGENT_URL": "http://127.0.0.1:9",
    "DD_TRACE_WRITER_INTERVAL_SECONDS": "3600",
    "DD_REMOTE_CONFIGURATION_ENABLED": "false",
    "DD_INSTRUMENTATION_TELEMETRY_ENABLED": "false",
    "DD_TRACE_STATS_COMPUTATION_ENABLED": "false",
    "DD_TRACE_STARTUP_LOGS": "false",
    "DD_SERVICE": "bench-web",
}


def child(mode: str, traces: int, batch: int, version: str) -> None:
    from ddtrace.trace import tracer

    if mode == "spanpack":
        import spanpack.ddtrace

        assert spanpack.ddtrace.install(), "install() refused this ddtrace"
    writer = tracer._span_aggregator.writer
    client = writer._clients[0]
    put_times: list = []
    write_times: list = []
    clock = time.perf_counter_ns

    class TimedEncoder:
        """Forwards to the writer's encoder, timing put()."""

        def __init__(self, encoder) -> None:
            self.encoder = encoder

        def put(self, spans) -> None:
            start = clock()
            self.encoder.put(spans)
            put_times.append(clock() - start)

        def __len__(self) -> int:
            return len(self.encoder)

        def __getattr__(self, name):
            return getattr(self.encoder, name)

    client.encoder = TimedEncoder(client.encoder)
    unwrapped_write = writer.write

    def timed_write(spans=None) -> None:
        start = clock()
        unwrapped_write(spans)
        write_times.append(clock() - start)

    writer.write = timed_write

    def one_request(n: int) -> None:
        with tracer.trace("django.request", resource="GET /users/{id}", span_type="web") as root:
            root.set_tag("component", "django")
            root.set_tag("span.kind", "server")
            root.set_tag("http.method", "GET")
            root.set_tag("http.url", "http://example.com/users/%d" % n)
            root.set_tag("http.route", "/users/{id}")
            root.set_tag("http.useragent", "Mozilla/5.0 (X11; Linux x86_64) bench")
            root.set_tag("http.status_code", "200")
            for i in range(10):
                with tracer.trace("postgres.query", service="bench-db", span_type="sql",
                                  resource="SELECT id, name, email FROM users WHERE id = %s") as query:
                    query.set_tag("component", "psycopg")
                    query.set_tag("span.kind", "client")
                    query.set_tag("db.system", "postgresql")
                    query.set_tag("db.name", "users")
                    query.set_tag("out.host", "db.internal")
                    query.set_metric("network.destination.port", 5432)
                    query.set_metric("db.row_count", i)

    for n in range(traces):
        one_request(n)
        if (n + 1) % batch == 0:
            client.encoder.encoder.encode()  # what the flush thread would take, untimed
    client.encoder.encoder.encode()
    assert len(write_times) == traces and len(put_times) == traces, (len(write_times), len(put_times))
    encoder_name = type(client.encoder.encoder).__name__
    json.dump({"mode": mode, "encoder": encoder_name, "write": write_times, "put": put_times}, sys.stdout)


def percentile(values: list, fraction: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=2000, help="traces per round (default 2000)")
    parser.add_argument("--warmup", type=int, default=200, help="first traces of a round left out")
    parser.add_argument("--batch", type=int, default=100, help="traces between untimed flushes")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per mode (default 5)")
    parser.add_argument("--version", default="v0.5", choices=["v0.4", "v0.5"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.traces, args.batch, args.version)
        return

    import ddtrace

    env = dict(os.environ, DD_TRACE_API_VERSION=args.version, **CHILD_ENV)
    results: dict = {"ddtrace": {"write": [], "put": []}, "spanpack": {"write": [], "put": []}}
    encoders = {}
    for _ in range(args.rounds):
        for mode in ("ddtrace", "spanpack"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--traces", str(args.traces),
                 "--batch", str(args.batch), "--version", args.version],
                env=env, check=True, capture_output=True, text=True, timeout=600,
            ).stdout
            run = json.loads(out[out.index("{"):])
            encoders[mode] = run["encoder"]
            for what in ("write", "put"):
                times = run[what][args.warmup:]
                results[mode][what].append((statistics.median(times), percentile(times, 0.9)))

    print("ddtrace %s, %s, CPython %s: ns per finished trace (1 web span + 10 children) on the "
          "application thread, median over %d rounds of %d traces" % (
              ddtrace.__version__, args.version, ".".join(map(str, sys.version_info[:3])),
              args.rounds, args.traces - args.warmup))
    print("%-9s %-24s %10s %10s %10s %10s" % ("mode", "encoder", "write p50", "write p90", "put p50", "put p90"))
    for mode in ("ddtrace", "spanpack"):
        row = results[mode]
        cells = [statistics.median(r[i] for r in row[what]) for what in ("write", "put") for i in (0, 1)]
        print("%-9s %-24s %10.0f %10.0f %10.0f %10.0f" % ((mode, encoders[mode]) + tuple(cells)))
    for what in ("write", "put"):
        ours = statistics.median(r[0] for r in results["spanpack"][what])
        theirs = statistics.median(r[0] for r in results["ddtrace"][what])
        print("%s: ddtrace / spanpack = %.2fx (p50)" % (what, theirs / ours))


if __name__ == "__main__":
    main()
