#!/usr/bin/env bash
# The wheels, as .ci/run runs them (its step 4), from the repository root:
# the sdist, then for every interpreter a manylinux wheel built from it and
# tested installed in a fresh venv with no compiler reachable
# (scripts/wheels.py): the whole suite on CPython 3.11, the quick suite on
# 3.9, 3.10, 3.12, 3.13 (pyenv), 3.14, 3.15 (Debian sid chroot) and on arm64
# (Debian 12's python3 3.11, in a chroot under qemu-user), the arm64 run
# beside the x86-64 ones.  Ends with scripts/wheels.py summary: a table and a
# pytest-style line with the counts of every test run.
#
# The chroots: scripts/ci_chroot.sh's when it is there (provisioned by
# .ci/run's step 2), else plain `chroot` into SPANPACK_WHEELS_SID_CHROOT and
# SPANPACK_WHEELS_ARM64_CHROOT (a run without one of them fails).
# SPANPACK_WHEELS_DIST (default dist/) receives the sdist and wheels;
# SPANPACK_WHEELS_TARGETS (default "3.9 3.10 3.11 3.12 3.13 3.14 3.15 arm64")
# picks the interpreters.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DIST="${SPANPACK_WHEELS_DIST:-dist}"
TARGETS=" ${SPANPACK_WHEELS_TARGETS:-3.9 3.10 3.11 3.12 3.13 3.14 3.15 arm64} "
wanted() { [[ "$TARGETS" == *" $1 "* ]]; }
PYENV_VERSIONS="${PYENV_ROOT:-$HOME/.pyenv}/versions"
WHEELS=(python3 scripts/wheels.py)
failed=0
start=$SECONDS

note() { echo "[ci_wheels +$((SECONDS - start))s] $*"; }

# A host interpreter: the newest of pyenv's X.Y.*, else python3.X on PATH.
find_python() {
    local found
    found=$(ls -d "$PYENV_VERSIONS/$1".*/bin/"python$1" 2>/dev/null | sort -V | tail -n 1)
    [ -n "$found" ] || found=$(command -v "python$1" || true)
    [ -n "$found" ] || { echo "ci_wheels: CPython $1 not found" >&2; return 1; }
    echo "$found"
}

# The wheels.py options that run an interpreter inside chroot NAME (sid, arm64).
in_chroot() {
    local name=$1 fallback=$2
    if [ -x scripts/ci_chroot.sh ]; then
        echo "--chroot"; scripts/ci_chroot.sh path "$name"
        echo "--runner"; echo "scripts/ci_chroot.sh run $name"
    else
        [ -n "$fallback" ] || { echo "ci_wheels: no $name chroot (scripts/ci_chroot.sh, or SPANPACK_WHEELS_${name^^}_CHROOT)" >&2; return 1; }
        echo "--chroot"; echo "$fallback"
    fi
}

# build, then test, one interpreter: wheel SUITE WHEELS.PY-OPTIONS...
wheel() {
    local suite=$1
    shift
    "${WHEELS[@]}" build --dist "$DIST" "$@" && "${WHEELS[@]}" test --dist "$DIST" --suite "$suite" "$@"
}

rm -f "$DIST/wheels.jsonl"
note "sdist"
"${WHEELS[@]}" sdist --dist "$DIST" || failed=1

arm64_log=$(mktemp)
if wanted arm64; then
    mapfile -t ARM64 < <(in_chroot arm64 "${SPANPACK_WHEELS_ARM64_CHROOT:-}")
    if [ "$failed" = 0 ] && [ "${#ARM64[@]}" -gt 0 ]; then
        note "arm64 started in the background"
        (wheel quick "${ARM64[@]}" --python python3 >"$arm64_log" 2>&1; echo $? >"$arm64_log.rc") &
    else
        echo 1 >"$arm64_log.rc"
    fi
fi

if [ "$failed" = 0 ]; then
    for version in 3.9 3.10 3.11 3.12 3.13; do
        wanted "$version" || continue
        suite=quick
        [ "$version" = 3.11 ] && suite=full
        note "CPython $version ($suite suite)"
        python=$(find_python "$version") && wheel "$suite" --python "$python" || failed=1
    done
    for version in 3.14 3.15; do
        wanted "$version" || continue
        mapfile -t SID < <(in_chroot sid "${SPANPACK_WHEELS_SID_CHROOT:-}")
        note "CPython $version (quick suite, sid chroot)"
        [ "${#SID[@]}" -gt 0 ] && wheel quick "${SID[@]}" --python "python$version" || failed=1
    done
fi

if wanted arm64; then
    wait
    note "arm64 (exit status $(cat "$arm64_log.rc")):"
    cat "$arm64_log"
    [ "$(cat "$arm64_log.rc")" = 0 ] || failed=1
fi
rm -f "$arm64_log" "$arm64_log.rc"

note "done"
"${WHEELS[@]}" summary --dist "$DIST" || failed=1
exit "$failed"
