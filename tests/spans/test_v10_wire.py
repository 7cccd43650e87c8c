"""v1.0: one small test per wire rule, the expected bytes written out by hand
from the rules (docs/wire-format-v1.md) and the msgpack spec, never from
spanpack's output.  Helpers: ``H`` joins hex chunks, ``fs`` spells a fixstr.

Every payload here is also checked on all three entry points (encode_traces,
put + encode, encode_trace + join_encoded) and by the strict decoder.
"""

from __future__ import annotations

import pytest

import spanpack

from tests.support import good_span
from tests.v10_decoder import decode


def H(*chunks: str) -> bytes:
    return bytes.fromhex("".join(chunks).replace(" ", ""))


def fs(text: str) -> str:
    data = text.encode("utf-8")
    assert len(data) < 32
    return "%02x" % (0xA0 | len(data)) + data.hex()


# A bare encoder: no payload fields at all (language name and the versions
# are empty, so they are left out), so payloads start 81 0b (chunks only).
BARE = dict(language_name="", language_version="", tracer_version="")
# Chunk trace id of good_span(): trace_id 1 as 16 big-endian bytes.
TID1 = "06 c410" + "00" * 15 + "01"


def encode(traces, **options):
    """encode_traces, checked equal to put+encode and join_encoded, and
    accepted by the strict decoder."""
    options = {**BARE, **options}
    payload = spanpack.TraceMsgPackEncoder("v1.0", **options).encode_traces(traces)
    encoder = spanpack.TraceMsgPackEncoder("v1.0", **options)
    for trace in traces:
        encoder.put(trace)
    ((buffered, count),) = encoder.encode()
    assert (buffered, count) == (payload, len(traces))
    encoder = spanpack.TraceMsgPackEncoder("v1.0", **options)
    assert encoder.join_encoded([encoder.encode_trace(t) for t in traces]) == payload
    decode(payload)
    return payload


def chunk1(span_body: str, fields: int, tail: str = "") -> bytes:
    """Payload of one chunk holding one span (map of `fields` entries):
    {11: [{4: [span], 6: tid, ...tail}]}."""
    entries = 2 + tail.count("|")
    return H("81 0b 91", "%02x" % (0x80 | entries), "04 91", "%02x" % (0x80 | fields), span_body,
             TID1, tail.replace("|", ""))


# good_span(): service s, name n, resource r, span_id 2, start 5, duration 7.
BASIC = "01" + fs("s") + "02" + fs("n") + "03" + fs("r") + "04 02 06 05 07 07"


def test_basic_span():
    """Payload map {11: chunks}; chunk {4: spans, 6: trace id}; span keys 1-7
    (no span.kind tag: no kind key)."""
    assert encode([[good_span()]]) == chunk1(BASIC, 6)


def test_payload_fields_stream_first():
    """Payload keys 2-9 come first and their strings take ids 1, 2, ...: a
    span's service equal to the env is then written as id 2."""
    payload = encode([[good_span(service="prod")]], language_name="python", env="prod",
                     runtime_id="")
    expected = H("83 03", fs("python"), "07", fs("prod"), "0b 91 82 04 91 86",
                 "01 02 02", fs("n"), "03", fs("r"), "04 02 06 05 07 07", TID1)
    assert payload == expected


def test_payload_attributes():
    """Payload key 10: triplets key, type, value (1 string, 2 bool, 3 double,
    4 int64); text streamed like all others."""
    payload = encode([[good_span()]], payload_attributes={"a": "x", "b": True, "c": 1.5, "d": -2})
    assert payload[:2] == H("82 0a")
    assert payload[2:2 + 1 + 3 * 4 + 9 + 4] == H(
        "9c", fs("a"), "01", fs("x"), fs("b"), "02 c3", fs("c"), "03 cb 3ff8000000000000",
        fs("d"), "04 fe")


def test_repeated_strings_are_ids():
    """A string's second use is its id: "s" is id 1, so a resource "s" is 01."""
    payload = encode([[good_span(resource="s")]])
    assert payload == chunk1("01" + fs("s") + "02" + fs("n") + "03 01 04 02 06 05 07 07", 6)


def test_empty_string_is_id_zero():
    """"" is id 0, never written as a str; None leaves the field out."""
    payload = encode([[good_span(service="", resource=None)]])
    assert payload == chunk1("01 00 02" + fs("n") + "04 02 06 05 07 07", 5)


def test_ids_span_traces_and_payload():
    """Ids run across the whole payload: the second trace reuses ids 1-3."""
    second = good_span(trace_id=2, span_id=3)
    payload = encode([[good_span()], [second]])
    span2 = "86 01 01 02 02 03 03 04 03 06 05 07 07"
    assert payload == H("81 0b 92 82 04 91 86", BASIC, TID1,
                        "82 04 91", span2, "06 c410" + "00" * 15 + "02")


def test_parent_error_type():
    """parent_id (5) only when non-zero; error (8) true only when set; type (10)."""
    payload = encode([[good_span(parent_id=9, error=1, span_type="web")]])
    assert payload == chunk1(BASIC[:BASIC.index("04 02")] + "04 02 05 09 06 05 07 07 08 c3 0a"
                             + fs("web"), 9)


def test_attributes_triplets():
    """meta -> (key, 1, str), metrics -> (key, 4, int64) or (key, 3, double),
    meta_struct -> (key, 5, bin of the msgpack document), in one array."""
    span = good_span(meta={"k": "v"}, metrics={"i": 300, "f": 0.1}, meta_struct={"m": {"x": 1}})
    attributes = ("09 9c" + fs("k") + "01" + fs("v") + fs("i") + "04 cd012c"
                  + fs("f") + "03 cb 3fb999999999999a" + fs("m") + "05 c404 81" + fs("x") + "01")
    assert encode([[span]]) == chunk1(BASIC + attributes, 7)


def test_double_is_float32_when_exact():
    """A double that a float32 holds exactly is a float32 (ca, 4 bytes), which
    the agent widens to the same double; any other is a float64 (cb)."""
    metrics = {"a": 0.5, "b": -0.0, "c": 3.4028234663852886e38, "d": 0.1, "e": 1e39,
               "f": float("inf")}
    span = good_span(metrics=metrics)
    attributes = ("09 dc0012" + fs("a") + "03 ca 3f000000" + fs("b") + "03 ca 80000000"
                  + fs("c") + "03 ca 7f7fffff" + fs("d") + "03 cb 3fb999999999999a"
                  + fs("e") + "03 cb 48078287f49c4a1d" + fs("f") + "03 cb 7ff0000000000000")
    payload = encode([[span]])
    assert payload == chunk1(BASIC + attributes, 7)
    decoded = decode(payload)[11][0][4][0][9]
    assert [(key, value) for key, _type, value in decoded] == list(metrics.items())
    assert str(decoded[1][2]) == "-0.0"


def test_large_metric_int_is_double():
    """Ints in [2**63, 2**64) do not fit int64: a double (here 2**64 and
    2**63 + 2**11, float32 and float64)."""
    span = good_span(metrics={"u": 2**64 - 1, "v": 2**63 + 2**11})
    assert encode([[span]]) == chunk1(BASIC + "09 96" + fs("u") + "03 ca 5f800000"
                                      + fs("v") + "03 cb 43e0000000000001", 7)


@pytest.mark.parametrize("kind, number", [("server", 2), ("client", 3), ("producer", 4),
                                          ("consumer", 5), ("internal", 1)])
def test_span_kind(kind, number):
    """span.kind leaves the attributes for key 16, as its OTel number."""
    assert encode([[good_span(meta={"span.kind": kind})]]) == chunk1(BASIC + "10 %02x" % number, 7)


@pytest.mark.parametrize("kind", ["other", "Server", ""])
def test_span_kind_of_other_text_stays_an_attribute(kind):
    """Text outside the five kinds has no number that keeps it: it stays a
    string attribute, and the span has no key 16."""
    value = fs(kind) if kind else "00"
    assert encode([[good_span(meta={"span.kind": kind})]]) == chunk1(
        BASIC + "09 93" + fs("span.kind") + "01" + value, 7)


@pytest.mark.parametrize("key", ["env", "version", "component"])
def test_empty_field_tag_stays_an_attribute(key):
    """An empty env/version/component would read as none as a field."""
    assert encode([[good_span(meta={key: ""})]]) == chunk1(BASIC + "09 93" + fs(key) + "01 00", 7)


def test_env_version_component_fields():
    """env, version, component tags become keys 13, 14, 15."""
    span = good_span(meta={"env": "e", "version": "v", "component": "c", "x": "y"})
    assert encode([[span]]) == chunk1(
        BASIC + "09 93" + fs("x") + "01" + fs("y") + "0d" + fs("e") + "0e" + fs("v") + "0f" + fs("c")
       , 10)


def test_tag_moves_once_per_span():
    """A str and a bytes key of the same text: the first moves, the other
    stays an attribute (its key streamed as text)."""
    span = good_span(meta={"env": "a", b"env": "b"})
    assert encode([[span]]) == chunk1(BASIC + "09 93" + fs("env") + "01" + fs("b") + "0d" + fs("a"),
                                      8)


def test_attribute_header_shrinks_when_tags_move():
    """Six meta entries (an array16 of 18 before the tags are known), four of
    which move: a fixarray of 6.  Every entry point agrees (encode checks
    put+encode, whose string holes move with the header)."""
    meta = {"env": "e", "a": "1", "version": "v", "component": "c", "span.kind": "client",
            "b": "2"}
    span = good_span(meta=meta)
    attributes = "09 96" + fs("a") + "01" + fs("1") + fs("b") + "01" + fs("2")
    fields = "0d" + fs("e") + "0e" + fs("v") + "0f" + fs("c") + "10 03"
    assert encode([[span]]) == chunk1(BASIC + attributes + fields, 11)


def test_all_tags_moved_no_attributes():
    """Every entry becomes a field: no attributes key at all."""
    span = good_span(meta={"env": "e", "span.kind": "server"})
    assert encode([[span]]) == chunk1(BASIC + "0d" + fs("e") + "10 02", 8)


def test_sixteen_fields_map16():
    """All sixteen span keys: the span is a map16 (de 0010)."""
    span = good_span(parent_id=9, error=1, span_type="t",
                     meta={"env": "e", "version": "v", "component": "c", "span.kind": "server",
                           "x": "y"},
                     links=[{"trace_id": 3, "span_id": 4}],
                     events=[{"name": "n", "time_unix_nano": 9}])
    payload = encode([[span]])
    assert payload.startswith(H("81 0b 91 82 04 91 de0010 01", fs("s")))
    assert sorted(decode(payload)[11][0][4][0]) == list(range(1, 17))


def test_trace_id_128_and_tid_tag():
    """The chunk's trace id carries all 128 bits; _dd.p.tid is not written."""
    span = good_span(trace_id=(0xAB << 64) | 1, meta={"_dd.p.tid": "00000000000000ab"})
    payload = encode([[span]])
    assert payload == H("81 0b 91 82 04 91 86", BASIC, "06 c410", "00" * 7 + "ab",
                        "00" * 7 + "01")


def test_tid_tag_gives_high_half():
    """A 64-bit trace id with a _dd.p.tid tag on the first span: the tag is
    the high half."""
    span = good_span(meta={"_dd.p.tid": "00000000000000cd"})
    payload = encode([[span]])
    assert payload[-16:] == H("00" * 7 + "cd", "00" * 7 + "01")


def test_chunk_origin_priority_mechanism():
    """Origin -> chunk key 2; the first span's _sampling_priority_v1 -> key 1;
    its _dd.p.dm "-4" -> key 7 = 4; all three leave the span."""
    span = good_span(origin="rum", metrics={"_sampling_priority_v1": 2}, meta={"_dd.p.dm": "-4"})
    payload = encode([[span]])
    assert payload == H("81 0b 91 85 04 91 86", BASIC, TID1, "02", fs("rum"),
                        "01 02", "07 04")


def test_dm_and_priority_on_later_spans_stay():
    """Only the first span's decision maker and priority move to the chunk."""
    first = good_span()
    second = good_span(span_id=3, metrics={"_sampling_priority_v1": 1}, meta={"_dd.p.dm": "-4"})
    payload = encode([[first, second]])
    span2 = ("87 01 01 02 02 03 03 04 03 06 05 07 07 09 96" + fs("_dd.p.dm") + "01" + fs("-4")
             + fs("_sampling_priority_v1") + "04 01")
    assert payload == H("81 0b 91 82 04 92 86", BASIC, span2, TID1)


def test_links_and_events():
    """Links (key 11): {1: trace id bin16, 2: span id, 3: string triplets,
    4: tracestate, 5: flags | 2**31}; events (key 12): {1: time, 2: name,
    3: typed triplets, an array as type/value pairs}."""
    span = good_span(
        links=[{"trace_id": 3, "span_id": 4, "attributes": {"a": "b"}, "tracestate": "t",
                "flags": 1}],
        events=[{"name": "e", "time_unix_nano": 9, "attributes": {"l": [1, 2]}}],
    )
    link = ("0b 91 85 01 c410" + "00" * 15 + "03 02 04 03 93" + fs("a") + "01" + fs("b")
            + "04" + fs("t") + "05 ce80000001")
    event = "0c 91 83 01 09 02" + fs("e") + "03 93" + fs("l") + "06 94 04 01 04 02"
    assert encode([[span]]) == chunk1(BASIC + link + event, 8)


def test_long_text_truncated():
    """Text over 25,000 characters: its first 2,486 and "<truncated>..."."""
    payload = encode([[good_span(resource="x" * 25001)]])
    cut = ("x" * 2486 + "<truncated>...").encode()
    assert H("03 da09c4") + cut in payload
    assert b"x" * 2487 not in payload


def test_put_failed_trace_leaves_payload_unchanged():
    """A trace that fails half-way streams nothing: the next payload is the
    one an encoder that never saw it makes."""
    bad = [good_span(service="new"), good_span(span_id=3, meta={"k": 1})]
    encoder = spanpack.TraceMsgPackEncoder("v1.0", **BARE)
    with pytest.raises(TypeError, match="trace 0, span 1, meta key 'k'"):
        encoder.put(bad)
    with pytest.raises(TypeError):
        encoder.encode_traces([bad])
    encoder.put([good_span()])
    assert encoder.encode() == [(chunk1(BASIC, 6), 1)]


def test_split_payloads_each_stream_from_scratch():
    """Each payload split off by max_payload_size streams its own strings."""
    encoder = spanpack.TraceMsgPackEncoder("v1.0", max_payload_size=64, **BARE)
    encoder.put([good_span()])
    encoder.put([good_span()])
    payloads = encoder.encode()
    assert payloads == [(chunk1(BASIC, 6), 1)] * 2
    assert encoder.size == len(H("81 0b 90"))


def test_size_is_exact():
    encoder = spanpack.TraceMsgPackEncoder("v1.0", **BARE)
    encoder.put([good_span()])
    encoder.put([good_span(trace_id=2)])
    size = encoder.size
    ((payload, _),) = encoder.encode()
    assert size == len(payload)


@pytest.mark.parametrize("field, value, error", [
    ("start_ns", 1 << 64, ValueError), ("duration_ns", -(1 << 64), ValueError),
    ("span_id", 2**64, ValueError), ("parent_id", -1, ValueError), ("start_ns", 1.5, TypeError),
    ("start_ns", None, TypeError),
])
def test_out_of_range_refused(field, value, error):
    """v1.0 ids are uint64, times ints within 64 bits: anything else is
    refused, named."""
    with pytest.raises(error, match="trace 0, span 0, %s" % field):
        spanpack.TraceMsgPackEncoder("v1.0").encode_traces([[good_span(**{field: value})]])


@pytest.mark.parametrize("start, duration, written", [
    (-1, -5, "06 00 07 00"), (2**64 - 1, 2**63, "06 cf 7fffffffffffffff 07 cf 7fffffffffffffff"),
])
def test_times_clamped_like_v05(start, duration, written):
    """A negative time is 0 (the agent reads a negative duration as 0), one
    beyond int64 is 2**63 - 1: v0.5's rule, so every version takes it."""
    body = BASIC.replace("06 05 07 07", written)
    assert encode([[good_span(start_ns=start, duration_ns=duration)]]) == chunk1(body, 6)


def test_lenient_drops_bad_tags():
    """lenient: a bad meta value is dropped (and counted), nothing else."""
    encoder = spanpack.TraceMsgPackEncoder("v1.0", lenient=True, **BARE)
    payload = encoder.encode_traces([[good_span(meta={"k": 1, "a": "b"})]])
    assert payload == chunk1(BASIC + "09 93" + fs("a") + "01" + fs("b"), 7)
    assert encoder.dropped_tags == 1


def test_endpoint_headers_versions():
    encoder = spanpack.TraceMsgPackEncoder("v1.0")
    assert encoder.endpoint == "/v1.0/traces"
    assert encoder.headers(3)["X-Datadog-Trace-Count"] == "3"
    assert encoder.version == "v1.0"
    with pytest.raises(TypeError, match="v1.0"):
        spanpack.TraceMsgPackEncoder("v0.4", env="prod")


def test_agent_versions():
    assert spanpack.agent_versions({"endpoints": ["/v0.4/traces", "/v0.5/traces"]}) == ["v0.5", "v0.4"]
    assert spanpack.agent_versions({"endpoints": ["/v1.0/traces", "/v0.4/traces"]}) == ["v1.0", "v0.4"]
    assert spanpack.agent_versions({}) == []


def test_join_refuses_other_versions():
    part = spanpack.TraceMsgPackEncoder("v0.5").encode_trace([good_span()])
    with pytest.raises(ValueError, match="encoded for v0.5, this encoder writes v1.0"):
        spanpack.TraceMsgPackEncoder("v1.0").join_encoded([part])


def test_trace_origin_replaces_origin_tag():
    """A span's own _dd.origin tag gives way to the trace's origin (even
    ""), as v0.4 overwrites it; without a trace origin it stays a tag."""
    tagged = good_span(meta={"_dd.origin": "x"})
    assert encode([[dict(tagged, origin="")]]) == chunk1(BASIC, 6)
    assert encode([[tagged]]) == chunk1(
        BASIC + "09 93" + fs("_dd.origin") + "01" + fs("x"), 7)


def test_tag_key_shared_by_meta_and_metrics():
    """A key moved out of one map stays in the other: meta's env and the
    metrics' priority move, while the same str objects keying the other map
    remain attributes (the array header counts exactly what is written)."""
    env, priority = "env", "_sampling_priority_v1"      # one object each, in both maps
    span = good_span(meta={env: "e", priority: "p"}, metrics={env: 0.1, priority: 2})
    attributes = ("09 96" + fs(priority) + "01" + fs("p")
                  + fs(env) + "03 cb 3fb999999999999a")
    assert encode([[span]]) == chunk1(BASIC + attributes + "0d" + fs("e"), 8, "|01 02")
