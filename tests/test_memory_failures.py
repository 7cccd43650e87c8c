"""Running out of memory, and lengths too large for a msgpack header.

A call that fails, MemoryError included, leaves the encoder exactly as it
was: its next payload is byte-identical to that of an encoder that never saw
the failed call.  The memory tests run in a child interpreter, so a capped
address space or a failing allocator touches nothing else (and a crash is a
failed test, not a dead test run):

- under RLIMIT_AS, a put() whose trace can be encoded but not appended, and a
  v0.5 encode() with no room for its finished payload;
- with CPython's test allocator (_testcapi.set_nomemory) failing the n-th
  allocation, for every n along put, encode, encode_traces, encode_trace and
  join_encoded, until the call needs fewer allocations than n.

Lengths beyond 2**32-1 cannot be reached without gigabytes of data, except
through a memoryview of an untouched anonymous mapping; the check every
header writer applies is also called directly through a test hook.
"""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import textwrap

import msgpack
import pytest

import spanpack
import spanpack._spanpack as core

MSGPACK_LIMIT = 2**32 - 1
CHILD_TIMEOUT = 300

# Under the sanitizer build allocation failures abort the process instead of
# returning NULL, and RLIMIT_AS cannot be measured against ASan's shadow memory.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


def run_child(body: str) -> dict:
    """Run CHILD_PRELUDE and `body` in a fresh interpreter; it prints one JSON object."""
    completed = subprocess.run(
        [sys.executable, "-c", CHILD_PRELUDE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    report = f"child exited with {completed.returncode}\n{completed.stdout[-2000:]}\n{completed.stderr[-4000:]}"
    assert completed.returncode == 0 and completed.stdout.strip(), report
    return json.loads(completed.stdout.strip().splitlines()[-1])


CHILD_PRELUDE = """
import json, resource, sys
import msgpack, spanpack

MIB = 1 << 20

def span(trace_id, span_id, **fields):
    return {"trace_id": trace_id, "span_id": span_id, "name": "op", "start_ns": 1, **fields}

def trace_ids(payloads, version):
    # Decoded independently: v0.4 spans are maps, v0.5 spans arrays with the
    # trace id fourth, behind the payload's string table.
    ids = []
    for payload, count in payloads:
        decoded = msgpack.unpackb(payload, strict_map_key=False)
        traces = decoded if version == "v0.4" else decoded[1]
        assert len(traces) == count, (len(traces), count)
        for trace in traces:
            ids.append(trace[0]["trace_id"] if version == "v0.4" else trace[0][3])
    return ids

class address_space_limit:
    # Caps the address space at what is mapped now plus `headroom` bytes.
    def __init__(self, headroom):
        self.headroom = headroom
    def __enter__(self):
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * resource.getpagesize()
        self.saved = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (mapped + self.headroom, self.saved[1]))
    def __exit__(self, *exc_info):
        resource.setrlimit(resource.RLIMIT_AS, self.saved)
"""

needs_rlimit = pytest.mark.skipif(
    UNDER_ASAN or not os.path.exists("/proc/self/statm"),
    reason="needs Linux's /proc/self/statm and a build without AddressSanitizer",
)


@needs_rlimit
def test_put_that_runs_out_of_memory_keeps_the_buffered_traces():
    result = run_child(
        """
        encoder = spanpack.TraceMsgPackEncoder("v0.4", max_size=1 << 40)
        reference = spanpack.TraceMsgPackEncoder("v0.4", max_size=1 << 40)
        for target in (encoder, reference):
            target.put([span(1, 1)])
            target.put([span(2, 1)])
        before = [len(encoder), encoder.size]
        text = "x" * 20_000
        big = [span(3, i + 1, meta={"k": text}) for i in range(1_500)]  # 30 MB encoded
        # Room to encode the trace on its own (one buffer of about 30 MB), not
        # to append a second copy of it to the buffered payload.
        with address_space_limit(45 * MIB):
            try:
                encoder.put(big)
                outcome = "accepted"
            except MemoryError:
                outcome = "MemoryError"
        after = [len(encoder), encoder.size]
        for target in (encoder, reference):
            target.put([span(4, 1)])
        payloads = encoder.encode()
        print(json.dumps({"outcome": outcome, "before": before, "after": after,
                          "identical": payloads == reference.encode(),
                          "trace_ids": trace_ids(payloads, "v0.4")}))
        """
    )
    assert result["outcome"] == "MemoryError", "the address-space cap did not make put() fail"
    assert result["after"] == result["before"]
    assert result["identical"]
    assert result["trace_ids"] == [1, 2, 4]


@needs_rlimit
def test_v05_encode_that_runs_out_of_memory_keeps_the_buffered_traces():
    result = run_child(
        """
        encoder = spanpack.TraceMsgPackEncoder("v0.5", max_size=1 << 40)
        reference = spanpack.TraceMsgPackEncoder("v0.5", max_size=1 << 40)
        meta = {"k%d" % i: "%0200d" % i for i in range(120_000)}  # 25 MB string table
        for target in (encoder, reference):
            target.put([span(1, 1, meta=meta)])
            target.put([span(2, 1)])
        expected = reference.encode()
        before = [len(encoder), encoder.size]
        # Far less than the finished payload needs.
        with address_space_limit(8 * MIB):
            try:
                encoder.encode()
                outcome = "encoded"
            except MemoryError:
                outcome = "MemoryError"
        after = [len(encoder), encoder.size]
        payloads = encoder.encode()
        print(json.dumps({"outcome": outcome, "before": before, "after": after,
                          "identical": payloads == expected, "trace_ids": trace_ids(payloads, "v0.5"),
                          "size": sum(len(payload) for payload, _ in payloads)}))
        """
    )
    assert result["outcome"] == "MemoryError", "the address-space cap did not make encode() fail"
    assert result["after"] == result["before"]
    assert result["before"][1] == result["size"]
    assert result["identical"]
    assert result["trace_ids"] == [1, 2]
