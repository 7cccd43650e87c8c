#!/usr/bin/env bash
# One run of CI's matrix: the whole test suite on one interpreter, isolated
# from every other run going on beside it.
#
#   scripts/ci_suite.sh PYTHON WORKDIR [PYTEST_ARGS...]
#
# In WORKDIR (emptied first) it makes a virtualenv, builds and installs
# spanpack with its [test] extra (a regular install, so the tests import the
# built package from the venv, never the source tree) in its own build
# directory, runs pytest with CI=true and its own TMPDIR, and writes the
# payload digests of the bench shapes (scripts/payload_digests.py).  Files
# left in WORKDIR: build.log (pip's verbose output; the compiler's warnings
# are counted from it), warnings.txt, pytest.log, digests.txt.
# The test agent each run starts listens on a port the kernel picks
# (tests/integration/agent.py), so runs beside each other do not collide.
# Works on the host and inside scripts/ci_chroot.sh's chroots alike.
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: $0 PYTHON WORKDIR [PYTEST_ARGS...]" >&2; exit 2; }
PYTHON=$1 WORK=$2
shift 2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

case "$WORK" in /|/root|/tmp|/work|"$ROOT"|"$ROOT"/*) echo "ci_suite: refusing WORKDIR $WORK" >&2; exit 2 ;; esac
if [ -d "$WORK" ]; then
    if mountpoint -q "$WORK" 2>/dev/null || awk -v d="$(realpath "$WORK")/" 'index($5 "/", d) == 1 { f = 1 } END { exit !f }' /proc/self/mountinfo; then
        echo "ci_suite: $WORK is or holds a mount point; not emptying it" >&2
        exit 2
    fi
    rm -rf --one-file-system "$WORK"
fi
mkdir -p "$WORK/tmp"

export CI="${CI:-true}" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export TMPDIR="$WORK/tmp"
# setuptools reads this extra config file: build/ and the egg-info in WORKDIR,
# not in the shared source tree, and always rebuild (see tox.ini).
export DIST_EXTRA_CONFIG="$WORK/setuptools.cfg"
printf '[build]\nbuild_base = %s/build\n[build_ext]\nforce = 1\n[egg_info]\negg_base = %s\n' "$WORK" "$WORK" >"$DIST_EXTRA_CONFIG"

"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
echo "ci_suite: $("$VPY" -c 'import platform, sys; print("CPython %s on %s (%s)" % (platform.python_version(), platform.machine(), sys.executable))')"
start=$SECONDS
if ! "$VPY" -m pip install -v "$ROOT[test]" >"$WORK/build.log" 2>&1; then
    tail -n 60 "$WORK/build.log"
    echo "ci_suite: pip install failed (log: $WORK/build.log)"
    exit 3
fi
# The compiler's diagnostics about spanpack's own sources (one line per
# occurrence: a header's warning counts once for each file that includes it).
grep -E '(^|[[:space:]/])ext/[^:]+:[0-9]+:[0-9]+: (warning|error):' "$WORK/build.log" | sed 's/^[[:space:]]*//' >"$WORK/warnings.txt" || true
echo "ci_suite: installed in $((SECONDS - start)) s; compiler warnings in ext/: $(wc -l <"$WORK/warnings.txt")"
cat "$WORK/warnings.txt"

cd "$ROOT"
start=$SECONDS
set +e
"$VPY" -m pytest -p no:cacheprovider --continue-on-collection-errors "$@" 2>&1 | tee "$WORK/pytest.log"
status=${PIPESTATUS[0]}
set -e
echo "ci_suite: pytest exited with $status after $((SECONDS - start)) s"
"$VPY" scripts/payload_digests.py "$WORK/digests.txt" || status=$((status ? status : 4))
exit "$status"
