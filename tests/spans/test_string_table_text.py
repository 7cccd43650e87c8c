"""The v0.5 and v1.0 string tables find a text by a hash of its own bytes
(ext/intern.h's text_hash), not by CPython's hash of the str.

Equal texts must be one entry whatever their objects: built per span (a str
CPython never hashed), shared, or hashed beforehand, of every length around
the hash's 4-, 8- and 16-byte steps and in every str kind (1, 2 and 4 bytes a
code point).  ddtrace's own v0.5 encoder, which keys its table by Python
equality, is the reference for the bytes; and no payload may depend on
whether CPython hashed a str first.
"""

from __future__ import annotations

import sys

import pytest

import spanpack

from tests.support import ddtrace_payload, spanpack_paths, unpack

# One character of each str kind: ASCII and Latin-1 (1 byte), BMP (2), astral (4).
KIND_CHARACTERS = ["a", "\xe9", "\u0436", "\U0001f600"]
# Every length up to 3 past two 16-byte blocks of 1-byte text.
LENGTHS = range(0, 36)


def fresh(text: str) -> str:
    """An equal str object made now: CPython has not hashed it."""
    return "".join(list(text)) if len(text) > 1 else text


def texts():
    """Distinct texts of each kind and length: the repeated character with
    the length's last character changed, so equal-length texts differ only at
    their end (what the hash reads last)."""
    result = []
    for character in KIND_CHARACTERS:
        for length in LENGTHS:
            body = character * length
            result.append(body)
            if length:
                result.append(body[:-1] + "b")
    return result


TEXTS = texts()
VERSIONS_WITH_TABLES = ["v0.5", "v1.0"]


def _trace(make_text, span_class):
    """Three spans, each carrying every text as a tag value and, for texts of
    up to 12 characters, as a tag key too."""
    spans = []
    for span_id in (1, 2, 3):
        span = span_class("op", service=make_text("svc"), resource=make_text("res"),
                          trace_id=7, span_id=span_id)
        span.start_ns = 10
        span.duration_ns = 5
        for i, text in enumerate(TEXTS):
            span.set_tag("value.%d" % i, make_text(text))
            if 0 < len(text) <= 12:
                span.set_tag(make_text(text), make_text("k"))
        spans.append(span)
    return spans


@pytest.fixture(scope="module")
def ddtrace_span():
    pytest.importorskip("ddtrace")
    from ddtrace._trace.span import Span

    if not hasattr(Span, "_meta"):
        pytest.skip("ddtrace's native spans keep their tags in native code")
    return Span


def test_v05_texts_built_per_span_are_one_entry_each_as_ddtrace_writes_them(ddtrace_span):
    traces = [_trace(fresh, ddtrace_span)]
    expected = ddtrace_payload("v0.5", traces)
    for path, payload in spanpack_paths("v0.5", traces).items():
        assert payload == expected, path
    table = unpack(expected)[0]
    assert len(table) == len(set(table)), "the reference table has no duplicates"


@pytest.mark.parametrize("version", VERSIONS_WITH_TABLES)
def test_payload_does_not_depend_on_cpython_having_hashed_a_str(version):
    def span(text_of, span_id):
        return {"trace_id": 7, "span_id": span_id, "parent_id": 0, "name": text_of("op"),
                "service": text_of("svc"), "resource": text_of("res"), "start_ns": 10,
                "duration_ns": 5,
                "meta": {text_of("value.%d" % i): text_of(t) for i, t in enumerate(TEXTS)}}

    def hashed(text):
        text = fresh(text)
        hash(text)
        return text

    payloads = []
    for text_of in (fresh, hashed, lambda text: text):
        trace = [span(text_of, span_id) for span_id in (1, 2, 3)]
        payloads.append(spanpack_paths(version, [trace]))
    assert payloads[0] == payloads[1] == payloads[2]


def test_v05_a_str_and_a_bytes_of_the_same_bytes_stay_two_entries():
    """Their table hashes are equal (the same bytes); the reference tracer
    keys its table by Python equality, where b"abc" != "abc"."""
    span = {"trace_id": 1, "span_id": 1, "name": "n", "start_ns": 1, "duration_ns": 1,
            "meta": {"k1": "abc", "k2": b"abc"}}
    table = unpack(spanpack.TraceMsgPackEncoder("v0.5").encode_traces([[span]]))[0]
    assert table.count("abc") == 2


def _legacy_str(text: str) -> str:
    """A str as a C extension using the pre-PEP 393 API makes it (CPython
    3.11 and older): no length or text in place until something makes it
    ready."""
    import ctypes

    api = ctypes.pythonapi
    api.PyUnicode_FromUnicode.restype = ctypes.py_object
    api.PyUnicode_FromUnicode.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
    api.PyUnicode_AsUnicode.restype = ctypes.c_void_p
    api.PyUnicode_AsUnicode.argtypes = (ctypes.py_object,)
    made = api.PyUnicode_FromUnicode(None, len(text))
    buffer = ctypes.create_unicode_buffer(text, len(text))
    ctypes.memmove(api.PyUnicode_AsUnicode(made), buffer, len(text) * ctypes.sizeof(ctypes.c_wchar))
    return made


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="CPython 3.12 removed the legacy str API")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("version", ["v0.4", *VERSIONS_WITH_TABLES])
@pytest.mark.parametrize("text", ["GET /users", "\u0436" * 30, "x" * 30_000])
def test_a_legacy_str_is_written_as_the_same_text_made_ready(version, text):
    """It is one entry with the equal ready str (v0.5, v1.0), and cut at
    25,000 code points like any str."""
    def trace(value_of):
        return [{"trace_id": 1, "span_id": span_id, "name": "n", "start_ns": 1, "duration_ns": 1,
                 "meta": {"a": value_of(text)}} for span_id in (1, 2)]

    first_legacy = trace(lambda value: value)
    first_legacy[0]["meta"]["a"] = _legacy_str(text)
    assert spanpack_paths(version, [first_legacy]) == spanpack_paths(version, [trace(fresh)])
