"""Instructions per span under callgrind for the span classes users write.

    python benchmarks/callgrind_user_spans.py                 # every shape of spanpack.user_spans
    python benchmarks/callgrind_user_spans.py --shapes plain slots-core
    python benchmarks/callgrind_user_spans.py --reencode      # the same objects every call

One valgrind run: the driver (this file with --driver) calls ``encode_traces``
three times per shape and version, each call on traces built for it alone
(``spanpack.user_spans.traces``: 10 x 100 fresh spans, as a tracer encodes
them), or with ``--reencode`` on the same objects; collection is on only inside
the C entry point (``--toggle-collect=trace_encoder_encode_traces``) and a
dump is written after each call.  The last of the three calls (warm caches) is
reported, divided by the span count.  Counts include everything below the
entry point (CPython API calls, getters, malloc) but not the Python call
above it.  Instruction counts do not depend on the machine's load.
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

from callgrind_per_span import read_totals  # the script's folder is on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
CALLS = 3


def driver(order_path, names, reencode):
    import gc

    import spanpack
    from spanpack import user_spans

    order = []
    gc.disable()
    for name in names:
        again = user_spans.traces(name)
        for version in ("v0.4", "v0.5"):
            encoder = spanpack.TraceMsgPackEncoder(version)
            for _ in range(CALLS):
                traces = again if reencode else user_spans.traces(name)
                encoder.encode_traces(traces)
                order.append((name, version, sum(map(len, traces))))
                del traces
    with open(order_path, "w") as f:
        json.dump(order, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="*")
    parser.add_argument("--reencode", action="store_true", help="encode the same span objects every call")
    parser.add_argument("--driver", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        driver(args.driver[0], args.driver[1:], args.reencode)
        return 0
    from spanpack import user_spans

    names = args.shapes or list(user_spans.SHAPES)
    with tempfile.TemporaryDirectory() as tmp:
        order_path = os.path.join(tmp, "order.json")
        out = os.path.join(tmp, "callgrind.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--collect-atstart=no",
             "--toggle-collect=trace_encoder_encode_traces",
             "--dump-after=trace_encoder_encode_traces", "--callgrind-out-file=" + out,
             sys.executable, os.path.abspath(__file__)] + ["--reencode"] * args.reencode +
            ["--driver", order_path] + names,
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONMALLOC="malloc"),
        )
        with open(order_path) as f:
            order = json.load(f)
        dumps = sorted(glob.glob(out + ".*"), key=lambda p: int(re.findall(r"\.(\d+)$", p)[0]))
        if len(dumps) != len(order):
            raise SystemExit("expected %d dumps, found %d" % (len(order), len(dumps)))
        results = {}
        for (name, version, spans), path in zip(order, dumps):
            results[(name, version)] = read_totals(path) / spans  # the last call wins
    print("instructions per span (encode_traces, warm, callgrind, %s)"
          % ("the same objects every call" if args.reencode else "fresh spans every call"))
    print("%-24s %10s %10s" % ("shape", "v0.4", "v0.5"))
    for name in names:
        print("%-24s %10.0f %10.0f" % (name, results[(name, "v0.4")], results[(name, "v0.5")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
