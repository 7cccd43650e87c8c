"""Short fixed-budget runs of the fuzz harnesses in fuzz/ (the long runs are
manual, see fuzz/README.md).

Without atheris (the default, and what CI does) each harness's TestOneInput
is fed random bytes from a seeded generator, so a failure reproduces with the
printed seed and input.  With atheris importable and SPANPACK_FUZZ_ATHERIS=1
the harness runs under atheris in a child process for a fixed number of runs
instead.  SPANPACK_FUZZ_ITERATIONS changes the budget per harness.
"""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

FUZZ_DIR = Path(__file__).resolve().parents[2] / "fuzz"
ITERATIONS = int(os.environ.get("SPANPACK_FUZZ_ITERATIONS", "3000"))
TIME_CAP = 20.0  # seconds per seed; the iteration count is the budget, this a guard

msgpack = pytest.importorskip("msgpack")

# The Packer harness checks against msgpack-python 1.2 (as the Packer's
# differential tests do); Python 3.9 only gets msgpack 1.1.
PACKER_REFERENCE = msgpack.version >= (1, 2)


def load_harness(name):
    spec = importlib.util.spec_from_file_location(f"_smoke_{name}", FUZZ_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(FUZZ_DIR))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(FUZZ_DIR))
    return module


def use_atheris():
    if os.environ.get("SPANPACK_FUZZ_ATHERIS") != "1":
        return False
    return importlib.util.find_spec("atheris") is not None


@pytest.mark.parametrize("name", ["fuzz_packer", "fuzz_spans"])
@pytest.mark.parametrize("seed", [1, 2])
def test_harness_short_run(name, seed):
    if name == "fuzz_packer" and not PACKER_REFERENCE:
        pytest.skip("the Packer harness needs msgpack 1.2 (Python >= 3.10)")
    if use_atheris():
        if seed != 1:
            pytest.skip("one atheris run per harness")
        result = subprocess.run(
            [sys.executable, str(FUZZ_DIR / f"{name}.py"), f"-runs={ITERATIONS}",
             f"-seed={seed}", "-max_len=2048"],
            capture_output=True, text=True, timeout=600,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        return
    harness = load_harness(name)
    start = time.monotonic()
    done = 0
    # Chunks of 100, stopping early at the time cap (slow sanitizer builds).
    while done < ITERATIONS and time.monotonic() - start < TIME_CAP:
        harness.random_driver(100, seed * 1_000_003 + done)
        done += 100
    assert done >= min(ITERATIONS, 100)


def test_harness_replay_of_empty_and_tiny_inputs():
    for name in ("fuzz_packer", "fuzz_spans") if PACKER_REFERENCE else ("fuzz_spans",):
        harness = load_harness(name)
        for data in (b"", b"\x00", b"\xff", b"\x00" * 64, b"\xff" * 64, bytes(range(256))):
            harness.TestOneInput(data)
