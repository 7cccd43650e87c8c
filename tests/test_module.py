"""The extension module itself: multi-phase init, module state, subinterpreters."""

import importlib.machinery
import importlib.util
import os
import sys
import tempfile

import pytest

import spanpack
import spanpack._spanpack as core

SPAN = {"trace_id": 7, "span_id": 8, "name": "op", "service": "svc", "resource": "r", "start_ns": 1}


def load_fresh_instance():
    """A second, independent instance of the extension module (PEP 489)."""
    spec = importlib.util.spec_from_file_location("spanpack._spanpack", core.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_module_instances_have_their_own_types_and_both_work():
    other = load_fresh_instance()
    assert other is not core
    assert other.Packer is not core.Packer
    assert other.TraceEncoder is not core.TraceEncoder
    assert other.BufferFull is not core.BufferFull
    assert other.packb([1, "a"]) == core.packb([1, "a"])
    assert other.TraceEncoder().encode_traces([[SPAN]]) == core.TraceEncoder().encode_traces([[SPAN]])


def test_types_are_heap_types_bound_to_their_module():
    for cls in (core.Packer, core.TraceEncoder, core.EncodedTrace):
        assert cls.__flags__ & (1 << 9), cls  # Py_TPFLAGS_HEAPTYPE
        assert cls.__module__ == "spanpack"


def test_subclasses_find_the_module_state():
    class MyPacker(spanpack.Packer):
        pass

    class MyEncoder(spanpack.TraceMsgPackEncoder):
        pass

    assert MyPacker().pack(spanpack.ExtType(1, b"x")) == spanpack.packb(spanpack.ExtType(1, b"x"))
    assert MyEncoder("v0.5").encode_traces([[SPAN]]) == spanpack.TraceMsgPackEncoder("v0.5").encode_traces([[SPAN]])


def test_encoded_trace_cannot_be_made_directly():
    with pytest.raises(TypeError):
        spanpack.EncodedTrace()


def test_works_in_a_subinterpreter():
    _testcapi = pytest.importorskip("_testcapi")
    if not hasattr(_testcapi, "run_in_subinterp"):
        pytest.skip("no _testcapi.run_in_subinterp")
    with tempfile.TemporaryDirectory() as directory:
        result_path = os.path.join(directory, "result")
        code = f"""
import sys
sys.path[:0] = {sys.path!r}
import spanpack
payload = spanpack.TraceMsgPackEncoder("v0.5").encode_traces([[{SPAN!r}]])
with open({result_path!r}, "wb") as out:
    out.write(spanpack.packb([payload, spanpack.Timestamp(1, 2)]))
"""
        assert _testcapi.run_in_subinterp(code) == 0
        with open(result_path, "rb") as result:
            got = result.read()
    expected = spanpack.packb(
        [spanpack.TraceMsgPackEncoder("v0.5").encode_traces([[SPAN]]), spanpack.Timestamp(1, 2)]
    )
    assert got == expected


def test_send_to_no_agent_raises_url_error_an_os_error():
    """docs/encoding.md and send()'s docstring: no agent at the URL raises URLError,
    which `except OSError` catches."""
    import socket
    import urllib.error

    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        with pytest.raises(urllib.error.URLError) as info:
            spanpack.send(b"\x90", 0, "http://127.0.0.1:%d/v0.4/traces" % port, timeout=5)
    assert isinstance(info.value, OSError)
    assert isinstance(info.value.reason, ConnectionRefusedError)


def test_minimal_dict_span_reads_back_as_documented():
    import msgpack

    span = {"trace_id": 1, "span_id": 2, "name": "n", "start_ns": 5}
    v04 = msgpack.unpackb(spanpack.TraceMsgPackEncoder("v0.4").encode_traces([[span]]))
    assert v04 == [[{"trace_id": 1, "span_id": 2, "service": None, "resource": None, "name": "n",
                     "start": 5, "duration": None}]]
    table, traces = msgpack.unpackb(spanpack.TraceMsgPackEncoder("v0.5").encode_traces([[span]]))
    # service, name, resource, trace_id, span_id, parent_id, start, duration, error, meta, metrics, type
    assert [table[i] for i in (traces[0][0][0], traces[0][0][1], traces[0][0][2], traces[0][0][11])] == [
        "", "n", "", ""]
    assert traces[0][0][3:11] == [1, 2, 0, 5, 0, 0, {}, {}]


def test_wire_constants():
    """The constants the Python side imports instead of restating them."""
    from spanpack import _spanpack

    assert _spanpack.SPAN_FIELDS == (
        "trace_id", "span_id", "parent_id", "service", "name", "resource", "span_type",
        "start_ns", "duration_ns", "error", "meta", "metrics", "meta_struct", "links",
        "events", "origin",
    )
    assert (_spanpack.MAX_TEXT_LEN, _spanpack.TRUNCATED_PREFIX_LEN) == (25000, 2486)
    assert _spanpack.TRUNCATION_SUFFIX == "<truncated>..."
    assert (_spanpack.ORIGIN_KEY, _spanpack.TRACE_ID_HIGH_KEY) == ("_dd.origin", "_dd.p.tid")
    assert (_spanpack.SPAN_LINKS_KEY, _spanpack.SPAN_EVENTS_KEY) == ("_dd.span_links", "events")
