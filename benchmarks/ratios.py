"""Run the packer benchmarks and print msgpack time / spanpack time per input.

    python benchmarks/ratios.py                    # run benchmarks/bench_packer.py, then report
    python benchmarks/ratios.py -- -k spans        # extra arguments after -- go to pytest
    python benchmarks/ratios.py --json run.json    # report on an existing --benchmark-json file
    python benchmarks/ratios.py --stat min         # compare minimums instead of medians

A ratio above 1 means spanpack is faster (msgpack takes that many times as long).
Two ratios per input: the module-level packb() functions against each other,
and reused Packer().pack against each other.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from spanpack.bench import fmt_time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PAIRS = [
    ("packb", "spanpack.packb", "msgpack.packb"),
    ("Packer.pack", "spanpack.Packer.pack", "msgpack.Packer.pack"),
]


def run_benchmarks(json_path, pytest_args):
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        os.path.join(HERE, "bench_packer.py"),
        "--benchmark-only",
        "--benchmark-json=" + json_path,
        "-q",
    ] + pytest_args
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.call(cmd, cwd=ROOT)


def load(json_path, stat):
    """{case: {contender: seconds}} from a pytest-benchmark JSON file."""
    with open(json_path, encoding="utf-8") as f:
        data = json.load(f)
    table = {}
    for bench in data.get("benchmarks", []):
        params = bench.get("params") or {}
        extra = bench.get("extra_info") or {}
        case = params.get("case") or extra.get("case") or bench.get("group")
        contender = params.get("contender") or extra.get("contender")
        if case is None or contender is None:
            continue
        table.setdefault(case, {})[contender] = bench["stats"][stat]
    return table


def report(table, stat):
    header = ["input"]
    for label, sp, mp in PAIRS:
        header += [sp, mp, "ratio " + label]
    rows = []
    for case in table:
        row = [case]
        for _label, sp, mp in PAIRS:
            t_sp, t_mp = table[case].get(sp), table[case].get(mp)
            ratio = "%.2fx" % (t_mp / t_sp) if t_sp and t_mp else "-"
            row += [fmt_time(t_sp), fmt_time(t_mp), ratio]
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    print("%s time per call; ratio = msgpack / spanpack (above 1: spanpack faster)" % stat)
    for n, row in enumerate([header] + rows):
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--json", help="read this pytest-benchmark JSON file instead of running")
    parser.add_argument("--stat", default="median", choices=["min", "median", "mean"])
    parser.add_argument("--save", help="keep the JSON of the run at this path")
    parser.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    args = parser.parse_args(argv)

    if args.json:
        table = load(args.json, args.stat)
    else:
        fd, json_path = tempfile.mkstemp(prefix="spanpack-bench-", suffix=".json")
        os.close(fd)
        try:
            rc = run_benchmarks(os.path.abspath(args.save or json_path), args.pytest_args)
            if rc != 0:
                print("pytest exited with status %d" % rc, file=sys.stderr)
                return rc
            table = load(os.path.abspath(args.save or json_path), args.stat)
        finally:
            os.unlink(json_path)
    if not table:
        print("no packer benchmarks in the results", file=sys.stderr)
        return 1
    report(table, args.stat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
