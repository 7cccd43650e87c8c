"""Instructions per span on several interpreters side by side, under callgrind.

    python benchmarks/callgrind_interpreters.py \\
        --python 3.11=/root/.pyenv/versions/3.11.7/bin/python3.11 \\
        --python 3.14=/usr/bin/python3.14 --python 3.15=/usr/bin/python3.15
    python benchmarks/callgrind_interpreters.py --python 3.14=python3.14 --python no-int=python3.14@int
    python benchmarks/callgrind_interpreters.py ... --entries encode_traces --shapes web no_tags

Issue 18's check: spanpack's instructions per span on 3.14 and 3.15 within
1.05x of 3.11's for every shape, input form and payload version, through both
entry points.  Each interpreter (LABEL=PATH; the first is the reference
column) builds the extension in place with the compiler on PATH (so give
interpreters that share one gcc and libc, e.g. all inside the dev chroot:
pyenv's and Debian's), then runs one valgrind run per entry point
(``trace_encoder_encode_traces``; ``trace_encoder_put`` and
``trace_encoder_encode``, added up as put+encode) and shape (the user classes
in one more), each executing this file's driver with that interpreter: in one
process for everything, what a row cost depended on the heap and caches that
the shapes measured before it left (whether realloc grew a buffer in place,
where the v0.4 cache's strings landed), by up to 9%.  The interpreter's own
allocator is used (pymalloc, as users run it; --pythonmalloc to change it).
The driver builds, from ``spanpack.samples`` (quick sizes, at most
--max-spans spans a shape), the spans as slotted
objects, plain-class instances, dataclasses, dicts and, where ddtrace
imports, ddtrace Spans (fields="ddtrace"), plus every class form of
``spanpack.user_spans`` (one trace of 1,000 spans), and makes each call
CALLS times; the last call (warm) is reported: the third, as the second
still admits each repeated v0.4 string to the encoder's cache (a string is
cached the second time it is seen), a one-time cost that made a one-span
shape's second call up to 5% dearer than every later one.  Even in a
process of its own, a row still depends on where the workloads and
spanpack's buffers land in the heap (whether realloc grows a payload in
place; which of the v0.4 cache's slots, picked by address, collide): the
same build measured 1.02 to 1.07 times 3.11 on one row as the modules
imported before it changed.  So each process runs --heap-shifts times
(default 3), each after a different amount of heap padding (heap_padding),
and each row is the median of those runs; the summary gives each column's
widest spread.  The interpreters' builds are
left in the tree (each its own ABI's file); the one built last for an ABI
wins.  --disable passes SPANPACK_DISABLE_FAST_PATHS to every interpreter, to
measure what each in-place reader saves (ARCHITECTURE.md's table).
"""

import argparse
import dataclasses
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile

from callgrind_per_span import callgrind_driver, fresh_rundir, trim  # the script's folder is on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CALLS = 3
BIG = 256 << 20
# (entry point name, toggled function, dumps per call: one, or one per trace)
RUNS = [
    ("encode_traces", "trace_encoder_encode_traces", "one"),
    ("put", "trace_encoder_put", "traces"),
    ("encode", "trace_encoder_encode", "one"),
]
ENTRY_OF_RUN = {"encode_traces": "encode_traces", "put": "put+encode", "encode": "put+encode"}
SAMPLE_FORMS = ["slotted", "plain", "dataclass", "dict", "ddtrace"]
VERSIONS = ["v0.4", "v0.5", "v1.0"]
# Issue 18's bound on each column's ratio to the first.
TARGET = 1.05


# --------------------------------------------------------------------------------------------
# Driver (runs under valgrind, with the interpreter being measured)


class PlainSpan:
    """A span class as users write it: attributes in the instance."""


def as_plain(records):
    out = []
    for trace in records:
        spans = []
        for record in trace:
            span = PlainSpan()
            for key, value in record.items():
                setattr(span, key, dict(value) if isinstance(value, dict) else value)
            spans.append(span)
        out.append(spans)
    return out


def as_dataclasses(records, fields):
    cls = dataclasses.make_dataclass("DataSpan", list(fields))
    return [[cls(**{name: (dict(r[name]) if isinstance(r.get(name), dict) else r.get(name))
                    for name in fields}) for r in trace] for trace in records]


def workloads(spec):
    """(shape, form, traces, fields) for every measurement, in a fixed order."""
    from spanpack import samples, user_spans

    out = []
    built = {}
    if spec.get("records"):
        with open(spec["records"], "rb") as f:
            built = pickle.load(f)
    for shape in spec["shapes"]:
        records = built.get(shape) or trim(samples.build(shape, quick=True), spec["max_spans"])
        for form in SAMPLE_FORMS:
            if form == "slotted":
                traces = samples.as_slotted(records)
            elif form == "plain":
                traces = as_plain(samples.as_dicts(records))
            elif form == "dataclass":
                traces = as_dataclasses(samples.as_dicts(records), samples.FIELDS)
            elif form == "dict":
                traces = samples.as_dicts(records)
            elif samples.ddtrace_available():
                traces = samples.as_ddtrace(records)
            else:
                continue
            out.append((shape, form, traces, "ddtrace" if form == "ddtrace" else None))
    if spec["user_spans"]:
        for name in user_spans.SHAPES:
            out.append(("user_spans", name, [user_spans.SHAPES[name]()], None))
    return out


def heap_padding(shift):
    """Objects kept alive before the workloads are built, so that heap shift
    k lays the workloads and spanpack's buffers out differently: small
    objects and str (pymalloc's pools) and buffers above pymalloc's limit
    (the C allocator's heap, where the payloads grow)."""
    return ([object() for _ in range(331 * shift)], ["pad-%d" % i for i in range(997 * shift)],
            [bytes(600 + 37 * i) for i in range(23 * shift)])


def driver(spec_path):
    import gc

    import spanpack

    with open(spec_path) as f:
        spec = json.load(f)
    plan = []
    padding = heap_padding(spec["heap_shift"])  # noqa: F841 (kept alive)
    work = workloads(spec)
    gc.collect()
    gc.disable()
    for shape, form, traces, fields in work:
        spans = sum(len(t) for t in traces)
        for version in spec["versions"]:
            encoder = spanpack.TraceMsgPackEncoder(version, fields=fields, max_size=BIG,
                                                   max_item_size=BIG, max_payload_size=BIG)
            for _ in range(CALLS):
                if spec["run"] == "encode_traces":
                    encoder.encode_traces(traces)
                else:
                    for trace in traces:
                        encoder.put(trace)
                    encoder.encode()
            plan.append([shape, form, version, spans, len(traces)])
    with open(spec["plan"], "w") as f:
        json.dump({"plan": plan, "fast_paths": list(spanpack._spanpack._fast_paths)}, f)


# --------------------------------------------------------------------------------------------
# Runner


def build_in_place(python, progress):
    with tempfile.TemporaryDirectory(prefix="spanpack-build-") as temp:
        cmd = [python, "setup.py", "-q", "build_ext", "--inplace", "--force", "--build-temp", temp]
        progress("+ " + " ".join(cmd))
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("build failed with %s:\n%s" % (python, proc.stderr[-3000:]))
    return len(re.findall(r"warning:", proc.stderr))


def valgrind_run(args, python, disable, run, shapes, user_spans, heap_shift, workdir, progress):
    """{(shape, form, version): (spans, Ir of the last call)} for one entry
    point, in one process: `shapes`, then (`user_spans`) the user classes,
    built after heap_padding(heap_shift)."""
    name, function, kind = run
    rundir = os.path.join(workdir, "%s-%s-%d" % (name, "-".join(shapes) or "user_spans", heap_shift))
    fresh_rundir(rundir)
    spec = {"shapes": shapes, "versions": args.versions, "max_spans": args.max_spans,
            "records": args.records,
            "user_spans": user_spans, "run": name, "heap_shift": heap_shift,
            "plan": os.path.join(rundir, "plan.json")}
    # One hash seed for every column: str hashes place strings in spanpack's
    # caches and tables (and CPython's dicts), and a random seed per run
    # moved a row by up to 5% between runs of the same build.
    env = dict(os.environ, PYTHONHASHSEED="0")
    if args.pythonmalloc:
        env["PYTHONMALLOC"] = args.pythonmalloc
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"), HERE])
    if disable:
        env["SPANPACK_DISABLE_FAST_PATHS"] = disable
    driven, counts = callgrind_driver(args, python, __file__, rundir, function, spec, env, name, progress)
    out, position = {}, 0
    for shape, form, version, spans, ntraces in driven["plan"]:
        per_call = ntraces if kind == "traces" else 1
        last = 0
        for _ in range(CALLS):
            last = sum(counts[position:position + per_call])
            position += per_call
        out[(shape, form, version)] = (spans, last)
    if position != len(counts):
        raise RuntimeError("%s: expected %d callgrind dumps, found %d" % (name, position, len(counts)))
    return out, driven["fast_paths"]


def measure(args, python, disable, progress):
    """{(shape, form, version, entry): Ir per span, the median over the heap
    shifts}, {same key: [Ir per span at each shift]}, fast paths, build
    warnings."""
    warnings = None if args.no_build else build_in_place(python, progress)
    shifts, fast_paths = {}, None
    with tempfile.TemporaryDirectory(prefix="spanpack-callgrind-") as workdir:
        for run in RUNS:
            if ENTRY_OF_RUN[run[0]] not in args.entries:
                continue
            # One process per shape, and one for the user classes (see the
            # module docstring: heap history moved rows by up to 9%).
            groups = [([shape], False) for shape in args.shapes]
            if not args.no_user_spans:
                groups.append(([], True))
            for shapes, user_spans in groups:
                for shift in range(args.heap_shifts):
                    counts, fast_paths = valgrind_run(args, python, disable, run, shapes, user_spans,
                                                      shift, workdir, progress)
                    for (shape, form, version), (spans, ir) in counts.items():
                        key = (shape, form, version, ENTRY_OF_RUN[run[0]])
                        shifts.setdefault(key, [0.0] * args.heap_shifts)[shift] += ir / spans
    results = {key: statistics.median(values) for key, values in shifts.items()}
    return results, shifts, fast_paths, warnings


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    parser.add_argument("--python", action="append", metavar="LABEL=PATH[@DISABLED]",
                        help="an interpreter to measure (repeat; the first is the reference); "
                        "@DISABLED: its SPANPACK_DISABLE_FAST_PATHS")
    parser.add_argument("--shapes", nargs="+", default=None)
    parser.add_argument("--versions", nargs="+", choices=VERSIONS, default=VERSIONS)
    parser.add_argument("--entries", nargs="+", choices=["encode_traces", "put+encode"],
                        default=["encode_traces", "put+encode"])
    parser.add_argument("--max-spans", type=int, default=1000,
                        help="trim every samples shape to at most this many spans (default 1000)")
    parser.add_argument("--no-user-spans", action="store_true",
                        help="leave out the spanpack.user_spans class forms")
    parser.add_argument("--disable", default="",
                        help="SPANPACK_DISABLE_FAST_PATHS for every interpreter (dict,instance,int)")
    parser.add_argument("--no-build", action="store_true",
                        help="use the extensions already built in the tree (e.g. while another "
                        "run uses them: rebuilding rewrites a loaded file)")
    parser.add_argument("--pythonmalloc", default="",
                        help="PYTHONMALLOC for every interpreter (default: unset, the allocator "
                        "users run: pymalloc for small objects)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="measure nothing: print the table of earlier --json files (their "
                        "columns in this order), e.g. one run per interpreter made in parallel")
    parser.add_argument("--heap-shifts", type=int, default=3,
                        help="run each process this many times, each after a different amount of "
                        "heap padding, and report each row's median (default 3; see the docstring)")
    parser.add_argument("--valgrind", default="valgrind")
    args = parser.parse_args(argv)
    if args.driver:
        driver(args.driver)
        return 0
    if args.merge:
        columns, table, spreads = [], {}, {}
        for path in args.merge:
            with open(path) as f:
                for label, results in json.load(f).items():
                    rows = {tuple(k.split("/")): v for k, v in results.items()}
                    if label.startswith("_shifts "):
                        spreads[label[len("_shifts "):]] = rows
                        continue
                    columns.append(label)
                    table[label] = rows
        args.shapes = args.shapes or sorted({k[0] for r in table.values() for k in r})
        print_table(columns, table, args.shapes, [], spreads)
        return 0
    if not args.python:
        parser.error("give at least one --python LABEL=PATH")
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from spanpack import samples

    args.shapes = args.shapes or samples.shape_names()
    # The records are built once, here: under valgrind, building the shapes
    # (random text for every tag) would take most of each run.
    records_file = tempfile.NamedTemporaryFile(prefix="spanpack-records-", suffix=".pickle")
    pickle.dump({shape: trim(samples.build(shape, quick=True), args.max_spans) for shape in args.shapes},
                records_file, protocol=4)
    records_file.flush()
    args.records = records_file.name

    def progress(message):
        print(message, file=sys.stderr, flush=True)

    columns, table, notes, spreads = [], {}, [], {}
    for item in args.python:
        label, _, python = item.partition("=")
        python, _, disable = python.partition("@")
        progress("== %s (%s)" % (label, python))
        try:
            results, by_shift, fast_paths, warnings = measure(args, python, disable or args.disable,
                                                              progress)
        except RuntimeError as exc:
            progress(str(exc))
            return 1
        columns.append(label)
        table[label] = results
        spreads[label] = by_shift
        notes.append("%s: fast paths %s%s" % (
            label, ",".join(fast_paths) or "none",
            "" if warnings is None else ", %d compiler warnings" % warnings))
    if args.json:
        with open(args.json, "w") as f:
            out = {label: {"/".join(k): v for k, v in results.items()} for label, results in table.items()}
            # Each row at every heap shift, for the spread (not a column).
            out.update({"_shifts " + label: {"/".join(k): v for k, v in by_shift.items()}
                        for label, by_shift in spreads.items()})
            json.dump(out, f, indent=1)

    print_table(columns, table, args.shapes, notes, spreads)
    return 0


def print_table(columns, table, shapes, notes, spreads=None):
    """The markdown table: Ir/span per column, then each column over the first."""
    reference = columns[0]
    keys = sorted({k for results in table.values() for k in results},
                  key=lambda k: (k[0] == "user_spans", shapes.index(k[0]) if k[0] in shapes
                                 else 0, k[1], k[3], k[2]))
    header = ["shape", "form", "entry", "ver"] + ["%s Ir/span" % c for c in columns] + \
        ["%s / %s" % (c, reference) for c in columns[1:]]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(" --- " for _ in header) + "|")
    worst = {c: (0.0, None) for c in columns[1:]}
    for key in keys:
        shape, form, version, entry = key
        base = table[reference].get(key)
        cells = [shape, form, entry, version]
        cells += ["{:,.0f}".format(table[c][key]) if key in table[c] else "-" for c in columns]
        for c in columns[1:]:
            if base and key in table[c]:
                ratio = table[c][key] / base
                cells.append("%.3f" % ratio)
                if ratio > worst[c][0]:
                    worst[c] = (ratio, key)
            else:
                cells.append("-")
        print("| " + " | ".join(cells) + " |")
    print()
    for c in columns[1:]:
        ratio, key = worst[c]
        if key is not None:
            above = sum(1 for k in keys if table[reference].get(k) and k in table[c]
                        and table[c][k] / table[reference][k] > TARGET)
            rows = sum(1 for k in keys if table[reference].get(k) and k in table[c])
            print("- %s: highest ratio to %s %.3f (%s); %d of %d rows above %.2f"
                  % (c, reference, ratio, " ".join(key), above, rows, TARGET))
    for label, by_shift in (spreads or {}).items():
        spread = {k: max(v) / min(v) - 1 for k, v in by_shift.items() if len(v) > 1 and min(v) > 0}
        if spread:
            key = max(spread, key=spread.get)
            print("- %s: a row's Ir/span over the %d heap shifts differs by up to %.1f%% (%s)"
                  % (label, len(by_shift[key]), 100 * spread[key], " ".join(key)))
    for note in notes:
        print("- " + note)
    print()
    print_summary(columns, table, keys)


def print_summary(columns, table, keys):
    """Per input form, entry point and version: the reference column's range
    over the shapes and each other column's highest ratio to it."""
    reference = columns[0]
    groups = {}
    for key in keys:
        shape, form, version, entry = key
        if shape != "user_spans":
            groups.setdefault((form, entry, version), []).append(key)
    header = ["form", "entry", "ver", "%s Ir/span (range over shapes)" % reference] + \
        ["%s / %s (max)" % (c, reference) for c in columns[1:]]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(" --- " for _ in header) + "|")
    for (form, entry, version), members in groups.items():
        base = [table[reference][k] for k in members if table[reference].get(k)]
        if not base:
            continue
        cells = [form, entry, version, "{:,.0f}-{:,.0f}".format(min(base), max(base))]
        for c in columns[1:]:
            ratios = [table[c][k] / table[reference][k] for k in members
                      if table[reference].get(k) and k in table[c]]
            cells.append("%.3f" % max(ratios) if ratios else "-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
