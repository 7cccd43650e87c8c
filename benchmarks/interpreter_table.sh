#!/usr/bin/env bash
# The interpreter tables of benchmarks/README.md (issue 18), from nothing: as
# root on this machine kind (Debian 12 with pyenv's CPython 3.11 and 3.13).
#
#   benchmarks/interpreter_table.sh [--wall] [OUT_DIR] [-- OPTIONS]
#   benchmarks/interpreter_table.sh /tmp/table -- --shapes span_1 web --no-user-spans
#   benchmarks/interpreter_table.sh --wall /tmp/wall
#
# 1. scripts/ci_chroot.sh provision dev: a Debian sid chroot with CPython 3.14
#    and 3.15, valgrind, and the host's pyenv 3.11 and 3.13 bound in, so that
#    all four are built by one gcc against one libc (made once, then reused).
# 2. Inside it, a copy of this working tree (uncommitted changes included; the
#    in-place builds then do not touch the checkout) and a venv per
#    interpreter with what the benchmarks import: attrs and msgspec (the user
#    classes, spanpack.user_spans), msgpack and pytest (bench_user_spans.py),
#    ddtrace where it installs (the ddtrace input form).
# 3. Each interpreter builds the extension in that copy, with the flags it
#    gives extensions (its compiler warnings are counted), then:
#    - by default, instructions per span: the four measure side by side
#      (callgrind_interpreters.py --json OPTIONS, PYTHONHASHSEED=0) and
#      --merge prints the table;
#    - with --wall, wall time of the user classes: bench_user_spans.py
#      (spanpack against msgspec's prebuilt Structs) on each interpreter in
#      turn, never two at once; give the machine to it.
#    What is printed is kept in OUT_DIR/table.md (default
#    /var/tmp/spanpack-interpreter-table), with each run's log.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LABELS=(3.11 3.13 3.14 3.15)

if [ "${1:-}" = --inside ]; then
    mode=$2 out=$3
    shift 3
    work=/var/tmp/spanpack-dev
    src=$work/src
    mkdir -p "$out"
    host() { ls -d /root/.pyenv/versions/$1.*/bin/python$1 2>/dev/null | sort -V | tail -n 1; }
    declare -A pythons=([3.11]="$(host 3.11)" [3.13]="$(host 3.13)" [3.14]=python3.14 [3.15]=python3.15)
    for label in "${LABELS[@]}"; do
        venv=$work/v${label/./}
        [ -x "$venv/bin/python" ] || "${pythons[$label]}" -m venv "$venv"
        # setuptools as pyproject.toml's build-system asks; ddtrace as [test] pins it.
        "$venv/bin/pip" -q install 'setuptools>=77' attrs msgspec msgpack pytest \
            'ddtrace==4.2.3; python_version < "3.15"'
        echo "== build with $label: $("$venv/bin/python" --version)"
        (cd "$src" && "$venv/bin/python" setup.py -q build_ext --inplace --force 2>"$out/build-$label.log")
        echo "   compiler warnings: $(grep -c 'warning:' "$out/build-$label.log" || true)"
    done
    if [ "$mode" = wall ]; then
        for label in "${LABELS[@]}"; do
            echo "== CPython $label"
            PYTHONPATH="$src/python" "$work/v${label/./}/bin/python" \
                "$src/benchmarks/bench_user_spans.py" "$@"
        done | tee "$out/table.md"
        exit 0
    fi
    pids=()
    for label in "${LABELS[@]}"; do
        PYTHONHASHSEED=0 python3.14 "$src/benchmarks/callgrind_interpreters.py" --no-build \
            --max-spans 200 --json "$out/ir-${label/./}.json" \
            --python "$label=$work/v${label/./}/bin/python" "$@" >"$out/run-$label.log" 2>&1 &
        pids+=($!)
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=1; done
    [ $status = 0 ] || { tail -n 20 "$out"/run-*.log; exit 1; }
    results=()
    for label in "${LABELS[@]}"; do results+=("$out/ir-${label/./}.json"); done
    python3.14 "$src/benchmarks/callgrind_interpreters.py" --merge "${results[@]}" | tee "$out/table.md"
    exit 0
fi

mode=instructions
if [ "${1:-}" = --wall ]; then
    mode=wall
    shift
fi
out=/var/tmp/spanpack-interpreter-table
if [ $# -gt 0 ] && [ "$1" != -- ]; then
    out=$1
    shift
fi
[ "${1:-}" = -- ] && shift
"$ROOT/scripts/ci_chroot.sh" provision dev
chroot_dir=$("$ROOT/scripts/ci_chroot.sh" path dev)
# The tree as it is now (tracked and untracked files git would keep), copied
# to where the inside half builds and measures it.
src=$chroot_dir/var/tmp/spanpack-dev/src
rm -rf --one-file-system "$src"
mkdir -p "$src"
git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
    (cd "$ROOT" && tar --null -T - -cf -) | tar -xf - -C "$src"
# OUT_DIR lives inside the chroot; what it holds is copied out beside it.
"$ROOT/scripts/ci_chroot.sh" run dev bash benchmarks/interpreter_table.sh --inside "$mode" "$out" "$@"
mkdir -p "$out"
cp "$chroot_dir$out"/* "$out"/
echo "table: $out/table.md"
