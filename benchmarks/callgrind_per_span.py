"""Instructions per span under callgrind: a timing-free measure for a noisy machine.

    python benchmarks/callgrind_per_span.py                       # all shapes, v0.4 + v0.5, slotted objects
    python benchmarks/callgrind_per_span.py --shapes web no_tags --repeat 5
    python benchmarks/callgrind_per_span.py --versions v0.5 v1.0     # v1.0 against v0.5
    python benchmarks/callgrind_per_span.py --ddtrace             # + ddtrace spans, spanpack put+encode
                                                                  #   and ddtrace's own encoder on them
    python benchmarks/callgrind_per_span.py --max-spans 2000      # trim every shape to 2000 spans

How: one valgrind run executes a small driver (this file with --driver) that
builds the samples (spanpack.samples; many_traces at its quick size, 10 x 1000)
and then makes the measured calls.  Collection is on only inside the C entry
points (``--collect-atstart=no --toggle-collect=<fn>``):

    spanpack   trace_encoder_encode_traces; trace_encoder_put + trace_encoder_encode
               (the METH_O/NOARGS functions of the method table, so never inlined)
    ddtrace    its Cython wrappers __pyx_pw_...MsgpackEncoder..._put and ..._encode
               (looked up with nm in the installed _encoding module)

and callgrind dumps the counters after every exit from it (``--dump-after``),
so each dump file is one call.  Each valgrind run toggles a single function
(with several --toggle-collect patterns callgrind 3.19 left some calls
uncollected), so --ddtrace means seven runs.  The driver writes down
which dumps belong to which measurement; this script adds them up.  The first
call of each measurement is reported apart ("first", cold caches: spanpack's
string cache, buffer growth); "steady" is the mean of the other calls.  The
garbage collector is disabled in the driver, so no collection lands inside a
measured call.  Counts include everything executed below the entry point
(CPython API calls, malloc, memcpy) but not the Python call overhead above it.
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# One valgrind run per entry point: callgrind misbehaves when several
# --toggle-collect patterns are given (some calls are then not collected), so
# every run toggles exactly one function and the driver repeats only the
# calls that involve it.  (run name, driver group, function, dumps per call)
SPANPACK_RUNS = [
    ("spanpack encode_traces", "encode_traces", "trace_encoder_encode_traces", "one"),
    ("spanpack put", "spanpack put+encode", "trace_encoder_put", "traces"),
    ("spanpack encode", "spanpack put+encode", "trace_encoder_encode", "one"),
]


# --------------------------------------------------------------------------------------------
# Driver (runs under valgrind)


def trim(records, max_spans):
    if not max_spans:
        return records
    out, total = [], 0
    for trace in records:
        if total >= max_spans:
            break
        take = trace[: max_spans - total]
        out.append(take)
        total += len(take)
    return out


def put_encode(encoder, traces):
    def run():
        for trace in traces:
            encoder.put(trace)
        return encoder.encode()

    return run


def driver(spec_path):
    """Build the samples, then make the calls of spec["group"], spec["repeat"] times each."""
    import gc

    import spanpack
    from spanpack import samples

    with open(spec_path) as f:
        spec = json.load(f)
    group = spec["group"]
    big = 256 << 20
    work = []  # (measurement key, spans, traces, fn)
    for shape in spec["shapes"]:
        records = trim(samples.build(shape, quick=True), spec["max_spans"])
        spans, ntraces = samples.span_count(records), len(records)
        forms = {}
        if group == "encode_traces":
            forms["slotted"] = samples.as_slotted(records)
        if spec["ddtrace"]:
            forms["ddtrace"] = samples.as_ddtrace(records)
        for version in spec["versions"]:
            if group == "encode_traces":
                for form, traces in forms.items():
                    fields = "ddtrace" if form == "ddtrace" else None
                    enc = spanpack.TraceMsgPackEncoder(version, fields=fields, max_size=big)
                    work.append(([shape, version, "spanpack encode_traces", form], spans, ntraces,
                                 lambda enc=enc, traces=traces: enc.encode_traces(traces)))
            elif group == "spanpack put+encode":
                enc = spanpack.TraceMsgPackEncoder(version, fields="ddtrace", max_size=big,
                                                   max_item_size=big, max_payload_size=big)
                work.append(([shape, version, group, "ddtrace"], spans, ntraces,
                             put_encode(enc, forms["ddtrace"])))
            elif group == "ddtrace put+encode":
                from ddtrace.internal._encoding import MsgpackEncoderV04, MsgpackEncoderV05

                cls = MsgpackEncoderV04 if version == "v0.4" else MsgpackEncoderV05
                work.append(([shape, version, group, "ddtrace"], spans, ntraces,
                             put_encode(cls(big, big), forms["ddtrace"])))
    plan = []
    gc.collect()
    gc.disable()
    for key, spans, ntraces, fn in work:
        for _ in range(spec["repeat"]):
            fn()
        plan.append([key, spans, ntraces, spec["repeat"]])
    with open(spec["plan"], "w") as f:
        json.dump(plan, f)


# --------------------------------------------------------------------------------------------
# Runner


def ddtrace_runs():
    """Runs for ddtrace's encoder: its Cython put/encode wrappers, found with nm.

    A class's own wrapper serves that class; the MsgpackEncoderBase wrapper
    serves the versions without an override (4.2.3: V04 puts through Base,
    V05 has its own put; both encode through Base).
    """
    try:
        import ddtrace.internal._encoding as encoding
    except ImportError:
        return []
    out = subprocess.run(["nm", encoding.__file__], capture_output=True, text=True).stdout
    found = {}  # (owner, method) -> symbol
    for line in out.splitlines():
        name = line.split()[-1] if line.split() else ""
        match = re.fullmatch(r"__pyx_pw_\w*?\d+MsgpackEncoder(Base|V04|V05)_\d+(put|encode)", name)
        if match:
            found[(match.group(1), match.group(2))] = name
    runs = []
    for method in ("put", "encode"):
        kind = "traces" if method == "put" else "one"
        for version, owner in (("v0.4", "V04"), ("v0.5", "V05")):
            symbol = found.get((owner, method)) or found.get(("Base", method))
            if symbol is None:
                return []
            runs.append(("ddtrace %s %s" % (version, method), "ddtrace put+encode", symbol, kind,
                         version))
    return runs


def read_totals(path):
    """The instruction count (first event) of one callgrind dump file (the
    other callgrind scripts use it too)."""
    with open(path) as f:
        for line in f:
            if line.startswith(("totals:", "summary:")):
                return int(line.split()[1])
    raise ValueError("no totals in %s" % path)


def dump_index(path):
    match = re.search(r"\.(\d+)$", path)
    return int(match.group(1)) if match else 0


def fresh_rundir(rundir):
    """Make ``rundir``, or empty it of an earlier run's callgrind files."""
    os.makedirs(rundir, exist_ok=True)
    for old in glob.glob(os.path.join(rundir, "callgrind.out*")):
        os.unlink(old)


def callgrind_driver(args, python, script, rundir, function, spec, env, name, progress):
    """Run ``python script --driver SPEC`` under callgrind, collecting only
    inside ``function`` and dumping after each exit from it (the other
    callgrind scripts use it too).  Returns what the driver wrote to
    spec["plan"] and the instruction count of every dump, in order."""
    spec_path = os.path.join(rundir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    cmd = [args.valgrind, "--tool=callgrind", "--collect-atstart=no",
           "--callgrind-out-file=" + os.path.join(rundir, "callgrind.out"),
           "--toggle-collect=" + function, "--dump-after=" + function,
           python, os.path.abspath(script), "--driver", spec_path]
    progress("+ " + " ".join(cmd))
    started = time.time()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError("valgrind failed:\n" + proc.stderr[-3000:])
    progress("  %s: %.0f s" % (name, time.time() - started))
    with open(spec["plan"]) as f:
        plan = json.load(f)
    dumps = sorted((p for p in glob.glob(os.path.join(rundir, "callgrind.out.*"))
                    if re.search(r"\.\d+$", p)), key=dump_index)
    return plan, [read_totals(p) for p in dumps]


def valgrind_run(args, workdir, run, spec, progress):
    """Run the driver for one entry point; {measurement key: [Ir per call]}."""
    name, group, function, kind = run[:4]
    if len(run) > 4:  # a run for one payload version only
        spec = dict(spec, versions=[v for v in spec["versions"] if v == run[4]])
        if not spec["versions"]:
            return {}
    rundir = os.path.join(workdir, re.sub(r"\W+", "_", name))
    fresh_rundir(rundir)
    spec = dict(spec, group=group, plan=os.path.join(rundir, "plan.json"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    plan, counts = callgrind_driver(args, os.path.realpath(sys.executable), __file__, rundir, function,
                                    spec, env, name, progress)
    per_call = {"one": lambda ntraces: 1, "traces": lambda ntraces: ntraces}[kind]
    expected = sum(per_call(ntraces) * calls for _key, _spans, ntraces, calls in plan)
    if len(counts) != expected:
        raise RuntimeError("%s: expected %d callgrind dumps, found %d"
                           % (name, expected, len(counts)))
    out, position = {}, 0
    for key, spans, ntraces, calls in plan:
        totals = []
        for _ in range(calls):
            n = per_call(ntraces)
            totals.append(sum(counts[position:position + n]))
            position += n
        out[tuple(key)] = (spans, totals)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    parser.add_argument("--shapes", nargs="+", default=None)
    parser.add_argument("--versions", nargs="+", choices=["v0.4", "v0.5", "v1.0"], default=["v0.4", "v0.5"])
    parser.add_argument("--repeat", type=int, default=3, help="calls per measurement (default 3)")
    parser.add_argument("--max-spans", type=int, default=0,
                        help="trim every shape to at most this many spans")
    parser.add_argument("--ddtrace", action="store_true",
                        help="also ddtrace Spans: spanpack on them, and ddtrace's encoder")
    parser.add_argument("--keep", help="keep the callgrind files in this directory")
    parser.add_argument("--valgrind", default="valgrind")
    args = parser.parse_args(argv)

    if args.driver:
        driver(args.driver)
        return 0

    sys.path.insert(0, os.path.join(ROOT, "python"))
    from spanpack import samples

    def progress(message):
        print(message, file=sys.stderr, flush=True)

    if shutil.which(args.valgrind) is None:
        progress("valgrind not found")
        return 1
    shapes = args.shapes or samples.shape_names()
    for shape in shapes:
        if shape not in samples.SHAPES:
            parser.error("unknown shape %r (known: %s)" % (shape, ", ".join(samples.SHAPES)))
    runs = [SPANPACK_RUNS[0]]
    if args.ddtrace:
        extra = ddtrace_runs()
        if not extra:
            progress("ddtrace (or its encoder symbols) not found; --ddtrace ignored")
            args.ddtrace = False
        else:
            runs += SPANPACK_RUNS[1:] + extra

    workdir = args.keep or tempfile.mkdtemp(prefix="spanpack-callgrind-")
    os.makedirs(workdir, exist_ok=True)
    spec = {"shapes": shapes, "versions": args.versions, "repeat": max(1, args.repeat),
            "max_spans": args.max_spans, "ddtrace": args.ddtrace}
    measurements = {}  # key -> (spans, [Ir per call], summed over the runs)
    try:
        for run in runs:
            for key, (spans, totals) in valgrind_run(args, workdir, run, spec, progress).items():
                if key in measurements:
                    previous = measurements[key][1]
                    totals = [a + b for a, b in zip(previous, totals)]
                measurements[key] = (spans, totals)
    except RuntimeError as exc:
        progress(str(exc))
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    order = {"spanpack encode_traces": 0, "spanpack put+encode": 1, "ddtrace put+encode": 2}
    keys = sorted(measurements, key=lambda k: (shapes.index(k[0]), k[1], order[k[2]], k[3] != "slotted"))
    base = {}
    for key in keys:
        spans, totals = measurements[key]
        rest = totals[1:] or totals
        if key[2] == "spanpack encode_traces" and key[3] == "slotted":
            base[key[:2]] = sum(rest) / len(rest) / spans
    rows = [["shape", "ver", "engine", "spans from", "spans", "first call Ir/span",
             "steady Ir/span", "vs spanpack"]]
    previous = None
    for key in keys:
        shape, version, engine, form = key
        spans, totals = measurements[key]
        first = totals[0] / spans
        rest = totals[1:] or totals
        steady = sum(rest) / len(rest) / spans
        if previous is not None and shape != previous:
            rows.append([""] * len(rows[0]))
        previous = shape
        ref = base.get((shape, version))
        rows.append([shape, version, engine, form, "{:,}".format(spans), "{:,.0f}".format(first),
                     "{:,.0f}".format(steady), "%.2fx" % (steady / ref) if ref else "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {4, 5, 6, 7}
    for n, row in enumerate(rows):
        print("  ".join(c.rjust(w) if i in right else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print("Ir/span = instructions executed inside the entry point(s) per span (first call, and "
          "the mean of the later calls); vs spanpack = steady Ir / spanpack encode_traces on "
          "slotted objects")
    return 0


if __name__ == "__main__":
    sys.exit(main())
