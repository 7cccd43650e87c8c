"""Span classes a tracer author writes, encoded as a tracer encodes them.

    pytest benchmarks/bench_user_spans.py --benchmark-only --benchmark-group-by=group
    python benchmarks/bench_user_spans.py            # a table: per-span times, ratios, floors

The shapes and contenders are ``spanpack.user_spans`` (also in ``python -m
spanpack bench``): every timed call encodes 10 traces x 100 spans made for it
alone (new objects, per-span resource, URL and host), built outside the
timing; msgspec encodes Structs built from them beforehand.  The re-encoding
case (spanpack v0.4 on the same objects every call) is a column of its own,
labelled so.

Two floors (``benchmarks/readfloor``, a C helper built for the benchmarks
only) bound spanpack from below:

- read floor: every field read the cheapest way spanpack could (slot
  offsets, an instance's values array, a dict's entries and an int's digits
  in place, through spanpack's own proven readers; a property through the
  attribute lookup), every text's UTF-8 data, every tag entry; nothing written;
- write floor: the same v0.4 bytes as spanpack's (checked byte for byte)
  written from values extracted into C arrays beforehand (no CPython call per
  field).

spanpack's time over each floor, per shape, is what its reading and writing
cost above the least any encoder of these objects must spend.  No test
asserts anything about timings.
"""

import os
import sys

import pytest

from spanpack import bench, user_spans

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readfloor.build import load as load_read_floor  # noqa: E402

READ_FLOOR = load_read_floor()
REENCODED = bench.REENCODED
CONTENDERS = ["spanpack v0.4", "spanpack v0.5", "msgpack.packb(to_dict)", "msgspec Structs", REENCODED,
              "read floor", "write floor"]


def contenders():
    """The encoders of user_spans, then the floors (when the helper built)."""
    found = dict(user_spans.contenders())
    if READ_FLOOR is not None:
        found["read floor"] = user_spans.Contender(lambda traces: traces, READ_FLOOR.read_cheapest)
        found["write floor"] = user_spans.Contender(READ_FLOOR.extract, READ_FLOOR.write_v04)
    return found


def checked(shape):
    """The contenders, checked on a set of the shape's traces: the encoders
    decode to spanpack's spans, the write floor gives spanpack's bytes."""
    found = contenders()
    traces = user_spans.traces(shape)
    encoders = {name: c for name, c in found.items() if "floor" not in name}
    user_spans.check(encoders, traces)
    if "write floor" in found:
        floor = found["write floor"]
        if floor.encode(floor.prepare(traces)) != found["spanpack v0.4"].encode(traces):
            raise AssertionError("the write floor's bytes are not spanpack's (%s)" % shape)
    return found


@pytest.mark.parametrize("shape", list(user_spans.SHAPES))
@pytest.mark.parametrize("contender", CONTENDERS)
def test_user_span_class(benchmark, shape, contender):
    fns = checked(shape)
    if contender == REENCODED:
        traces = user_spans.traces(shape)
        encode = fns["spanpack v0.4"].encode
        benchmark.group = "user class: " + shape
        benchmark(encode, traces)
        return
    if contender not in fns:
        pytest.skip("%s is not available" % contender)
    chosen = fns[contender]
    benchmark.group = "user class: " + shape
    benchmark.extra_info["spans"] = user_spans.SPANS
    benchmark.pedantic(chosen.encode, setup=lambda: ((chosen.prepare(user_spans.traces(shape)),), {}),
                       rounds=200)


ROUNDS = 25


def measure(shape):
    """Seconds per span of each contender on `shape`, best of ROUNDS rounds
    taking turns (a burst of load on a shared machine costs each a round)."""
    fns = checked(shape)
    budget = bench.Budget(round_time=0.02, max_rounds=ROUNDS, min_rounds=ROUNDS, max_time=0.0)
    calls = [(lambda c=c: c.prepare(user_spans.traces(shape)), c.encode) for c in fns.values()]
    again = user_spans.traces(shape)
    encode_again = fns["spanpack v0.4"].encode
    calls.append((lambda: again, encode_again))
    timings = bench.measure_fresh(calls, budget)
    return {name: t for name, t in zip([*fns, REENCODED], timings)}


def main() -> int:
    timed = [(shape, measure(shape)) for shape in user_spans.SHAPES]
    rows = [(shape, {name: t.best / user_spans.SPANS for name, t in timings.items()}) for shape, timings in timed]
    names = [n for n in CONTENDERS if n in rows[0][1]]
    print("fresh spans (10 traces x 100 spans built before each call), per span, best of %d interleaved "
          "rounds; ratio = contender / spanpack v0.4 (best over best; paired: the median of the "
          "rounds' own ratios, the rounds of one pass side by side)" % ROUNDS)
    print("%-22s" % "shape" + "".join("%23s" % n for n in names))
    for shape, times in rows:
        base = times["spanpack v0.4"]
        cells = ["%6.0f ns (%5.2fx)" % (times[n] * 1e9, times[n] / base) if n in times else "-" for n in names]
        print("%-22s" % shape + "".join("%23s" % c for c in cells))
    print()
    print("| shape | spanpack v0.4 | msgspec / spanpack | paired | spanpack / read floor | spanpack / write floor |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (shape, times), (_, timings) in zip(rows, timed):
        base = times["spanpack v0.4"]
        cells = ["%.0f ns" % (base * 1e9)]
        cells += ["%.2f" % (times["msgspec Structs"] / base),
                  "%.2f" % bench.paired_ratio(timings["msgspec Structs"], timings["spanpack v0.4"])
                  ] if "msgspec Structs" in times else ["-", "-"]
        cells += ["%.2f (%.0f ns)" % (base / times[n], times[n] * 1e9) if n in times else "-"
                  for n in ("read floor", "write floor")]
        print("| %s | %s |" % (shape, " | ".join(cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
