"""Instructions per span under callgrind for the span classes users write.

    python benchmarks/callgrind_user_spans.py                 # every shape of spanpack.user_spans
    python benchmarks/callgrind_user_spans.py --shapes plain slots-core

One valgrind run: the driver (this file with --driver) builds each shape of
``spanpack.user_spans.SHAPES`` (one trace of 1,000 spans) and calls
``encode_traces`` on it three times per version; collection is on only inside
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


def driver(order_path, names):
    import gc

    import spanpack
    from spanpack import user_spans

    order = []
    gc.disable()
    for name in names:
        trace = [user_spans.SHAPES[name]()]
        for version in ("v0.4", "v0.5"):
            encoder = spanpack.TraceMsgPackEncoder(version)
            for _ in range(CALLS):
                encoder.encode_traces(trace)
                order.append((name, version, len(trace[0])))
    with open(order_path, "w") as f:
        json.dump(order, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="*")
    parser.add_argument("--driver", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        driver(args.driver[0], args.driver[1:])
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
             sys.executable, os.path.abspath(__file__), "--driver", order_path] + names,
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
    print("instructions per span (encode_traces, warm, callgrind)")
    print("%-24s %10s %10s" % ("shape", "v0.4", "v0.5"))
    for name in names:
        print("%-24s %10.0f %10.0f" % (name, results[(name, "v0.4")], results[(name, "v0.5")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
