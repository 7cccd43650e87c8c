#!/usr/bin/env bash
# Run scripts/valgrind_driver.py under valgrind memcheck and fail on memory
# errors or definitely-lost blocks in spanpack's C code.
#
#   scripts/valgrind_check.sh            # builds a -O0 -g copy in a temp dir first
#   SPANPACK_VALGRIND_BUILD=0 scripts/valgrind_check.sh   # use the importable spanpack
#
# Environment:
#   PYTHON                     interpreter (default: python3)
#   SPANPACK_VALGRIND_BUILD    1 (default): build ext/ with SPANPACK_DEBUG=1 in a
#                              temporary copy (the repo's build/ and in-place .so
#                              are left alone); 0: import spanpack as installed
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
    echo "building a -O0 -g copy of spanpack in $work/src"
    (cd "$work/src" && SPANPACK_DEBUG=1 "$python" setup.py -q build_ext --inplace \
        >"$work/build.log" 2>&1) || { cat "$work/build.log" >&2; exit 3; }
    export PYTHONPATH="$work/src/python${PYTHONPATH:+:$PYTHONPATH}"
fi
"$python" -c 'import spanpack._spanpack as m; print("spanpack from", m.__file__)'

# CPython's own noise is filtered, not suppressed: CPython 3.11 reports ~800
# "uninitialised value" errors from longobject.c's maybe_small_long (and the
# Py_INCREFs of small ints that follow) during ordinary imports, and the
# interpreter leaks a little at exit.  A suppression cannot say "and no
# spanpack frame on the stack", so instead every record is kept and the
# filter below fails only on records with a spanpack frame.  dlopen's own
# allocations are suppressed; add more entries here if a platform needs them.
supp="$work/cpython.supp"
cat >"$supp" <<'EOF'
{
   cpython-dlopen-leaks
   Memcheck:Leak
   match-leak-kinds: definite
   ...
   fun:_dl_open
}
EOF

echo "running the driver under valgrind (slow: about a minute)"
set +e
PYTHONMALLOC=malloc valgrind --tool=memcheck --leak-check=full \
    --errors-for-leak-kinds=definite --show-leak-kinds=definite \
    --num-callers=50 --track-origins=yes --suppressions="$supp" \
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

ERROR = re.compile(r"^(Invalid (read|write|free)|Mismatched free|Use of uninitialised|"
                   r"Conditional jump or move depends|Syscall param .* uninitialised|"
                   r"Source and destination overlap|.* definitely lost in)")
OURS = re.compile(r"_spanpack|\b(packer|payload|span_v04|span_v05|spanwrite|spanfields|"
                  r"intern|outbuf|trace_encoder|module)\.[ch]:\d+|mpwrite\.h|intern\.h|outbuf\.h")
bad = [r for r in records if ERROR.match(r[0]) and any(OURS.search(l) for l in r)]
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
