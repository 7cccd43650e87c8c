"""Does spanpack's time per span stay flat from 10 to 100,000 spans?

    pytest benchmarks/bench_scaling.py --benchmark-only      # pytest-benchmark, one group per layout
    python benchmarks/bench_scaling.py [--quick]              # no pytest: prints a table

Spans are web-request spans (spanpack.samples.web_traces: ~10 tags, 4 metrics
each) as slotted objects, in two layouts:

    traces_of_50   N spans as N/50 traces of 50 spans (one trace of N below 50)
    one_trace      one trace of N spans

Engines: spanpack ``encode_traces`` (v0.4 and v0.5) and, as yardsticks for
what any encoder pays at that size (fresh output memory, cache misses),
msgpack.packb on prebuilt v0.4 span dicts and a copy of the final v0.4 payload
(``bytes(bytearray(payload))``).  The table prints ns per span and its ratio
to the 1,000-span figure: a spanpack ratio far above msgpack's at the large
end points at super-linear work of its own (buffer growth copies, string
table or intern cache), a high ratio at the small end at per-call overhead.
"""

import argparse
import functools
import sys

try:
    import pytest
except ImportError:  # script mode does not need pytest
    pytest = None

import spanpack
from spanpack import bench, samples

SIZES = [10, 100, 1_000, 10_000, 100_000]
LAYOUTS = ["traces_of_50", "one_trace"]
VERSIONS = ["v0.4", "v0.5"]
ENGINES = ["spanpack v0.4", "spanpack v0.5", "msgpack.packb v0.4 (prebuilt dicts)",
           "floor v0.4 (payload copy)"]
BIG = bench.BIG


@functools.lru_cache(maxsize=4)
def traces_for(n, layout):
    if layout == "one_trace" or n < 50:
        records = samples.web_traces(1, children=n - 1)
    else:
        records = samples.web_traces(n // 50, children=49)
    traces = samples.as_slotted(records)
    assert samples.span_count(traces) == n
    return traces


def encoder(version):
    return spanpack.TraceMsgPackEncoder(version, max_size=BIG)


@functools.lru_cache(maxsize=2)
def v04_maps(n, layout):
    return bench.v04_maps(traces_for(n, layout))


def engine_callable(engine, n, layout):
    """(zero-argument callable returning the payload, None) or (None, reason to skip)."""
    traces = traces_for(n, layout)
    if engine.startswith("spanpack"):
        enc = encoder(engine.split()[1])
        return functools.partial(enc.encode_traces, traces), None
    if engine.startswith("msgpack"):
        if not bench.available("msgpack"):
            return None, "msgpack is not installed"
        import msgpack

        return functools.partial(msgpack.packb, v04_maps(n, layout)), None
    payload = encoder("v0.4").encode_traces(traces)
    return (lambda: bytes(bytearray(payload))), None


if pytest is not None:

    @pytest.mark.parametrize("engine", ENGINES)
    @pytest.mark.parametrize("n", SIZES)
    @pytest.mark.parametrize("layout", LAYOUTS)
    def test_scaling(benchmark, layout, n, engine):
        fn, reason = engine_callable(engine, n, layout)
        if fn is None:
            pytest.skip(reason)
        payload = fn()
        if engine.startswith("msgpack"):
            assert payload == encoder("v0.4").encode_traces(traces_for(n, layout))
        benchmark.group = "scaling %s %s" % (layout, engine)
        benchmark.extra_info.update(layout=layout, spans=n, engine=engine,
                                    payload_bytes=len(payload))
        del payload
        benchmark(fn)
        if benchmark.stats:
            stats = benchmark.stats.stats
            benchmark.extra_info["ns_per_span_min"] = round(stats.min / n * 1e9, 1)
            benchmark.extra_info["ns_per_span_median"] = round(stats.median / n * 1e9, 1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing rounds")
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=LAYOUTS)
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=ENGINES)
    args = parser.parse_args(argv)
    budget = bench.QUICK_BUDGET if args.quick else bench.Budget(0.03, 25, 5, 1.0)

    rows = [["layout", "engine", "spans", "payload bytes", "ns/span best", "ns/span median",
             "best / best@1000"]]
    for layout in args.layouts:
        for engine in args.engines:
            found = {}
            for n in SIZES:
                fn, reason = engine_callable(engine, n, layout)
                if fn is None:
                    print("%s: skipped (%s)" % (engine, reason), file=sys.stderr)
                    break
                size = len(fn())
                t = bench.measure(fn, budget)
                found[n] = (size, t)
                print("%s %s %7d spans: %.1f ns/span" % (layout, engine, n, t.best / n * 1e9),
                      file=sys.stderr, flush=True)
            if not found:
                continue
            base = found[1000][1].best / 1000
            for n in SIZES:
                size, t = found[n]
                rows.append([layout, engine, "{:,}".format(n), "{:,}".format(size),
                             "%.1f" % (t.best / n * 1e9), "%.1f" % (t.median / n * 1e9),
                             "%.2f" % (t.best / n / base)])
            rows.append([""] * len(rows[0]))
    print(bench.table(rows[:-1], right={2, 3, 4, 5, 6}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
