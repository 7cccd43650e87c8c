"""Instructions per trace and per span of ``put(trace)`` next to ``encode_trace(trace)``.

    python benchmarks/callgrind_put.py                          # v0.5, every shape
    python benchmarks/callgrind_put.py --versions v0.4 v0.5 --shapes web plain

Issue 14's target: put() on the application thread costs no more than
encoding the trace.  Two valgrind runs (one toggled entry point each:
``trace_encoder_put``, ``trace_encoder_encode_trace``) execute the same
driver, which for every shape and version makes CALLS calls on each trace.
The shapes are ``spanpack.samples`` (quick sizes; "web" as 8 different
request traces, as a writer sees them) and ``spanpack.user_spans`` (one trace
of 1,000 spans each).  put() goes to one encoder whose buffer is emptied
(encode(), not measured) only between shapes, so after the first call most
of a trace's strings are already in the payload's table, as in a running
writer.  "first" is the first call on each trace, "steady" the mean of the
others.  Counts include everything below the entry point (allocation, the
EncodedTrace object of encode_trace) and not the Python call above it.
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
ROOT = os.path.dirname(HERE)
CALLS = 4
RUNS = [("put", "trace_encoder_put"), ("encode_trace", "trace_encoder_encode_trace")]
SAMPLE_SHAPES = ["web", "span_1", "no_tags", "one_tag", "many_tags", "origin", "keys_per_span",
                 "float_metrics", "int_metrics"]


def build(shape):
    from spanpack import samples, user_spans

    if shape == "web":
        return samples.as_slotted(samples.web_traces(8))
    if shape in samples.SHAPES:
        return samples.as_slotted(samples.build(shape, quick=True))
    return [user_spans.SHAPES[shape]()]


def driver(spec_path):
    import gc

    import spanpack

    with open(spec_path) as f:
        spec = json.load(f)
    big = 256 << 20
    plan = []
    gc.collect()
    gc.disable()
    for shape in spec["shapes"]:
        traces = build(shape)
        for version in spec["versions"]:
            encoder = spanpack.TraceMsgPackEncoder(version, max_size=big, max_item_size=big,
                                                   max_payload_size=big)
            for call in range(CALLS):
                for trace in traces:
                    if spec["method"] == "put":
                        encoder.put(trace)
                    else:
                        encoder.encode_trace(trace)
                    plan.append([shape, version, len(trace), call])
            encoder.encode()
    with open(spec["plan"], "w") as f:
        json.dump(plan, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+")
    parser.add_argument("--versions", nargs="+", default=["v0.5"], choices=["v0.4", "v0.5", "v1.0"])
    parser.add_argument("--valgrind", default="valgrind")
    parser.add_argument("--keep", help="keep the callgrind files in this directory")
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        driver(args.driver)
        return 0
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from spanpack import user_spans

    shapes = args.shapes or SAMPLE_SHAPES + list(user_spans.SHAPES)
    workdir = args.keep or tempfile.mkdtemp(prefix="spanpack-put-")
    results = {}  # (shape, version, method) -> ([first Ir...], [steady Ir...], spans per trace)
    for method, function in RUNS:
        rundir = os.path.join(workdir, method)
        os.makedirs(rundir, exist_ok=True)
        for old in glob.glob(os.path.join(rundir, "callgrind.out*")):
            os.unlink(old)
        spec = {"shapes": shapes, "versions": args.versions, "method": method,
                "plan": os.path.join(rundir, "plan.json")}
        spec_path = os.path.join(rundir, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(ROOT, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        cmd = [args.valgrind, "--tool=callgrind", "--collect-atstart=no",
               "--callgrind-out-file=" + os.path.join(rundir, "callgrind.out"),
               "--toggle-collect=" + function, "--dump-after=" + function,
               os.path.realpath(sys.executable), os.path.abspath(__file__), "--driver", spec_path]
        print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        with open(spec["plan"]) as f:
            plan = json.load(f)
        dumps = sorted((p for p in glob.glob(os.path.join(rundir, "callgrind.out.*"))
                        if re.search(r"\.\d+$", p)), key=lambda p: int(p.rsplit(".", 1)[1]))
        if len(dumps) != len(plan):
            print("%s: %d dumps for %d calls" % (method, len(dumps), len(plan)), file=sys.stderr)
            return 1
        for (shape, version, spans, call), path in zip(plan, dumps):
            entry = results.setdefault((shape, version, method), ([], [], []))
            entry[0 if call == 0 else 1].append(read_totals(path))
            entry[2].append(spans)
    rows = [["shape", "ver", "spans/trace", "put first", "put steady", "encode_trace steady",
             "put - encode_trace", "put/span", "encode_trace/span"]]
    for shape in shapes:
        for version in args.versions:
            put = results[(shape, version, "put")]
            enc = results[(shape, version, "encode_trace")]
            spans = sum(put[2]) / len(put[2])
            put_first = sum(put[0]) / len(put[0])
            put_steady = sum(put[1]) / len(put[1])
            enc_steady = sum(enc[1]) / len(enc[1])
            rows.append([shape, version, "%.0f" % spans, "{:,.0f}".format(put_first),
                         "{:,.0f}".format(put_steady), "{:,.0f}".format(enc_steady),
                         "{:+,.0f}".format(put_steady - enc_steady),
                         "{:,.0f}".format(put_steady / spans), "{:,.0f}".format(enc_steady / spans)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print("Ir per trace (first call on each trace, mean of the later calls); per span: steady")
    return 0


if __name__ == "__main__":
    sys.exit(main())
