"""spanpack against the newest ddtrace, whose Span is native (Rust), in its own venv.

    python benchmarks/native_ddtrace.py                    # create/reuse the venv, run, print the table
    python benchmarks/native_ddtrace.py --quick --shapes web many_tags
    python benchmarks/native_ddtrace.py --ddtrace-version 4.16.0 --recreate

The repository pins ddtrace 4.2.3 (pure-Python Span, `_meta`/`_metrics` dicts).
From 4.1x on, `ddtrace._trace.span.Span` subclasses the native
`ddtrace.internal.native._native.SpanData`: tags live in Rust and the
tracer's writer still encodes with the Cython `MsgpackEncoderV04/V05`
(`ddtrace.internal._encoding`, put() per finished trace, encode() at flush;
the NativeWriter then hands the bytes to libdatadog's exporter, which decodes
and re-encodes them on the way out, a transport cost left out here).

This script:

1. creates, if missing, a venv (default ``.benchmarks/venv-ddtrace-latest`` in
   the repository; ``.benchmarks/`` is git-ignored) with the latest ddtrace
   (or ``--ddtrace-version``) and msgpack, and installs spanpack from this
   repository into it (again whenever ext/ or python/spanpack changed);
2. runs itself inside that venv (``--worker``): builds each sample shape
   (``spanpack.samples``) as native ddtrace Spans (tags through
   ``_set_attributes``, origin on the root's context) and as spanpack
   SampleSpan objects with the same content; checks that ddtrace's payload
   decodes to the same data as spanpack's; then times
       ddtrace <latest> MsgpackEncoderV04/V05 put+encode on the native Spans
       spanpack encode_traces and put+encode on SampleSpan objects
   with ``spanpack.bench.measure`` (best of N rounds);
3. prints time per span and the ratio ddtrace / spanpack per shape and version.

It also reports what spanpack's ``fields="ddtrace"`` makes of the native
Spans, which have no ``_meta``/``_metrics`` dicts (the tags live in Rust).  Creating the
venv takes a few minutes (download, spanpack build); a run takes ~1-2 min.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_VENV = os.path.join(ROOT, ".benchmarks", "venv-ddtrace-latest")
MARKER = "spanpack-bench.json"
BIG = 256 << 20


# --------------------------------------------------------------------------------------------
# Venv management (runs in the calling interpreter)


def source_digest():
    """A hash of everything that goes into the spanpack build."""
    digest = hashlib.sha256()
    for top in ("ext", os.path.join("python", "spanpack")):
        for dirpath, _dirs, files in sorted(os.walk(os.path.join(ROOT, top))):
            for name in sorted(files):
                if name.endswith((".c", ".h", ".py", ".pyi")):
                    path = os.path.join(dirpath, name)
                    digest.update(os.path.relpath(path, ROOT).encode())
                    with open(path, "rb") as f:
                        digest.update(f.read())
    for name in ("setup.py", "pyproject.toml"):
        with open(os.path.join(ROOT, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def venv_python(venv):
    return os.path.join(venv, "bin", "python")


def sh(cmd, **kwargs):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, **kwargs)


def ensure_venv(venv, ddtrace_version, recreate):
    marker_path = os.path.join(venv, MARKER)
    marker = {}
    if recreate and os.path.isdir(venv):
        import shutil

        shutil.rmtree(venv)
    if not os.path.exists(venv_python(venv)):
        os.makedirs(os.path.dirname(venv), exist_ok=True)
        sh([sys.executable, "-m", "venv", venv])
    elif os.path.exists(marker_path):
        with open(marker_path) as f:
            marker = json.load(f)
    py = venv_python(venv)
    wanted = "ddtrace" + ("==" + ddtrace_version if ddtrace_version else "")
    if marker.get("ddtrace_request") != wanted:
        sh([py, "-m", "pip", "install", "-q", "--upgrade", wanted, "msgpack"])
        marker["ddtrace_request"] = wanted
    digest = source_digest()
    if marker.get("spanpack_digest") != digest:
        # A copy of the working tree, so uncommitted changes are measured too.
        sh([py, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", ROOT])
        marker["spanpack_digest"] = digest
    with open(marker_path, "w") as f:
        json.dump(marker, f)
    return py


# --------------------------------------------------------------------------------------------
# Worker (runs inside the venv)


def native_spans(records):
    """ddtrace Spans (native SpanData in new releases) with the records' content."""
    from ddtrace._trace.span import Span

    out = []
    for trace in records:
        spans = []
        for r in trace:
            span = Span(r["name"], service=r["service"], resource=r["resource"],
                        span_type=r["span_type"], trace_id=r["trace_id"], span_id=r["span_id"],
                        parent_id=r["parent_id"])
            span.resource = r["resource"]
            span.start_ns = r["start_ns"]
            span.duration_ns = r["duration_ns"]
            span.error = r["error"]
            if hasattr(span, "_set_attributes"):
                if r["meta"]:
                    span._set_attributes(dict(r["meta"]))
                if r["metrics"]:
                    span._set_attributes(dict(r["metrics"]))
            else:  # pure-Python Span (<= 4.2.x)
                span._meta = dict(r["meta"])
                span._metrics = dict(r["metrics"])
            if r.get("origin") is not None:
                span.context.dd_origin = r["origin"]
            spans.append(span)
        out.append(spans)
    return out


def worker(args):
    import ddtrace
    import spanpack
    from ddtrace.internal._encoding import MsgpackEncoderV04, MsgpackEncoderV05
    from spanpack import bench, samples

    budget = bench.QUICK_BUDGET if args.quick else bench.Budget(0.03, 15, 3, 0.8)
    native = hasattr(ddtrace._trace.span.Span, "_set_attributes")
    info = {
        "ddtrace": ddtrace.__version__,
        "native_span": native,
        "span_bases": [c.__module__ + "." + c.__name__ for c in ddtrace._trace.span.Span.__mro__[1:3]],
        "spanpack": spanpack.__file__,
    }
    rows = []
    for shape in args.shapes or samples.shape_names():
        records = samples.build(shape, args.quick)
        nspans = samples.span_count(records)
        slotted = samples.as_slotted(records)
        dd = native_spans(records)
        print("%s: %d spans" % (shape, nspans), file=sys.stderr, flush=True)
        for version, cls in (("v0.4", MsgpackEncoderV04), ("v0.5", MsgpackEncoderV05)):
            row = {"shape": shape, "version": version, "spans": nspans}
            sp = spanpack.TraceMsgPackEncoder(version, max_size=BIG)
            reference = sp.encode_traces(slotted)
            row["spanpack_bytes"] = len(reference)
            dd_enc = cls(BIG, BIG)

            def dd_run(enc=dd_enc, traces=dd):
                for trace in traces:
                    enc.put(trace)
                return enc.encode()[0][0]

            sp_put = spanpack.TraceMsgPackEncoder(version, max_size=BIG, max_item_size=BIG,
                                                  max_payload_size=BIG)

            def sp_put_run(enc=sp_put, traces=slotted):
                for trace in traces:
                    enc.put(trace)
                return enc.encode()[0][0]

            payload = dd_run()
            row["ddtrace_bytes"] = len(payload)
            row["check"] = bench.check(payload, reference, version,
                                       lambda: bench.decode(reference, version))
            try:
                direct = spanpack.TraceMsgPackEncoder(version, fields="ddtrace",
                                                      max_size=BIG).encode_traces(dd)
                row["spanpack_on_native_spans"] = bench.check(
                    direct, reference, version, lambda: bench.decode(reference, version))
            except Exception as exc:
                row["spanpack_on_native_spans"] = "%s: %s" % (type(exc).__name__, str(exc)[:70])
            timings = {
                "spanpack encode_traces": bench.measure(lambda: sp.encode_traces(slotted), budget),
                "spanpack put+encode": bench.measure(sp_put_run, budget),
            }
            if not row["check"].startswith("differs"):
                timings["ddtrace put+encode"] = bench.measure(dd_run, budget)
            for name, t in timings.items():
                row[name] = {"best": t.best, "median": t.median, "rounds": t.rounds}
            rows.append(row)
            print("  %s %s" % (version, ", ".join("%s %.0f ns/span" % (k, t.best / nspans * 1e9)
                                                  for k, t in timings.items())),
                  file=sys.stderr, flush=True)
    json.dump({"info": info, "rows": rows}, sys.stdout)


# --------------------------------------------------------------------------------------------
# Report


def report(result):
    info, rows = result["info"], result["rows"]
    print("ddtrace %s (native Span: %s; Span bases: %s) vs spanpack from this repository"
          % (info["ddtrace"], info["native_span"], ", ".join(info["span_bases"])))
    table = [["shape", "ver", "spans", "ddtrace put+encode", "spanpack put+encode",
              "spanpack encode_traces", "ddtrace / spanpack put", "ddtrace / encode_traces",
              "check"]]

    def ns(row, key):
        t = row.get(key)
        return "-" if t is None else "%.0f ns" % (t["best"] / row["spans"] * 1e9)

    def ratio(row, a, b):
        if row.get(a) is None or row.get(b) is None:
            return "-"
        return "%.2fx" % (row[a]["best"] / row[b]["best"])

    for row in rows:
        table.append([row["shape"], row["version"], "{:,}".format(row["spans"]),
                      ns(row, "ddtrace put+encode"), ns(row, "spanpack put+encode"),
                      ns(row, "spanpack encode_traces"),
                      ratio(row, "ddtrace put+encode", "spanpack put+encode"),
                      ratio(row, "ddtrace put+encode", "spanpack encode_traces"),
                      row["check"]])
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for n, r in enumerate(table):
        print("  ".join(c.rjust(w) if 2 <= i <= 7 else c.ljust(w)
                        for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print("times per span, best of N rounds; ddtrace on its native Spans, spanpack on "
          "SampleSpan slotted objects with the same content")
    print("spanpack fields=\"ddtrace\" straight on these native Spans, payload vs the reference:")
    for row in rows:
        print("  %-12s %s  %s" % (row["shape"], row["version"], row["spanpack_on_native_spans"]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--venv", default=DEFAULT_VENV)
    parser.add_argument("--ddtrace-version", default=None, help="default: the latest release")
    parser.add_argument("--recreate", action="store_true", help="rebuild the venv from scratch")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--shapes", nargs="+")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    py = ensure_venv(args.venv, args.ddtrace_version, args.recreate)
    cmd = [py, os.path.abspath(__file__), "--worker"]
    if args.quick:
        cmd.append("--quick")
    if args.shapes:
        cmd += ["--shapes"] + args.shapes
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    started = time.time()
    # Run from outside the repository so its python/ tree cannot shadow the installed spanpack.
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, env=env, cwd=os.path.dirname(args.venv),
                          text=True)
    if proc.returncode != 0:
        return proc.returncode
    result = json.loads(proc.stdout)
    print("worker: %.0f s" % (time.time() - started), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
