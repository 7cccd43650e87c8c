#!/usr/bin/env bash
# One run of CI's ddtrace matrix: spanpack against one ddtrace release, in a
# virtualenv of its own (ddtrace pins its own dependencies, and the [test]
# extra pins the pure-Python 4.2.3 the rest of the suite compares with).
#
#   scripts/ci_ddtrace.sh PYTHON DDTRACE_VERSION WORKDIR
#
# In WORKDIR (emptied first) it makes a virtualenv, installs spanpack from
# this tree (a regular install, built in WORKDIR) with that ddtrace and the
# test tools, and runs the tests that compare spanpack with ddtrace itself:
# its tracer's spans against its own encoders, and spanpack.ddtrace.install()
# end to end through the APM test agent.  Works on the host and inside
# scripts/ci_chroot.sh's chroots alike.  The supported release lines are in
# docs/ci.md ("ddtrace versions"); .ci/run lists the versions it runs.
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 PYTHON DDTRACE_VERSION WORKDIR" >&2; exit 2; }
PYTHON=$1 VERSION=$2 WORK=$3
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

case "$WORK" in /|/root|/tmp|/work|"$ROOT"|"$ROOT"/*) echo "ci_ddtrace: refusing WORKDIR $WORK" >&2; exit 2 ;; esac
rm -rf --one-file-system "$WORK"
mkdir -p "$WORK/tmp"

export CI="${CI:-true}" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export TMPDIR="$WORK/tmp"
export DIST_EXTRA_CONFIG="$WORK/setuptools.cfg" # build/ in WORKDIR (see scripts/ci_suite.sh)
printf '[build]\nbuild_base = %s/build\n[build_ext]\nforce = 1\n[egg_info]\negg_base = %s\n' "$WORK" "$WORK" >"$DIST_EXTRA_CONFIG"

"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
start=$SECONDS
# The [test] extra's tools that these tests use, without its ddtrace pin.
if ! "$VPY" -m pip install "$ROOT" "ddtrace==$VERSION" "pytest>=7" "hypothesis>=6.100" \
    "msgpack>=1.2,<1.3" ddapm-test-agent >"$WORK/install.log" 2>&1; then
    tail -n 40 "$WORK/install.log"
    echo "ci_ddtrace: pip install failed (log: $WORK/install.log)"
    exit 3
fi
"$VPY" -c 'import ddtrace, platform, sys; v = ddtrace.__version__
print("ci_ddtrace: ddtrace %s on CPython %s (%s)" % (v, platform.python_version(), platform.machine()))
sys.exit(v != sys.argv[1])' "$VERSION"
echo "ci_ddtrace: installed in $((SECONDS - start)) s"

cd "$ROOT"
tests=(tests/spans/test_ddtrace_tracer.py)
[ -f tests/integration/test_ddtrace_install.py ] && tests+=(tests/integration/test_ddtrace_install.py)
# -p no:cacheprovider: nothing written into the source tree; pytest imports
# spanpack from the venv (a regular install), since tests/ is not a path
# entry that holds the package.
exec "$VPY" -m pytest -p no:cacheprovider "${tests[@]}"
