"""One small test per wire rule, with the exact expected bytes written out.

The expected bytes are derived by hand from the wire format (the msgpack spec
and the rules in docs/wire-format.md, which follow ddtrace 4.2.3's encoder),
never by calling spanpack.  Only two helpers
are used to spell them: ``fs`` (a fixstr: ``a0|len`` + the UTF-8 bytes, for
strings shorter than 32 bytes) and ``H`` (concatenate hex chunks).
"""

from __future__ import annotations

import json

import msgpack
import pytest

import spanpack


def H(*chunks: str) -> bytes:
    """Bytes from hex chunks (spaces allowed)."""
    return bytes.fromhex("".join(chunks).replace(" ", ""))


def fs(text) -> str:
    """A fixstr as hex: a0|len, then the bytes (only for < 32 bytes)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    assert len(data) < 32
    return "%02x" % (0xA0 | len(data)) + data.hex()


# Keys of the v0.4 span map.
TRACE_ID, PARENT_ID, SPAN_ID = fs("trace_id"), fs("parent_id"), fs("span_id")
SERVICE, RESOURCE, NAME = fs("service"), fs("resource"), fs("name")
START, DURATION, ERROR, TYPE = fs("start"), fs("duration"), fs("error"), fs("type")
META, METRICS, META_STRUCT = fs("meta"), fs("metrics"), fs("meta_struct")
SPAN_LINKS, SPAN_EVENTS = fs("span_links"), fs("span_events")
ORIGIN_KEY = fs("_dd.origin")

# The key/value pairs of the basic test span: trace_id=1, span_id=2,
# service "s", resource "r", name "n", start 5, duration 7.
BASIC_HEAD = TRACE_ID + "01" + SPAN_ID + "02" + SERVICE + fs("s") + RESOURCE + fs("r") + NAME + fs("n")
BASIC_TIMES = START + "05" + DURATION + "07"
# A v0.5 table holding only the seeds "" and "_dd.origin".
V05_SEEDS = "a0" + ORIGIN_KEY


from tests.support import good_span as span


def encode(version, traces, **options):
    """encode_traces on a fresh encoder; also checks that the other two paths
    agree, so every wire rule holds on every path."""
    payload = spanpack.TraceMsgPackEncoder(version, **options).encode_traces(traces)
    encoder = spanpack.TraceMsgPackEncoder(version, **options)
    for trace in traces:
        encoder.put(trace)
    assert encoder.encode() == ([(payload, len(traces))] if traces else [])
    encoder = spanpack.TraceMsgPackEncoder(version, **options)
    assert encoder.join_encoded([encoder.encode_trace(t) for t in traces]) == payload
    return payload


def v04(*spans, **options):
    return encode("v0.4", [list(spans)], **options)


def v05(*spans, **options):
    return encode("v0.5", [list(spans)], **options)


# ---------------------------------------------------------------------------
# v0.4 span map: keys, order, omitted fields


def test_v04_minimal_span_exact_bytes():
    # Straight from the reference tracer's verified minimal payload.
    assert v04(span()) == H(
        "919187a874726163655f696401a77370616e5f696402a773657276696365a173a87265736f75726365a172"
        "a46e616d65a16ea5737461727405a86475726174696f6e07"
    )


def test_v04_every_key_in_reference_order():
    full = span(
        parent_id=9,
        error=1,
        span_type="web",
        links=[{"trace_id": 4, "span_id": 5}],
        events=[{"name": "e", "time_unix_nano": 1}],
        meta={"k": "v"},
        meta_struct={"m": 1},
        metrics={"x": 1},
    )
    assert v04(full, native_span_events=True) == H(
        "9191",
        "8f",  # 15 keys
        TRACE_ID, "01",
        PARENT_ID, "09",
        SPAN_ID, "02",
        SERVICE, fs("s"), RESOURCE, fs("r"), NAME, fs("n"),
        BASIC_TIMES,
        ERROR, "01",
        TYPE, fs("web"),
        SPAN_LINKS, "91 82", fs("trace_id"), "04", fs("span_id"), "05",
        SPAN_EVENTS, "91 82", fs("name"), fs("e"), fs("time_unix_nano"), "01",
        META, "81", fs("k"), fs("v"),
        META_STRUCT, "81", fs("m"), "c4 01 01",
        METRICS, "81", fs("x"), "01",
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"parent_id": None, "error": 0, "span_type": None, "meta": {}, "metrics": {}},
        {"meta": None, "metrics": None, "meta_struct": None, "links": None, "events": None},
        {"meta_struct": {}, "links": [], "events": []},
        {"error": False},
    ],
)
def test_v04_omitted_fields(overrides):
    assert v04(span(**overrides)) == H("91 91 87", BASIC_HEAD, BASIC_TIMES)


def test_v04_absent_optional_keys_of_a_dict_span():
    minimal = {"trace_id": 1, "span_id": 2, "name": "n", "start_ns": 5}
    # service and resource absent -> nil; duration absent -> nil (unfinished).
    assert v04(minimal) == H(
        "91 91 87", TRACE_ID, "01", SPAN_ID, "02", SERVICE, "c0", RESOURCE, "c0", NAME, fs("n"),
        START, "05", DURATION, "c0",
    )


def test_v04_parent_id_zero_is_written():
    assert v04(span(parent_id=0)) == H(
        "91 91 88", TRACE_ID, "01", PARENT_ID, "00", SPAN_ID, "02",
        SERVICE, fs("s"), RESOURCE, fs("r"), NAME, fs("n"), BASIC_TIMES,
    )


def test_v04_empty_span_type_is_written():
    assert v04(span(span_type="")) == H("91 91 88", BASIC_HEAD, BASIC_TIMES, TYPE, "a0")


@pytest.mark.parametrize("error", [1, 5, -1, 2**31, 2**70, True])
def test_v04_error_is_written_as_1(error):
    assert v04(span(error=error)) == H("91 91 88", BASIC_HEAD, BASIC_TIMES, ERROR, "01")


def test_v04_none_text_fields_are_nil():
    assert v04(span(service=None, resource=None, name=None)) == H(
        "91 91 87", TRACE_ID, "01", SPAN_ID, "02", SERVICE, "c0", RESOURCE, "c0", NAME, "c0",
        BASIC_TIMES,
    )


def test_v04_unfinished_span_has_nil_duration():
    assert v04(span(duration_ns=None)) == H("91 91 87", BASIC_HEAD, START, "05", DURATION, "c0")


# ---------------------------------------------------------------------------
# Integers: always the smallest form

UINT_FORMS = [
    (0, "00"),
    (1, "01"),
    (127, "7f"),
    (128, "cc 80"),
    (255, "cc ff"),
    (256, "cd 0100"),
    (65535, "cd ffff"),
    (65536, "ce 00010000"),
    (2**31, "ce 80000000"),
    (2**32 - 1, "ce ffffffff"),
    (2**32, "cf 0000000100000000"),
    (2**63 - 1, "cf 7fffffffffffffff"),
    (2**63, "cf 8000000000000000"),
    (2**64 - 1, "cf ffffffffffffffff"),
]
INT_FORMS = [
    (-1, "ff"),
    (-32, "e0"),
    (-33, "d0 df"),
    (-128, "d0 80"),
    (-129, "d1 ff7f"),
    (-32768, "d1 8000"),
    (-32769, "d2 ffff7fff"),
    (-(2**31), "d2 80000000"),
    (-(2**31) - 1, "d3 ffffffff7fffffff"),
    (-(2**63), "d3 8000000000000000"),
]


@pytest.mark.parametrize("value,form", UINT_FORMS)
def test_ids_smallest_uint(value, form):
    assert v04(span(span_id=value, parent_id=value, trace_id=value)) == H(
        "91 91 88", TRACE_ID, form, PARENT_ID, form, SPAN_ID, form,
        SERVICE, fs("s"), RESOURCE, fs("r"), NAME, fs("n"), BASIC_TIMES,
    )
    assert v05(span(span_id=value, parent_id=value, trace_id=value)) == H(
        "92 95", V05_SEEDS, fs("s"), fs("n"), fs("r"), "91 91 9c 02 03 04", form, form, form,
        "05 07 00 80 80 00",
    )


@pytest.mark.parametrize("value,form", UINT_FORMS[:12] + INT_FORMS)
def test_v04_start_and_duration_smallest_int(value, form):
    assert v04(span(start_ns=value, duration_ns=value)) == H(
        "91 91 87", BASIC_HEAD, START, form, DURATION, form
    )


@pytest.mark.parametrize("value,form", UINT_FORMS + INT_FORMS)
def test_metric_ints_smallest_form(value, form):
    assert v04(span(metrics={"m": value})) == H(
        "91 91 88", BASIC_HEAD, BASIC_TIMES, METRICS, "81", fs("m"), form
    )
    assert v05(span(metrics={"m": value})) == H(
        "92 96", V05_SEEDS, fs("s"), fs("n"), fs("r"), fs("m"),
        "91 91 9c 02 03 04 01 02 00 05 07 00 80 81 05", form, "00",
    )


@pytest.mark.parametrize(
    "value,form",
    [
        (1.0, "cb 3ff0000000000000"),
        (0.5, "cb 3fe0000000000000"),
        (-0.0, "cb 8000000000000000"),
        (float("nan"), "cb 7ff8000000000000"),
        (float("inf"), "cb 7ff0000000000000"),
        (float("-inf"), "cb fff0000000000000"),
        (1e300, "cb 7e37e43c8800759c"),
        (1, "01"),
        (True, "01"),
        (False, "00"),
    ],
)
def test_float64_only_for_float_metrics(value, form):
    assert v04(span(metrics={"m": value})) == H(
        "91 91 88", BASIC_HEAD, BASIC_TIMES, METRICS, "81", fs("m"), form
    )


def test_map16_header_for_16_metrics():
    metrics = {chr(ord("a") + i): i for i in range(16)}
    entries = "".join(fs(chr(ord("a") + i)) + "%02x" % i for i in range(16))
    assert v04(span(metrics=metrics)) == H("91 91 88", BASIC_HEAD, BASIC_TIMES, METRICS, "de 0010", entries)


# ---------------------------------------------------------------------------
# Text


@pytest.mark.parametrize("kind", [bytes, bytearray, str])
@pytest.mark.parametrize(
    "length,header",
    [(0, "a0"), (1, "a1"), (31, "bf"), (32, "d9 20"), (255, "d9 ff"), (256, "da 0100"), (25000, "da 61a8")],
)
def test_str_headers_for_text_and_bytes_values(kind, length, header):
    value = "v" * length if kind is str else kind(b"v" * length)
    assert v04(span(meta={"k": value})) == H(
        "91 91 88", BASIC_HEAD, BASIC_TIMES, META, "81", fs("k"), header, "76" * length
    )


def test_bytes_keys_and_values_are_str_not_bin():
    assert v04(span(meta={b"k": b"\xc3\xa9"}, metrics={b"m": 1})) == H(
        "91 91 89", BASIC_HEAD, BASIC_TIMES, META, "81 a1 6b a2 c3a9", METRICS, "81 a1 6d 01"
    )


def test_non_ascii_text_is_utf8():
    assert v04(span(service="\u00e9\U0001F600")) == H(
        "91 91 87", TRACE_ID, "01", SPAN_ID, "02", SERVICE, "a6 c3a9 f09f9880",
        RESOURCE, fs("r"), NAME, fs("n"), BASIC_TIMES,
    )


TRUNCATED_SUFFIX = b"<truncated>...".hex()


@pytest.mark.parametrize(
    "value,expected_hex",
    [
        ("x" * 25000, "da 61a8" + "78" * 25000),
        ("x" * 25001, "da 09c4" + "78" * 2486 + TRUNCATED_SUFFIX),
        ("x" * 100000, "da 09c4" + "78" * 2486 + TRUNCATED_SUFFIX),
        # Code points, not bytes: 2,486 two-byte characters.
        ("\u00e9" * 25001, "da 137a" + "c3a9" * 2486 + TRUNCATED_SUFFIX),
        ("\u00e9" * 25000, "da c350" + "c3a9" * 25000),
        (b"x" * 25001, "da 09c4" + "78" * 2486 + TRUNCATED_SUFFIX),
        # Bytes are cut on a UTF-8 boundary: the 3-byte character at bytes
        # 2485..2487 would be split at 2486, so it is dropped whole.
        (b"x" * 2485 + "\u4e2d".encode() + b"x" * 30000, "da 09c3" + "78" * 2485 + TRUNCATED_SUFFIX),
        (b"x" * 2484 + "\u00e9".encode() + b"x" * 30000, "da 09c4" + "78" * 2484 + "c3a9" + TRUNCATED_SUFFIX),
        (b"x" * 2483 + "\U0001F600".encode() + b"x" * 30000, "da 09c1" + "78" * 2483 + TRUNCATED_SUFFIX),
    ],
)
def test_truncation_of_text_over_25000(value, expected_hex):
    assert v04(span(meta={"k": value})) == H(
        "91 91 88", BASIC_HEAD, BASIC_TIMES, META, "81", fs("k"), expected_hex
    )


def test_truncation_applies_to_every_text_field():
    long = "q" * 25001
    cut = "da 09c4" + "71" * 2486 + TRUNCATED_SUFFIX
    assert v04(span(service=long, resource=long, name=long, span_type=long, meta={long: long}, metrics={long: 1})) == H(
        "91 91 8a", TRACE_ID, "01", SPAN_ID, "02", SERVICE, cut, RESOURCE, cut, NAME, cut,
        BASIC_TIMES, TYPE, cut, META, "81", cut, cut, METRICS, "81", cut, "01",
    )


# ---------------------------------------------------------------------------
# Trace-level values: _dd.origin and _dd.p.tid


def test_origin_on_every_span_of_the_chunk():
    first = span(origin="synthetics")
    second = span(span_id=3, meta={"k": "v"})
    expected_meta = ORIGIN_KEY + fs("synthetics")
    assert encode("v0.4", [[first, second]]) == H(
        "91 92",
        "88", BASIC_HEAD, BASIC_TIMES, META, "81", expected_meta,
        "88", TRACE_ID, "01", SPAN_ID, "03", SERVICE, fs("s"), RESOURCE, fs("r"), NAME, fs("n"),
        BASIC_TIMES, META, "82", fs("k"), fs("v"), expected_meta,
    )


def test_origin_of_a_later_span_is_ignored():
    assert encode("v0.4", [[span(), span(origin="synthetics")]]) == H(
        "91 92 87", BASIC_HEAD, BASIC_TIMES, "87", BASIC_HEAD, BASIC_TIMES
    )


def test_origin_written_twice_when_meta_has_it():
    chunk_root = span(origin="synthetics", meta={"_dd.origin": "synthetics"})
    assert v04(chunk_root) == H(
        "91 91 88", BASIC_HEAD, BASIC_TIMES, META, "82",
        ORIGIN_KEY, fs("synthetics"), ORIGIN_KEY, fs("synthetics"),
    )
    # v0.5: idx 1 -> idx("synthetics") twice.
    assert v05(chunk_root) == H(
        "92 96", V05_SEEDS, fs("synthetics"), fs("s"), fs("n"), fs("r"),
        "91 91 9c 03 04 05 01 02 00 05 07 00 82 01 02 01 02 80 00",
    )


def test_empty_origin_v04_written_v05_omitted():
    assert v04(span(origin="")) == H("91 91 88", BASIC_HEAD, BASIC_TIMES, META, "81", ORIGIN_KEY, "a0")
    assert v05(span(origin="")) == H(
        "92 95", V05_SEEDS, fs("s"), fs("n"), fs("r"), "91 91 9c 02 03 04 01 02 00 05 07 00 80 80 00"
    )


def test_long_origin_is_written_whole_in_v04():
    origin = "o" * 70000
    assert v04(span(origin=origin)) == H(
        "91 91 88", BASIC_HEAD, BASIC_TIMES, META, "81", ORIGIN_KEY, "db 00011170", "6f" * 70000
    )


def test_trace_id_high_tag_on_the_first_span():
    trace_id = (0xABC << 64) | 5
    spans = [span(trace_id=trace_id, meta={"k": "v"}, origin="o"), span(trace_id=trace_id, span_id=3)]
    tid = fs("_dd.p.tid") + fs("0000000000000abc")
    assert encode("v0.4", [spans]) == H(
        "91 92",
        "88", TRACE_ID, "05", SPAN_ID, "02", SERVICE, fs("s"), RESOURCE, fs("r"), NAME, fs("n"),
        BASIC_TIMES, META, "83", fs("k"), fs("v"), tid, ORIGIN_KEY, fs("o"),
        "88", TRACE_ID, "05", SPAN_ID, "03", SERVICE, fs("s"), RESOURCE, fs("r"), NAME, fs("n"),
        BASIC_TIMES, META, "81", ORIGIN_KEY, fs("o"),
    )
    # v0.5: table "", _dd.origin, o, s, n, r, k, v, _dd.p.tid, 0000000000000abc.
    assert encode("v0.5", [spans]) == H(
        "92 9a", V05_SEEDS, fs("o"), fs("s"), fs("n"), fs("r"), fs("k"), fs("v"),
        fs("_dd.p.tid"), fs("0000000000000abc"),
        "91 92",
        "9c 03 04 05 05 02 00 05 07 00 83 06 07 08 09 01 02 80 00",
        "9c 03 04 05 05 03 00 05 07 00 81 01 02 80 00",
    )


def test_trace_id_high_tag_not_added_when_present_or_not_needed():
    present = span(trace_id=(1 << 127) | 1, meta={"_dd.p.tid": "x"})
    assert v04(present) == H(
        "91 91 88", TRACE_ID, "01", SPAN_ID, "02", SERVICE, fs("s"), RESOURCE, fs("r"), NAME, fs("n"),
        BASIC_TIMES, META, "81", fs("_dd.p.tid"), fs("x"),
    )
    assert v04(span(trace_id=2**64 - 1)) == H(
        "91 91 87", TRACE_ID, "cf ffffffffffffffff", SPAN_ID, "02", SERVICE, fs("s"), RESOURCE, fs("r"),
        NAME, fs("n"), BASIC_TIMES,
    )


def test_trace_id_of_the_first_span_for_every_span():
    spans = [span(trace_id=(1 << 64) | 7, meta={"_dd.p.tid": "0000000000000001"}), span(trace_id=9, span_id=3)]
    payload = encode("v0.4", [spans])
    decoded = msgpack.unpackb(payload)
    assert [s["trace_id"] for s in decoded[0]] == [7, 7]


# ---------------------------------------------------------------------------
# Span links


LINK = {
    "trace_id": (7 << 64) | 2,
    "span_id": 3,
    "attributes": {"a": "b", "l": [1, True]},
    "tracestate": "dd=s:1",
    "flags": 1,
}
LINK_JSON = (
    '[{"trace_id": "00000000000000070000000000000002", "span_id": "0000000000000003", '
    '"attributes": {"a": "b", "l.0": "1", "l.1": "true"}, "tracestate": "dd=s:1", "flags": 1}]'
)


def test_span_links_v04():
    expected_link = (
        "86"
        + fs("trace_id") + "02"
        + fs("span_id") + "03"
        + fs("attributes") + "83" + fs("a") + fs("b") + fs("l.0") + fs("1") + fs("l.1") + fs("true")
        + fs("tracestate") + fs("dd=s:1")
        + fs("flags") + "ce 80000001"
        + fs("trace_id_high") + "07"
    )
    assert v04(span(links=[LINK])) == H("91 91 88", BASIC_HEAD, BASIC_TIMES, SPAN_LINKS, "91", expected_link)


@pytest.mark.parametrize(
    "link,expected",
    [
        ({"trace_id": 4, "span_id": 5, "flags": 0}, "83" + fs("trace_id") + "04" + fs("span_id") + "05" + fs("flags") + "ce 80000000"),
        ({"trace_id": 4, "span_id": 5, "tracestate": "", "attributes": {}}, "82" + fs("trace_id") + "04" + fs("span_id") + "05"),
        ({"trace_id": 1 << 64, "span_id": 5}, "83" + fs("trace_id") + "00" + fs("span_id") + "05" + fs("trace_id_high") + "01"),
    ],
)
def test_span_link_optional_keys_v04(link, expected):
    assert v04(span(links=[link])) == H("91 91 88", BASIC_HEAD, BASIC_TIMES, SPAN_LINKS, "91", expected)


def test_span_links_v05_as_json_in_meta():
    length = len(LINK_JSON)
    assert length < 256
    assert v05(span(links=[LINK])) == H(
        "92 97", V05_SEEDS, fs("s"), fs("n"), fs("r"), fs("_dd.span_links"),
        "d9 %02x" % length, LINK_JSON.encode().hex(),
        "91 91 9c 02 03 04 01 02 00 05 07 00 81 05 06 80 00",
    )


def test_span_link_dropped_attributes_count_only_in_v05():
    """docs/wire-format.md: a v0.4 link leaves dropped_attributes_count out
    (libdatadog rejects it); v0.5's JSON keeps it."""
    link = {"trace_id": 4, "span_id": 5, "dropped_attributes_count": 2}
    assert v04(span(links=[link])) == H(
        "91 91 88", BASIC_HEAD, BASIC_TIMES, SPAN_LINKS, "91 82", fs("trace_id"), "04", fs("span_id"), "05"
    )
    text = '[{"trace_id": "00000000000000000000000000000004", "span_id": "0000000000000005", "dropped_attributes_count": 2}]'
    assert v05(span(links=[link])) == H(
        "92 97", V05_SEEDS, fs("s"), fs("n"), fs("r"), fs("_dd.span_links"), "d9 %02x" % len(text), text.encode().hex(),
        "91 91 9c 02 03 04 01 02 00 05 07 00 81 05 06 80 00",
    )


# ---------------------------------------------------------------------------
# Span events

EVENT = {"name": "e", "time_unix_nano": 9, "attributes": {"k": "\u00e9"}}
EVENT_JSON = '[{"name": "e", "time_unix_nano": 9, "attributes": {"k": "\\u00e9"}}]'


def test_span_events_as_json_in_meta():
    json_hex = "d9 %02x" % len(EVENT_JSON) + EVENT_JSON.encode().hex()
    assert v04(span(events=[EVENT], meta={"m": "v"})) == H(
        "91 91 88", BASIC_HEAD, BASIC_TIMES, META, "82", fs("m"), fs("v"), fs("events"), json_hex
    )
    assert v05(span(events=[EVENT])) == H(
        "92 97", V05_SEEDS, fs("s"), fs("n"), fs("r"), fs("events"), json_hex,
        "91 91 9c 02 03 04 01 02 00 05 07 00 81 05 06 80 00",
    )


def test_span_events_json_is_python_json_dumps():
    events = [{"name": "x", "time_unix_nano": 2**64 - 1, "attributes": {"f": 1e20, "n": float("nan"), "l": [True, None]}}]
    text = json.dumps(events)
    assert text == '[{"name": "x", "time_unix_nano": 18446744073709551615, "attributes": {"f": 1e+20, "n": NaN, "l": [true, null]}}]'
    decoded = msgpack.unpackb(v04(span(events=events)))
    assert decoded[0][0]["meta"] == {"events": text}


def test_native_span_events_typed_attributes():
    event = {
        "name": "e",
        "time_unix_nano": 9,
        "attributes": {"s": "x", "b": True, "i": -2, "d": 1.5, "a": [1, "y"]},
    }

    def attr(type_code, key, value_hex):
        return "82" + fs("type") + type_code + fs(key) + value_hex

    expected_attributes = (
        "85"
        + fs("s") + attr("00", "string_value", fs("x"))
        + fs("b") + attr("01", "bool_value", "c3")
        + fs("i") + attr("02", "int_value", "fe")
        + fs("d") + attr("03", "double_value", "cb 3ff8000000000000")
        + fs("a") + attr("04", "array_value", "81" + fs("values") + "92"
                         + attr("02", "int_value", "01") + attr("00", "string_value", fs("y")))
    )
    assert v04(span(events=[event]), native_span_events=True) == H(
        "91 91 88", BASIC_HEAD, BASIC_TIMES, SPAN_EVENTS,
        "91 83", fs("name"), fs("e"), fs("time_unix_nano"), "09", fs("attributes"), expected_attributes,
    )


def test_native_span_event_without_attributes():
    assert v04(span(events=[{"name": "e", "time_unix_nano": 2**32}]), native_span_events=True) == H(
        "91 91 88", BASIC_HEAD, BASIC_TIMES, SPAN_EVENTS,
        "91 82", fs("name"), fs("e"), fs("time_unix_nano"), "cf 0000000100000000",
    )


def test_native_span_events_do_not_affect_v05():
    assert v05(span(events=[EVENT]), native_span_events=True) == v05(span(events=[EVENT]))


# ---------------------------------------------------------------------------
# meta_struct


def test_meta_struct_v04_bin_documents():
    meta_struct = {"appsec": {"a": 1}, "raw": [b"\x00", None, "t", -1, 0.5]}
    second = "95 c4 01 00 c0 a1 74 ff cb 3fe0000000000000"
    assert v04(span(meta_struct=meta_struct)) == H(
        "91 91 88", BASIC_HEAD, BASIC_TIMES, META_STRUCT, "82",
        fs("appsec"), "c4 04 81 a1 61 01",
        fs("raw"), "c4 %02x" % (len(second.replace(" ", "")) // 2), second,
    )


def test_meta_struct_dropped_in_v05():
    assert v05(span(meta_struct={"appsec": {"a": 1}})) == H(
        "92 95", V05_SEEDS, fs("s"), fs("n"), fs("r"), "91 91 9c 02 03 04 01 02 00 05 07 00 80 80 00"
    )


# ---------------------------------------------------------------------------
# v0.5


def test_v05_minimal_span_exact_bytes():
    assert v05(span()) == H("9295a0aa5f64642e6f726967696ea173a16ea17291919c020304010200050700808000")


def test_v05_none_and_empty_strings_are_index_0():
    assert v05(span(service=None, name="", resource=None, span_type=None, meta={"k": ""})) == H(
        "92 93", V05_SEEDS, fs("k"), "91 91 9c 00 00 00 01 02 00 05 07 00 81 02 00 80 00"
    )


def test_v05_table_order_and_sharing_across_traces():
    first = span(meta={"k": "v"}, metrics={"m": 1}, span_type="t")
    second = span(service="B", meta={"v": "k"})
    # First use order: s n r k v m t, then B.
    assert encode("v0.5", [[first], [second]]) == H(
        "92 9a", V05_SEEDS, fs("s"), fs("n"), fs("r"), fs("k"), fs("v"), fs("m"), fs("t"), fs("B"),
        "92",
        "91 9c 02 03 04 01 02 00 05 07 00 81 05 06 81 07 01 08",
        "91 9c 09 03 04 01 02 00 05 07 00 81 06 05 80 00",
    )


@pytest.mark.parametrize(
    "error,form",
    [(0, "00"), (None, "00"), (False, "00"), (True, "01"), (5, "05"), (-3, "fd"),
     (2**31 - 1, "ce 7fffffff"), (-(2**31), "d2 80000000")],
)
def test_v05_error_is_its_int32_value(error, form):
    assert v05(span(error=error)) == H(
        "92 95", V05_SEEDS, fs("s"), fs("n"), fs("r"), "91 91 9c 02 03 04 01 02 00 05 07", form, "80 80 00"
    )


@pytest.mark.parametrize(
    "value,form",
    [
        (-5, "00"),
        (-(2**64) + 1, "00"),
        (0, "00"),
        (2**63 - 1, "cf 7fffffffffffffff"),
        (2**63, "cf 7fffffffffffffff"),
        (2**64 - 1, "cf 7fffffffffffffff"),
    ],
)
def test_v05_start_and_duration_clamped(value, form):
    assert v05(span(start_ns=value, duration_ns=value)) == H(
        "92 95", V05_SEEDS, fs("s"), fs("n"), fs("r"), "91 91 9c 02 03 04 01 02 00", form, form, "00 80 80 00"
    )


@pytest.mark.parametrize("field", ["start_ns", "duration_ns"])
@pytest.mark.parametrize("value", [2**64, -(2**64), 2**70])
def test_times_beyond_64_bits_raise_in_both_versions(field, value):
    """Clamping a time that does not fit in 64 bits would send a time the
    span never had: both versions refuse it, naming the field."""
    for version in ("v0.4", "v0.5"):
        with pytest.raises(ValueError, match=r"^trace 0, span 0, %s: " % field):
            spanpack.TraceMsgPackEncoder(version).encode_traces([[span(**{field: value})]])


def test_v05_unfinished_span_duration_0():
    assert v05(span(duration_ns=None)) == H(
        "92 95", V05_SEEDS, fs("s"), fs("n"), fs("r"), "91 91 9c 02 03 04 01 02 00 05 00 00 80 80 00"
    )


def test_v05_parent_id_none_is_0():
    assert v05(span(parent_id=None)) == v05(span(parent_id=0))


def _table_span(new_strings):
    """A span adding exactly `new_strings` entries to the v0.5 table."""
    return span(service=None, name="", resource=None, meta={"k%06d" % i: "" for i in range(new_strings)})


def _table_entries_hex(new_strings):
    return "".join(fs("k%06d" % i) for i in range(new_strings))


@pytest.mark.parametrize(
    "entries,header", [(15, "9f"), (16, "dc 0010"), (65535, "dc ffff"), (65536, "dd 00010000")]
)
def test_v05_table_header(entries, header):
    payload = v05(_table_span(entries - 2))
    table = V05_SEEDS + _table_entries_hex(entries - 2)
    assert payload.startswith(H("92", header, table, "91 91 9c 00 00 00 01 02 00 05 07 00"))
    # The meta map: entries - 2 pairs index -> 0, in a map16 or map32.
    count = entries - 2
    meta_header = "%02x" % (0x80 | count) if count < 16 else ("de %04x" % count if count < 65536 else "df %08x" % count)
    rest = payload[len(H("92", header, table, "91 91 9c 00 00 00 01 02 00 05 07 00")):]
    assert rest.startswith(H(meta_header))
    assert rest.endswith(H("80 00"))


# ---------------------------------------------------------------------------
# The outer array of traces


@pytest.mark.parametrize(
    "count,header", [(0, "90"), (1, "91"), (15, "9f"), (16, "dc 0010"), (65535, "dc ffff"), (65536, "dd 00010000")]
)
def test_traces_array_header(count, header):
    assert spanpack.TraceMsgPackEncoder("v0.4").encode_traces([[]] * count) == H(header, "90" * count)
    assert spanpack.TraceMsgPackEncoder("v0.5").encode_traces([[]] * count) == H("92 92", V05_SEEDS, header, "90" * count)


def test_encoder_attributes():
    for version in ("v0.4", "v0.5"):
        encoder = spanpack.TraceMsgPackEncoder(version)
        assert encoder.version == version
        assert encoder.content_type == "application/msgpack"
        assert encoder.endpoint == "/%s/traces" % version
        assert len(encoder) == 0
        assert encoder.encode() == []
    # Empty buffered sizes, as the reference encoder reports them.
    assert spanpack.TraceMsgPackEncoder("v0.4").size == 1
    assert spanpack.TraceMsgPackEncoder("v0.5").size == 15


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_metrics_written_as_float64(value):
    """NaN and infinities are kept as the float64 the tracer set: msgpack
    carries them and the agent's decoders accept them (ddtrace's own
    set_metric refuses to store them, so its spans never hold one)."""
    expected_value = msgpack.packb(value)  # cb + the IEEE 754 bits
    assert expected_value[0] == 0xCB
    for version in ("v0.4", "v0.5"):
        payload = spanpack.TraceMsgPackEncoder(version).encode_traces([[span(metrics={"m": value})]])
        assert expected_value in payload
        decoded = msgpack.unpackb(payload, strict_map_key=False)
        metrics = decoded[0][0]["metrics"] if version == "v0.4" else decoded[1][0][0][10]
        (got,) = metrics.values()
        assert (got != got) if value != value else got == value
