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
    """The encoders, checked to agree on the payload, then the read floor (which writes nothing)."""
    found = user_spans.contenders(spans)
    user_spans.check(found)
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
    benchmark.group = "user class: " + shape
    benchmark.extra_info["spans"] = user_spans.SPANS
    benchmark(fns[contender])


ROUNDS = 21


def main() -> int:
    """Per-span times, best of ROUNDS rounds.

    The contenders of a shape take turns round by round, so a burst of load
    on a shared machine costs each of them a round, not one contender its
    whole measurement.
    """
    rows = []
    for shape, build in user_spans.SHAPES.items():
        spans = build()
        fns = contenders(spans)
        numbers = {}
        for name, fn in fns.items():
            fn()
            numbers[name] = max(1, int(0.01 / max(1e-7, timeit.timeit(fn, number=1))))
        times = {name: float("inf") for name in fns}
        for _ in range(ROUNDS):
            for name, fn in fns.items():
                elapsed = timeit.timeit(fn, number=numbers[name]) / numbers[name] / user_spans.SPANS
                times[name] = min(times[name], elapsed)
        rows.append((shape, times))
    names = [n for n in CONTENDERS if n in rows[0][1]]
    print("per span, best of %d interleaved rounds; ratio = contender / spanpack v0.4" % ROUNDS)
    print("%-24s" % "shape" + "".join("%24s" % n for n in names))
    for shape, times in rows:
        base = times["spanpack v0.4"]
        cells = ["%6.0f ns (%5.2fx)" % (times[n] * 1e9, times[n] / base) if n in times else "-" for n in names]
        print("%-24s" % shape + "".join("%24s" % c for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
