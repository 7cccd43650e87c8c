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


def run_child(body: str, definitions: str = "") -> dict:
    """Run CHILD_PRELUDE, `definitions` and `body` in a fresh interpreter; the
    body prints one JSON object."""
    completed = subprocess.run(
        [sys.executable, "-c", CHILD_PRELUDE + definitions + textwrap.dedent(body)],
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
    # The cap's effect is read back: when a mapping well beyond it still
    # succeeds (qemu-user accepts setrlimit but does not enforce RLIMIT_AS),
    # the child reports why and exits, and the test skips with that reason.
    def __init__(self, headroom):
        self.headroom = headroom
    def __enter__(self):
        import mmap
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * resource.getpagesize()
        self.saved = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (mapped + self.headroom, self.saved[1]))
        probe = self.headroom + 64 * MIB
        try:
            mmap.mmap(-1, probe).close()
        except OSError:
            return  # enforced
        resource.setrlimit(resource.RLIMIT_AS, self.saved)
        print(json.dumps({"not_enforced": "RLIMIT_AS is not enforced on this platform: with the address "
                          "space capped %d MiB above what was mapped, a %d MiB mapping still succeeded "
                          "(as under qemu-user)" % (self.headroom // MIB, probe // MIB)}))
        sys.exit(0)
    def __exit__(self, *exc_info):
        resource.setrlimit(resource.RLIMIT_AS, self.saved)
"""


def run_limited_child(body: str) -> dict:
    """run_child for a body that uses address_space_limit: skips the test,
    saying why, where the cap is not enforced."""
    result = run_child(body)
    if "not_enforced" in result:
        pytest.skip(result["not_enforced"])
    return result

needs_rlimit = pytest.mark.skipif(
    UNDER_ASAN or not os.path.exists("/proc/self/statm"),
    reason="needs Linux's /proc/self/statm and a build without AddressSanitizer",
)


@needs_rlimit
def test_put_that_runs_out_of_memory_keeps_the_buffered_traces():
    result = run_limited_child(
        """
        encoder = spanpack.TraceMsgPackEncoder("v0.4", max_size=1 << 40, intern=True)
        reference = spanpack.TraceMsgPackEncoder("v0.4", max_size=1 << 40, intern=True)
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
    result = run_limited_child(
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


NOMEMORY_CHILD = """
import gc
import _testcapi

FAILED = object()
SENTINEL = "".join(["sentinel-", "value"])  # a str only these traces hold

def make_traces():
    # Each trace outgrows the 4 KiB buffers a put() starts with and brings
    # more new strings than a v0.5 string table's first 64 entries; all four
    # outgrow the 16 KiB a one-shot payload starts with.
    return [
        [span(10 + t, i + 1, service=SENTINEL,
              meta={"key%d" % k: "value-%d-%d-%d" % (t, i, k) for k in range(30)})
         for i in range(8)]
        for t in range(4)
    ]

TRACES = make_traces()
# Twice the size of the traces buffered before it: the buffer must grow.
LARGE_TRACE = TRACES[2] + TRACES[3]

def encoders(version, split):
    options = {"max_size": 1 << 30, "intern": True}  # (v0.4: the string cache's paths too)
    if split:
        # The two buffered traces share a payload; put(LARGE_TRACE) seals it.
        large = len(spanpack.TraceMsgPackEncoder(version).encode_traces([LARGE_TRACE]))
        options["max_payload_size"] = large * 5 // 4
    encoder = spanpack.TraceMsgPackEncoder(version, **options)
    reference = spanpack.TraceMsgPackEncoder(version, **options)
    for target in (encoder, reference):
        target.put(TRACES[0])
        target.put(TRACES[1])
    return encoder, reference

def same_state(encoder, reference, version):
    # What encode() would give now; this empties both buffers.
    if (len(encoder), encoder.size) != (len(reference), reference.size):
        return False
    payloads = encoder.encode()
    if payloads != reference.encode():
        return False
    trace_ids(payloads, version)
    return True

# Each operation: (prepare, replay).  prepare(encoder) returns the bound
# method and its arguments, made before the allocator fails; replay(encoder,
# reference, result) repeats a successful call on the reference and compares.
def put_operation():
    def prepare(encoder):
        return encoder.put, (LARGE_TRACE,)
    def replay(encoder, reference, result):
        reference.put(LARGE_TRACE)
        return result is None
    return prepare, replay

def encode_operation():
    def prepare(encoder):
        return encoder.encode, ()
    def replay(encoder, reference, result):
        return result == reference.encode()
    return prepare, replay

def encode_traces_operation():
    def prepare(encoder):
        return encoder.encode_traces, (TRACES,)
    def replay(encoder, reference, result):
        return result == reference.encode_traces(TRACES)
    return prepare, replay

def encode_trace_operation():
    def prepare(encoder):
        return encoder.encode_trace, (TRACES[2],)
    def replay(encoder, reference, result):
        expected = reference.join_encoded([reference.encode_trace(TRACES[2])])
        return encoder.join_encoded([result]) == expected
    return prepare, replay

def join_encoded_operation():
    def prepare(encoder):
        return encoder.join_encoded, ([encoder.encode_trace(t) for t in TRACES[1:]],)
    def replay(encoder, reference, result):
        return result == reference.join_encoded([reference.encode_trace(t) for t in TRACES[1:]])
    return prepare, replay

def one_shot_again(name, encoder, reference):
    # A failed one-shot call, repeated without failures, matches the reference.
    if name == "encode_traces":
        return encoder.encode_traces(TRACES) == reference.encode_traces(TRACES)
    if name in ("encode_trace", "join_encoded"):
        parts = [encoder.encode_trace(t) for t in TRACES[1:]]
        expected = [reference.encode_trace(t) for t in TRACES[1:]]
        return encoder.join_encoded(parts) == reference.join_encoded(expected)
    return True

OPERATIONS = {
    "put": put_operation(),
    "encode": encode_operation(),
    "encode_traces": encode_traces_operation(),
    "encode_trace": encode_trace_operation(),
    "join_encoded": join_encoded_operation(),
}

def fail_each_allocation(name, version, split, fail_all_after):
    prepare, replay = OPERATIONS[name]
    baseline = sys.getrefcount(SENTINEL)
    for n in range(10_000):
        encoder, reference = encoders(version, split)
        method, args = prepare(encoder)
        # The n-th allocation from here fails (and with fail_all_after, every
        # later one too); nothing but the C call runs in between.
        _testcapi.set_nomemory(n, 0 if fail_all_after else n + 1)
        try:
            result = method(*args)
        except MemoryError:
            result = FAILED
        finally:
            _testcapi.remove_mem_hooks()
        where = "%s %s split=%s n=%d" % (name, version, split, n)
        failed = result is FAILED
        if failed:
            assert one_shot_again(name, encoder, reference), "one-shot result differs: " + where
            assert same_state(encoder, reference, version), "buffer changed by failure: " + where
        else:
            assert replay(encoder, reference, result), "result differs: " + where
            assert same_state(encoder, reference, version), "buffer differs: " + where
        del encoder, reference, method, args, result
        gc.collect()
        assert sys.getrefcount(SENTINEL) == baseline, "references leaked: " + where
        if not failed:
            return n  # the call needs no more than n allocations
    raise AssertionError("%s still failing after 10,000 allocations" % name)
"""


@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
def test_every_failed_allocation_leaves_the_encoder_as_it_was(version):
    testcapi = pytest.importorskip("_testcapi")
    if not hasattr(testcapi, "set_nomemory"):
        pytest.skip("_testcapi.set_nomemory is not available")
    result = run_child(
        f"""
        counts = {{}}
        for name in OPERATIONS:
            # Splitting into several payloads only concerns the buffer.
            for split in (False, True) if name in ("put", "encode") else (False,):
                for fail_all_after in (False, True):
                    key = "%s split=%s fail_all_after=%s" % (name, split, fail_all_after)
                    counts[key] = fail_each_allocation(name, {version!r}, split, fail_all_after)
        print(json.dumps(counts))
        """,
        NOMEMORY_CHILD,
    )
    # Every call allocated, so every one was made to fail at least once.
    assert result and all(count > 0 for count in result.values()), result


# ---------------------------------------------------------------------------
# Lengths beyond 32 bits


@pytest.mark.parametrize("length", [0, 1, 2**16, MSGPACK_LIMIT])
def test_header_length_check_accepts_32_bit_lengths(length):
    assert core._check_msgpack_length(length) is None


@pytest.mark.parametrize("length", [MSGPACK_LIMIT + 1, MSGPACK_LIMIT + 2, 2**40, 2**63 - 1, -1])
def test_header_length_check_rejects_longer_lengths(length):
    # The check every str/bin/ext/array/map header writer applies (Packer,
    # span writers, payload headers): beyond 32 bits a header would carry the
    # length modulo 2**32.
    with pytest.raises(ValueError, match=r"too large \(%d; msgpack allows at most 2\*\*32-1\)" % length):
        core._check_msgpack_length(length)


@pytest.fixture(scope="module")
def view_beyond_limit():
    """A memoryview one byte longer than msgpack allows, over an anonymous
    mapping that is never touched (so it costs address space, not memory)."""
    try:
        mapping = mmap.mmap(-1, MSGPACK_LIMIT + 1)
    except (OverflowError, OSError, ValueError) as error:
        pytest.skip(f"cannot map 4 GiB of address space: {error}")
    view = memoryview(mapping)
    yield view
    view.release()
    mapping.close()


@pytest.mark.parametrize("use_bin_type", [True, False])
def test_packer_rejects_a_buffer_beyond_the_limit_as_msgpack_does(view_beyond_limit, use_bin_type):
    with pytest.raises(ValueError):
        msgpack.packb(view_beyond_limit, use_bin_type=use_bin_type)
    packer = spanpack.Packer(autoreset=False, use_bin_type=use_bin_type)
    packer.pack(1)
    with pytest.raises(ValueError, match="memoryview is too large"):
        packer.pack([view_beyond_limit])
    with pytest.raises(ValueError, match="ext data is too large"):
        packer.pack_ext_type(5, view_beyond_limit)
    # What was packed before the failed calls is kept, and nothing else.
    assert packer.bytes() == msgpack.packb(1)


def test_meta_struct_value_beyond_the_limit_names_its_key(view_beyond_limit):
    encoder = spanpack.TraceMsgPackEncoder("v0.4")
    span = {"trace_id": 1, "span_id": 2, "name": "n", "start_ns": 0, "meta_struct": {"doc": view_beyond_limit}}
    with pytest.raises(ValueError, match=r"trace 0, span 0, meta_struct key 'doc': memoryview is too large"):
        encoder.encode_traces([[span]])
    with pytest.raises(ValueError, match="meta_struct key 'doc'"):
        encoder.put([span])
    assert len(encoder) == 0 and encoder.encode() == []
