#!/usr/bin/env bash
# Run scripts/valgrind_driver.py under valgrind memcheck and fail on memory
# errors or definitely-lost blocks in spanpack's C code.
#
#   scripts/valgrind_check.sh            # builds a -O0 -g copy in a temp dir first
#   SPANPACK_VALGRIND_BUILD=0 scripts/valgrind_check.sh   # use the importable spanpack
#   PYTHON=~/.pyenv/versions/3.13.0/bin/python scripts/valgrind_check.sh
#
# Runs on CPython 3.9-3.13 (measured on a shared 2-core machine: 23-37 s each,
# of which the build is about 15 s).  The build needs only pip in the
# interpreter: pip fetches setuptools into an isolated build environment.
#
# Environment:
#   PYTHON                     interpreter (default: python3)
#   SPANPACK_VALGRIND_BUILD    1 (default): build a wheel with SPANPACK_DEBUG=1
#                              from a temporary copy and import it from there
#                              (the repo's build/ and in-place .so are left
#                              alone); 0: import spanpack as installed
#   SPANPACK_VALGRIND_ROUNDS   rounds of the driver (default 3)
#   VALGRIND_LOG               where to keep valgrind's log (default: a temp file)
#
# Exit status: 0 clean; 1 an invalid read/write/free, use of uninitialised
# memory, or a definitely-lost block whose stack mentions _spanpack (or one of
# the ext/ sources); 2 the driver itself failed; 3 setup problem.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
python=${PYTHON:-python3}
# The real binary, not a wrapper script (pyenv's shims are bash scripts, and
# valgrind would watch bash).
python=$("$python" -c 'import sys; print(sys.executable)')

if ! command -v valgrind >/dev/null; then
    echo "valgrind not found (apt-get install valgrind)" >&2
    exit 3
fi

work=$(mktemp -d /tmp/spanpack-valgrind.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=${VALGRIND_LOG:-$work/valgrind.log}

if [ "${SPANPACK_VALGRIND_BUILD:-1}" = 1 ]; then
    mkdir -p "$work/src"
    cp -r "$root/ext" "$root/python" "$root/setup.py" "$root/pyproject.toml" "$work/src/"
    [ -f "$root/README.md" ] && cp "$root/README.md" "$work/src/"
    rm -f "$work/src/python/spanpack/"_spanpack*.so
    echo "building a -O0 -g wheel of spanpack in $work"
    # pip builds in an isolated environment with the setuptools pyproject.toml
    # asks for, so this works where the interpreter has no setuptools (venvs
    # of Python 3.12 and later) or an older one; SPANPACK_DEBUG reaches setup.py.
    (cd "$work/src" && SPANPACK_DEBUG=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
        "$python" -m pip wheel --no-deps --wheel-dir "$work/dist" . \
        >"$work/build.log" 2>&1) || { cat "$work/build.log" >&2; exit 3; }
    "$python" -m zipfile -e "$work"/dist/spanpack-*.whl "$work/site"
    export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$python" -c 'import spanpack._spanpack as m; print("spanpack from", m.__file__)'

# CPython's own noise is filtered, not suppressed: CPython 3.11 reports ~800
# "uninitialised value" errors from longobject.c's maybe_small_long (and the
# Py_INCREFs of small ints that follow) during ordinary imports, and the
# interpreter leaks a little at exit.  A suppression cannot say "and no
# spanpack frame on the stack", so instead every record is kept and the
# filter below fails only on records with a spanpack frame.  What is
# suppressed is listed, with the reason, in the .supp files next to this
# script; 3.12 and later add the immortal interned strings.
supp=(--suppressions="$here/valgrind-cpython.supp")
if "$python" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
    supp+=(--suppressions="$here/valgrind-cpython312.supp")
fi

echo "running the driver under valgrind (measured: 10-25 s, after a 15 s build)"
set +e
PYTHONMALLOC=malloc valgrind --tool=memcheck --leak-check=full \
    --errors-for-leak-kinds=definite --show-leak-kinds=definite \
    --num-callers=50 --track-origins=yes "${supp[@]}" \
    --log-file="$log" "$python" "$here/valgrind_driver.py"
status=$?
set -e
if [ "$status" -ne 0 ]; then
    echo "driver exited with status $status; valgrind log: $log" >&2
    tail -40 "$log" >&2
    [ -n "${VALGRIND_LOG:-}" ] || cp "$log" /tmp/spanpack-valgrind-last.log
    exit 2
fi

# Split the log into records and keep those about spanpack.
"$python" - "$log" <<'EOF'
import re
import sys

log = open(sys.argv[1]).read()
lines = [re.sub(r"^==\d+== ?", "", line) for line in log.splitlines()]
records, current = [], []
for line in lines:
    if line.strip() == "":
        if current:
            records.append(current)
        current = []
    else:
        current.append(line)
if current:
    records.append(current)
# --track-origins puts a value's origin after a blank line: part of the record.
for i in range(len(records) - 1, 0, -1):
    if records[i][0].strip().startswith("Uninitialised value was created"):
        records[i - 1] += records.pop(i)

ERROR = re.compile(r"^(Invalid (read|write|free)|Mismatched free|Use of uninitialised|"
                   r"Conditional jump or move depends|Syscall param .* uninitialised|"
                   r"Source and destination overlap|.* definitely lost in)")
OURS = re.compile(r"_spanpack|\b(packer|payload|span_v04|span_v05|spanwrite|spanfields|"
                  r"intern|outbuf|trace_encoder|module)\.[ch]:\d+|mpwrite\.h|intern\.h|outbuf\.h")
# CPython 3.11's PyLong_FromString leaves digits of the int it allocates
# that memcheck takes for uninitialised (reported for b"0" with no spanpack
# code loaded: ctypes.pythonapi.PyLong_FromString(b"0", None, 10)); the
# int-digits layout probe parses its probe ints so at import, and what it
# reads of them is reported with its frames.  Such a record names its
# origin, CPython's allocation in PyLong_FromString: left out, counted.
CPYTHON_ORIGIN = re.compile(r"PyLong_FromString \(longobject\.c:\d+\)")


def cpython_origin(record):
    origin = record[next((i for i, l in enumerate(record)
                          if l.strip().startswith("Uninitialised value was created")), len(record)):]
    return any(CPYTHON_ORIGIN.search(l) for l in origin)


ours = [r for r in records if ERROR.match(r[0]) and any(OURS.search(l) for l in r)]
bad = [r for r in ours if not cpython_origin(r)]
if len(bad) != len(ours):
    print("%d record(s) with spanpack frames whose uninitialised value CPython's PyLong_FromString "
          "made: left out" % (len(ours) - len(bad)))
summary = [l for l in lines if re.match(r"(ERROR SUMMARY|\s+definitely lost|\s+indirectly lost)", l)]
print("\n".join(summary))
if bad:
    print(f"\n{len(bad)} valgrind record(s) involving spanpack:\n")
    for record in bad:
        print("\n".join(record))
        print()
    sys.exit(1)
print("no invalid accesses or definitely-lost blocks in spanpack")
EOF
