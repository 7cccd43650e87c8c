"""Span classes a tracer author writes, not only spanpack's samples.

    pytest benchmarks/bench_user_spans.py --benchmark-only --benchmark-group-by=group
    python benchmarks/bench_user_spans.py            # a table: per-span times and ratios

The shapes and contenders are ``spanpack.user_spans`` (also in ``python -m
spanpack bench``); this adds the read floor (``benchmarks/readfloor``, a C
helper built for the benchmarks only): every field spanpack reads, through
the C API's generic attribute lookup, and every tag's key and value, with
nothing written -- the cost no encoder of these objects avoids.

No test asserts anything about timings.
"""

import os
import sys
import timeit

import pytest

from spanpack import user_spans

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readfloor.build import load as load_read_floor  # noqa: E402

READ_FLOOR = load_read_floor()
CONTENDERS = ["spanpack v0.4", "spanpack v0.5", "msgpack.packb(to_dict)", "msgspec Structs", "read floor"]


def contenders(spans):
    found = user_spans.contenders(spans)
    if READ_FLOOR is not None:
        found["read floor"] = lambda: READ_FLOOR.read_traces([spans], user_spans.ALL)
    return found


@pytest.mark.parametrize("shape", list(user_spans.SHAPES))
@pytest.mark.parametrize("contender", CONTENDERS)
def test_user_span_class(benchmark, shape, contender):
    spans = user_spans.SHAPES[shape]()
    fns = contenders(spans)
    if contender not in fns:
        pytest.skip("%s is not available" % contender)
    user_spans.check(fns)
    benchmark.group = "user class: " + shape
    benchmark.extra_info["spans"] = user_spans.SPANS
    benchmark(fns[contender])


def main() -> int:
    rows = []
    for shape, build in user_spans.SHAPES.items():
        spans = build()
        fns = contenders(spans)
        user_spans.check(fns)
        times = {}
        for name, fn in fns.items():
            fn()
            number = max(1, int(0.02 / max(1e-7, timeit.timeit(fn, number=1))))
            times[name] = min(timeit.repeat(fn, number=number, repeat=7)) / number / user_spans.SPANS
        rows.append((shape, times))
    names = [n for n in CONTENDERS if n in rows[0][1]]
    print("per span, best of 7 rounds; ratio = contender / spanpack v0.4")
    print("%-24s" % "shape" + "".join("%24s" % n for n in names))
    for shape, times in rows:
        base = times["spanpack v0.4"]
        cells = ["%6.0f ns (%5.2fx)" % (times[n] * 1e9, times[n] / base) if n in times else "-" for n in names]
        print("%-24s" % shape + "".join("%24s" % c for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
