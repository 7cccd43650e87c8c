"""The closing table of .ci/run: pytest's counts for every run of the matrix,
and the overall counts as the last line (in pytest's own summary form, which
is what CI reads).

    python scripts/ci_summary.py RUNS_DIR WALL_SECONDS NAME [NAME ...]

For each NAME, RUNS_DIR/NAME.log is the run's output, NAME.rc its exit
status, NAME.seconds its wall time, NAME.python the interpreter it ran
(optional).  A run that exited non-zero without a failure pytest counted
(pip failed, pytest crashed, no summary) counts as one failure.  Exits 1 if
any run failed.
"""

import os
import re
import sys

# "==== 3 failed, 1200 passed, 30 skipped, 2 errors in 301.22s (0:05:01) ===="
SUMMARY = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+) in [\d.]+s(?: \([^)]*\))?\s*=*$")
COLUMNS = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed")


def _read(path, default=""):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except FileNotFoundError:
        return default


def pytest_counts(log):
    """The counts of the last pytest summary line in `log`, or None."""
    found = None
    for line in log.splitlines():
        match = SUMMARY.match(line.strip())
        if match:
            found = match.group(1)
    if found is None:
        return None
    counts = dict.fromkeys(COLUMNS, 0)
    for number, word in re.findall(r"(\d+) ([a-z]+)", found):
        word = {"error": "errors", "warning": "warnings"}.get(word, word)
        if word in counts:
            counts[word] += int(number)
    return counts


def main(argv):
    runs_dir, wall, names = argv[0], float(argv[1]), argv[2:]
    totals = dict.fromkeys(COLUMNS, 0)
    seconds_total = 0.0
    any_failed = False
    rows = []
    for name in names:
        base = os.path.join(runs_dir, name)
        log = _read(base + ".log")
        rc = _read(base + ".rc", "not run")
        seconds = float(_read(base + ".seconds", "0") or 0)
        seconds_total += seconds
        python = _read(base + ".python", "")
        warnings = _read(base + ".warnings", "-")
        counts = pytest_counts(log)
        note = ""
        if counts is None:
            counts = dict.fromkeys(COLUMNS, 0)
            note = "no pytest summary"
        failed = counts["failed"] + counts["errors"]
        if rc != "0" and failed == 0:
            counts["failed"] += 1
            note = note or "exit status %s" % rc
            note = "%s; counted as 1 failure" % note
        failed_run = rc != "0" or counts["failed"] + counts["errors"] > 0
        any_failed = any_failed or failed_run
        for key in COLUMNS:
            totals[key] += counts[key]
        rows.append((name, python, counts, warnings, seconds, failed_run, note))

    print()
    print("CI matrix: pytest counts per run")
    header = "%-8s %-26s %7s %6s %6s %7s %7s %8s %6s  %s" % (
        "run", "interpreter", "passed", "failed", "errors", "skipped", "xfailed", "warnings", "time", "status")
    print(header)
    print("-" * len(header))
    for name, python, counts, warnings, seconds, failed_run, note in rows:
        status = ("FAILED" if failed_run else "ok") + (" (%s)" % note if note else "")
        print("%-8s %-26s %7d %6d %6d %7d %7d %8s %5.0fs  %s" % (
            name, python[:26], counts["passed"], counts["failed"], counts["errors"], counts["skipped"],
            counts["xfailed"], warnings, seconds, status))
    print("(warnings: the compiler's warnings about ext/ in that run's build; time: the run's wall time,"
          " build included)")
    failed = totals["failed"] + totals["errors"]
    print("%d runs took %.0f s in all; .ci/run's wall time: %.0f s" % (len(rows), seconds_total, wall))
    print("=" * 20 + " %d passed, %d failed, %d skipped in %.2fs " % (
        totals["passed"], failed, totals["skipped"], wall) + "=" * 20)
    return 1 if any_failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
