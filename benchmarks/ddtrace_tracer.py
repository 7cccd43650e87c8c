"""spanpack against ddtrace's own encoder on the spans ddtrace's tracer makes.

    python benchmarks/ddtrace_tracer.py [--rounds N] [--versions v0.4 v0.5]

Runs with whatever ddtrace is installed (CI's ddtrace matrix venvs, made by
scripts/ci_ddtrace.sh, have 4.3.2, 4.8.13, 4.9.7 and 4.16.0; the [bench] extra has
4.2.3).  For each shape of ``spanpack.ddtrace_shapes`` (one span; a web span
with 10 children; with 50 children of 40 tags; errors, links, events and
struct tags), on traces made fresh for every timed call and encoded once:
ddtrace's MsgpackEncoderV04/V05 put()+encode(), spanpack's put()+encode() and
encode_traces(), and the read floor (``readfloor.read_ddtrace_native``, C:
the accessors ddtrace's encoder calls, by the cheapest path, every entry
touched, nothing written; native spans only).  Prints ns per span, ddtrace's
time over spanpack's (best over best, and the median of the rounds' own
ratios, the contenders a round's turns apart, the first moving along), the share of spanpack's time above the floor, and
ddtrace's time over the floor: the ratio an encoder that cost nothing beyond
ddtrace's own accessors would reach, so the most any encoder reading these
spans can show.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import ddtrace  # noqa: E402

from readfloor.build import load as load_read_floor  # noqa: E402
from spanpack import ddtrace_shapes  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--versions", nargs="+", default=["v0.4", "v0.5"])
    args = parser.parse_args()
    floor = load_read_floor()
    native = not hasattr(ddtrace._trace.span.Span, "_meta")
    extra = None
    if floor is not None and native:
        extra = lambda version: {"read floor": lambda: floor.read_ddtrace_native}  # noqa: E731
    results = ddtrace_shapes.run(args.versions, args.rounds, extra,
                                 progress=lambda m: print(m, file=sys.stderr, flush=True))
    print("ddtrace %s, CPython %s; best of %d rounds, fresh spans each call;"
          " paired = the median of each round's ratio"
          % (ddtrace.__version__, sys.version.split()[0], args.rounds))
    print(ddtrace_shapes.report(results))
    if extra is not None:
        print()
        print("share of spanpack's time above the read floor (put+encode, encode_traces),"
              " and ddtrace's time over the floor (the ceiling of any ratio):")
        for r in results:
            shares = ["%.0f%%" % (100 * (1 - r.per_span["read floor"] / r.per_span[name]))
                      for name in ("spanpack put+encode", "spanpack encode_traces")]
            ceiling = r.per_span["ddtrace put+encode"] / r.per_span["read floor"]
            print("  %-34s %s  %s  ceiling %.2fx" % (r.shape + " " + r.version, *shares, ceiling))
    return 0


if __name__ == "__main__":
    sys.exit(main())
