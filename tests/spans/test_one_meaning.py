"""One trace, one meaning: v0.4, v0.5 and v1.0 accept or refuse the same
traces, and what they accept decodes to the same spans, through every entry
point (docs/wire-format.md, "One trace, one meaning", has the rule table).

Each payload is decoded with an independent reader (msgpack-python for
v0.4/v0.5, tests/v10_decoder.py for v1.0) into one canonical span form;
``canonical_*`` below undo only what each format spells differently and the
documented list of what a format cannot hold (v0.5's meta_struct, counted in
``dropped_tags`` instead), each step with its reason.
"""

from __future__ import annotations

import enum
import json
import struct
from typing import Any, Dict, List, Optional, Tuple

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spanpack._spanpack import MAX_TEXT_LEN, TRUNCATED_PREFIX_LEN, TRUNCATION_SUFFIX
from spanpack import TraceMsgPackEncoder

from tests import support
from tests.support import I64_MAX, U64
from tests.v10_decoder import decode as decode_v10

VERSIONS = ("v0.4", "v0.5", "v1.0")
ENTRY_POINTS = ("encode_traces", "encode_trace+join_encoded", "put+encode")
KIND_NAMES = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


# ---------------------------------------------------------------------------
# Subclasses of the attribute value types (numpy.float64 is a float subclass)


class Ratio(float):
    pass


class Count(int):
    pass


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 3


class Label(str):
    pass


def _subclassed(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return Level.HIGH if value == 3 else Count(value)
    if isinstance(value, float):
        return Ratio(value)
    if isinstance(value, str):
        return Label(value)
    if isinstance(value, list):
        return [_subclassed(item) for item in value]
    return value


# ---------------------------------------------------------------------------
# Inputs: generated traces, odd and bad values included

# Values a tag that v1.0 turns into a field may hold: good, odd and bad.
_FIELD_TAG_VALUES = {
    "env": st.sampled_from(["prod", "", b"staging", "\u00e9t\u00e9", b"\xff", "\ud800", 5]),
    "version": st.sampled_from(["1.2.3", "", "x" * 25001, "\ud800", None]),
    "component": st.sampled_from(["flask", b"", b"\xc3\xa9", b"\xff", 2.5]),
    "span.kind": st.sampled_from(["server", "client", "producer", "consumer", "internal",
                                  "CLIENT", "gateway", "", b"server", "\ud800", 1]),
    "_dd.p.dm": st.sampled_from(["-4", "-04", "-0", "-x", "4", b"-3", 7]),
    "_dd.origin": st.sampled_from(["synthetics", "\u00e9", b"\xff", 3]),
    "_dd.p.tid": st.sampled_from(["0000000000000000", "00000000000000ab", "ABCDEF0123456789",
                                  "zz", "abc", b"00000000000000cd", 12]),
}
_BAD_META = st.sampled_from([5, None, b"\xff", "\ud800", bytearray(b"\xfe")])
_BAD_METRICS = st.sampled_from(["x", None, 2**70, -(2**64), b"1"])
_BAD_META_STRUCT = st.sampled_from([{"c": 1j}, object()])
# Beyond 64 bits: refused by every version.
_BAD_TIMES = st.sampled_from([1 << 64, -(1 << 64), 1 << 70])
_ERRORS = st.one_of(support.errors, st.integers(-(2**70), 2**70))


def _refused_text(value: Any) -> bool:
    """Would v0.4 refuse this as a meta value?"""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, (bytes, bytearray)):
        try:
            bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return True
        return False
    return True


def _drop_text_twins(tags: Dict[Any, Any]) -> Dict[Any, Any]:
    """A str key and a bytes key of the same text are two entries to Python
    and one to every decoder (the last one read wins); keep the first."""
    seen, out = set(), {}
    for key, value in tags.items():
        text = key.decode("utf-8", "surrogatepass") if isinstance(key, (bytes, bytearray)) else key
        if text not in seen:
            seen.add(text)
            out[key] = value
    return out


@st.composite
def mixed_traces(draw) -> Tuple[List[Dict[str, Any]], bool]:
    """Logical traces (tests.support) with times anywhere within 64 bits,
    errors beyond 32 bits, empty traces, subclassed link and event values,
    the tags v1.0 moves holding good, odd and bad values, and sometimes a bad
    entry or time; and whether one of the bad values was put in."""
    traces = draw(st.lists(support.logical_traces(max_spans=3, v05_times=True), max_size=2))
    bad = False
    for trace in traces:
        for span in trace["spans"]:
            span["meta"] = dict(span["meta"])
        for span in trace["spans"]:
            # Own copies: a strategy may hand out one dict (st.just({})) again.
            for field in ("meta", "metrics", "meta_struct"):
                span[field] = dict(span[field])
            span["error"] = draw(_ERRORS)
            # v0.5 writes links and events as JSON under these keys, over a
            # tag of the same name (documented).
            span["meta"].pop("events", None)
            span["meta"].pop("_dd.span_links", None)
            for name, values in _FIELD_TAG_VALUES.items():
                if draw(st.integers(0, 3)) == 0:
                    value = draw(values)
                    bad = bad or _refused_text(value)
                    span["meta"][draw(st.sampled_from([name, name.encode()]))] = value
            if draw(st.integers(0, 4)) == 0:
                priority = draw(st.sampled_from([1, -1, 2, True, 2.0, 2**40, "x"]))
                bad = bad or priority == "x"
                span["metrics"]["_sampling_priority_v1"] = priority
            for event in span["events"]:
                event["attributes"] = {k: _subclassed(v) for k, v in event["attributes"].items()}
            for link in span["links"]:
                link["attributes"] = {k: _subclassed(v) for k, v in link["attributes"].items()}
            if draw(st.integers(0, 9)) == 0:
                bad = True
                where = draw(st.sampled_from(["meta", "metrics", "meta_struct", "start_ns",
                                              "duration_ns"]))
                if where == "meta":
                    span["meta"][draw(support.short_text)] = draw(_BAD_META)
                elif where == "metrics":
                    span["metrics"][draw(support.short_text)] = draw(_BAD_METRICS)
                elif where == "meta_struct":
                    span["meta_struct"][draw(support.short_text)] = draw(_BAD_META_STRUCT)
                else:
                    span[where] = draw(_BAD_TIMES)
            span["meta"] = _drop_text_twins(span["meta"])
            span["metrics"] = _drop_text_twins(span["metrics"])
    if draw(st.integers(0, 5)) == 0:
        traces.insert(draw(st.integers(0, len(traces))), {"spans": [], "origin": None})
    return traces, bad


def _as_spans(traces: List[Dict[str, Any]], form: str) -> List[list]:
    return [support.to_form(trace, form) if trace["spans"] else [] for trace in traces]


# The largest payload the strategy can make, with room: its longest span
# (tests.support.largest_generated_trace) times the most spans, doubled for
# the odd tags added here.
_LARGEST_SPAN = len(TraceMsgPackEncoder("v0.4", native_span_events=True).encode_traces(
    [support.to_form(support.largest_generated_trace(), "dict")]))
MAX_SIZE = 2 * 2 * 3 * _LARGEST_SPAN


# ---------------------------------------------------------------------------
# Encoding through every entry point


def _encoder(version: str, lenient: bool) -> TraceMsgPackEncoder:
    return TraceMsgPackEncoder(version, native_span_events=True, lenient=lenient,
                               max_size=MAX_SIZE, max_item_size=MAX_SIZE)


def _encode(version: str, traces: List[Dict[str, Any]], entry: str, form: str,
            lenient: bool) -> Tuple[str, Any, int]:
    """("ok", payload, dropped_tags) or ("refused", exception type, 0)."""
    encoder = _encoder(version, lenient)
    spans = _as_spans(traces, form)
    try:
        if entry == "encode_traces":
            payload = encoder.encode_traces(spans)
        elif entry == "encode_trace+join_encoded":
            payload = encoder.join_encoded([encoder.encode_trace(trace) for trace in spans])
        else:
            for trace in spans:
                encoder.put(trace)
            payloads = encoder.encode()
            assert len(payloads) <= 1
            payload = payloads[0][0] if payloads else _encoder(version, lenient).encode_traces([])
    except (TypeError, ValueError) as e:
        return "refused", type(e), 0
    return "ok", payload, encoder.dropped_tags


# ---------------------------------------------------------------------------
# Canonical spans


def _time(value: Optional[int]) -> int:
    # The agent reads a negative duration as 0 and a start before 2000 as a
    # clock fault; v0.5 and v1.0 write both as 0, v0.4 writes them as given.
    return 0 if value is None or value < 0 else value


def _number(value: Any) -> Any:
    # v1.0 carries ints as int64: a larger one travels as a double.
    if isinstance(value, int) and value > I64_MAX:
        value = float(value)
    if isinstance(value, float):
        return ("double", struct.pack(">d", value))
    return ("int", int(value))


def _finish(meta: Dict[str, str]) -> Dict[str, str]:
    # An empty origin is no origin (v0.4 writes the "" entry, the others
    # leave it out); v0.4 writes a long origin whole, the others cut it as
    # every text.
    if meta.get("_dd.origin") == "":
        del meta["_dd.origin"]
    origin = meta.get("_dd.origin")
    if origin is not None and len(origin) > MAX_TEXT_LEN:
        meta["_dd.origin"] = origin[: TRUNCATED_PREFIX_LEN] + TRUNCATION_SUFFIX
    return meta


def _span(trace_id: int, span_id: int, parent: Optional[int], texts: Tuple[Any, ...],
          start: int, duration: Optional[int], error: bool, meta: Dict[str, str],
          metrics: Dict[str, Any], meta_struct: Dict[str, bytes], links: int,
          events: int) -> Dict[str, Any]:
    service, name, resource, span_type = (text or "" for text in texts)
    return {
        "trace_id": trace_id, "span_id": span_id, "parent_id": parent or 0,
        "service": service, "name": name, "resource": resource, "type": span_type,
        "start": _time(start), "duration": _time(duration), "error": error,
        "meta": _finish(meta), "metrics": {k: _number(v) for k, v in metrics.items()},
        "meta_struct": meta_struct, "links": links, "events": events,
    }


def canonical_v04(payload: bytes) -> List[List[Dict[str, Any]]]:
    return [
        [_span(s["trace_id"], s["span_id"], s.get("parent_id"),
               (s["service"], s["name"], s["resource"], s.get("type")),
               s["start"], s["duration"], bool(s.get("error")), dict(s.get("meta", {})),
               s.get("metrics", {}), s.get("meta_struct", {}), len(s.get("span_links", ())),
               len(s.get("span_events", ())))
         for s in trace]
        for trace in msgpack.unpackb(payload, strict_map_key=False)
    ]


def canonical_v05(payload: bytes) -> List[List[Dict[str, Any]]]:
    traces = []
    # Not tests.support.resolved_traces: an empty bytes value takes a table
    # entry "" of its own (the text is the same).
    table, chunks = msgpack.unpackb(payload, strict_map_key=False)
    for trace in chunks:
        spans = []
        for (service, name, resource, trace_id, span_id, parent, start, duration, error,
             meta, metrics, span_type) in trace:
            service, name, resource, span_type = (
                table[index] for index in (service, name, resource, span_type))
            meta = {table[k]: table[v] for k, v in meta.items()}
            metrics = {table[k]: v for k, v in metrics.items()}
            links = len(json.loads(meta.pop("_dd.span_links", "[]")))
            events = len(json.loads(meta.pop("events", "[]")))
            spans.append(_span(trace_id, span_id, parent, (service, name, resource, span_type),
                               start, duration, error != 0, meta, metrics, {}, links, events))
        traces.append(spans)
    return traces


def canonical_v10(payload: bytes) -> List[List[Dict[str, Any]]]:
    traces = []
    for chunk in decode_v10(payload).get(11, []):
        high = int.from_bytes(chunk[6][:8], "big")
        low = int.from_bytes(chunk[6][8:], "big")
        spans = []
        for index, s in enumerate(chunk.get(4, [])):
            meta: Dict[str, str] = {}
            metrics: Dict[str, Any] = {}
            meta_struct: Dict[str, bytes] = {}
            for key, kind, value in s.get(9, []):
                target = meta if kind == 1 else meta_struct if kind == 5 else metrics
                assert key not in target, key
                target[key] = value
            # The tags that became span fields, back under their names.
            for field, key in ((13, "env"), (14, "version"), (15, "component")):
                if field in s:
                    assert key not in meta
                    meta[key] = s[field]
            if 16 in s:
                assert "span.kind" not in meta
                meta["span.kind"] = KIND_NAMES[s[16]]
            if 2 in chunk:
                meta["_dd.origin"] = chunk[2]  # over a span's own tag, as v0.4's last entry
            if index == 0:
                # The chunk's fields came from the first span's tags.
                if high and "_dd.p.tid" not in meta:
                    meta["_dd.p.tid"] = "%016x" % high
                if 1 in chunk:
                    metrics["_sampling_priority_v1"] = chunk[1]
                if 7 in chunk:
                    meta["_dd.p.dm"] = "-%d" % chunk[7]
            spans.append(_span(low, s[4], s.get(5), (s.get(1), s.get(2), s.get(3), s.get(10)),
                               s[6], s.get(7), s.get(8, False), meta, metrics, meta_struct,
                               len(s.get(11, ())), len(s.get(12, ()))))
        traces.append(spans)
    return traces


CANONICAL = {"v0.4": canonical_v04, "v0.5": canonical_v05, "v1.0": canonical_v10}


def _without_meta_struct(traces: List[List[Dict[str, Any]]]) -> List[List[Dict[str, Any]]]:
    return [[{**span, "meta_struct": {}} for span in trace] for trace in traces]


def _without_origin_tags(canonical: List[List[Dict[str, Any]]],
                         traces: List[Dict[str, Any]]) -> List[List[Dict[str, Any]]]:
    """The spans of traces whose origin is "" without `_dd.origin`."""
    return [
        [{**span, "meta": {k: v for k, v in span["meta"].items() if k != "_dd.origin"}}
         if trace["origin"] == "" else span for span in spans]
        for spans, trace in zip(canonical, traces)
    ]


def _meta_struct_entries(traces: List[List[Dict[str, Any]]]) -> int:
    return sum(len(span["meta_struct"]) for trace in traces for span in trace)


# ---------------------------------------------------------------------------
# The property

ONE_MEANING = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@ONE_MEANING
@given(generated=mixed_traces(), lenient=st.booleans(), form=st.sampled_from(["dict", "slots"]))
def test_every_version_gives_a_trace_one_meaning(generated, lenient, form):
    traces, bad = generated
    outcomes = {
        (version, entry): _encode(version, traces, entry, form, lenient)
        for version in VERSIONS
        for entry in ENTRY_POINTS
    }
    accepted = {key: outcome[0] == "ok" for key, outcome in outcomes.items()}
    assert len(set(accepted.values())) == 1, outcomes
    if not accepted["v0.4", "encode_traces"]:
        assert bad, outcomes  # only a bad value is refused
        return
    if lenient:
        pass  # a bad value is dropped and counted
    canonical = {}
    dropped = {}
    for version in VERSIONS:
        payloads = {outcomes[version, entry][1] for entry in ENTRY_POINTS}
        assert len(payloads) == 1, version  # every entry point, the same bytes
        canonical[version] = CANONICAL[version](payloads.pop())
        counts = {outcomes[version, entry][2] for entry in ENTRY_POINTS}
        assert len(counts) == 1, (version, counts)
        dropped[version] = counts.pop()
    assert canonical["v1.0"] == canonical["v0.4"]
    # v0.5 has no place for meta_struct: its entries are counted, not lost
    # unseen.  It leaves an empty origin out and keeps a span's own
    # `_dd.origin` tag, which v0.4's "" entry overrides (documented).
    assert (_without_origin_tags(canonical["v0.5"], traces)
            == _without_origin_tags(_without_meta_struct(canonical["v0.4"]), traces))
    assert dropped["v1.0"] == dropped["v0.4"]
    assert dropped["v0.5"] == dropped["v0.4"] + _meta_struct_entries(canonical["v0.4"])
    if not lenient:
        assert dropped["v0.4"] == 0


# ---------------------------------------------------------------------------
# The measured cases, one by one


def _one_span(**fields: Any) -> List[List[Dict[str, Any]]]:
    return [[support.good_span(**fields)]]


def _canonical(version: str, spans: List[list], **options: Any) -> List[List[Dict[str, Any]]]:
    encoder = TraceMsgPackEncoder(version, native_span_events=True, **options)
    return CANONICAL[version](encoder.encode_traces(spans))


@pytest.mark.parametrize("version", VERSIONS)
def test_negative_duration_means_zero_in_every_version(version):
    got = _canonical(version, _one_span(duration_ns=-40, start_ns=-1))[0][0]
    assert (got["start"], got["duration"]) == (0, 0)


def test_negative_duration_written_as_the_agent_reads_it():
    spans = _one_span(duration_ns=-40)
    v04 = msgpack.unpackb(TraceMsgPackEncoder("v0.4").encode_traces(spans))
    assert v04[0][0]["duration"] == -40  # as the reference tracer writes it
    v05 = support.resolved_traces("v0.5", TraceMsgPackEncoder("v0.5").encode_traces(spans))
    assert v05[0][0][7] == 0
    v10 = decode_v10(TraceMsgPackEncoder("v1.0").encode_traces(spans))
    assert v10[11][0][4][0][7] == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_times_within_64_bits_accepted_beyond_refused(version):
    got = _canonical(version, _one_span(start_ns=U64, duration_ns=-(2**64) + 1))[0][0]
    assert (got["start"], got["duration"]) == (I64_MAX, 0)
    with pytest.raises(ValueError, match=r"trace 0, span 0, start_ns: .* does not fit in 64 bits"):
        TraceMsgPackEncoder(version).encode_traces(_one_span(start_ns=1 << 64))


@pytest.mark.parametrize("version", VERSIONS)
def test_error_beyond_32_bits_is_an_error(version):
    assert _canonical(version, _one_span(error=2**40))[0][0]["error"] is True


@pytest.mark.parametrize("key", ["env", "version", "component"])
@pytest.mark.parametrize("bad", [b"\xff", "\ud800"])
@pytest.mark.parametrize("version", VERSIONS)
def test_lenient_bad_field_tag_dropped_and_counted(version, key, bad):
    encoder = TraceMsgPackEncoder(version, lenient=True)
    spans = _one_span(meta={key: bad, "x": "y", "component" if key != "component" else "env": "ok"})
    got = CANONICAL[version](encoder.encode_traces(spans))[0][0]
    assert encoder.dropped_tags == 1
    assert key not in got["meta"] and got["meta"]["x"] == "y"


@pytest.mark.parametrize("key", ["env", "version", "component"])
@pytest.mark.parametrize("version", VERSIONS)
def test_bad_field_tag_error_names_the_key(version, key):
    with pytest.raises(ValueError, match=r"trace 0, span 0, meta\b.*'%s'" % key):
        TraceMsgPackEncoder(version).encode_traces(_one_span(meta={key: b"\xff"}))


@pytest.mark.parametrize("version", VERSIONS)
def test_subclass_values_in_links_and_events(version):
    span = support.good_span(
        events=[{"name": Label("retry"), "time_unix_nano": 1,
                 "attributes": {"latency": Ratio(1.5), "level": Level.HIGH, "tag": Label("a"),
                                "list": [Ratio(0.5), Ratio(2.5)]}}],
        links=[{"trace_id": 1, "span_id": 3, "attributes": {"k": Label("v"), "n": Level.LOW}}],
    )
    got = _canonical(version, [[span]])[0][0]
    assert (got["links"], got["events"]) == (1, 1)


def test_subclass_event_values_written_as_their_base_values():
    span = support.good_span(events=[{"name": Label("retry"), "time_unix_nano": 1,
                                      "attributes": {"latency": Ratio(1.5), "level": Level.HIGH}}])
    plain = support.good_span(events=[{"name": "retry", "time_unix_nano": 1,
                                       "attributes": {"latency": 1.5, "level": 3}}])
    encode = TraceMsgPackEncoder("v1.0").encode_traces
    assert encode([[span]]) == encode([[plain]])


@pytest.mark.parametrize("where", ["field", "attribute key", "attribute value"])
def test_str_subclass_payload_fields(where):
    class Env(str):
        pass

    if where == "field":
        options: Dict[str, Any] = {"env": Env("prod")}
        plain: Dict[str, Any] = {"env": "prod"}
    elif where == "attribute key":
        options, plain = ({"payload_attributes": {Env("k"): "v"}},
                          {"payload_attributes": {"k": "v"}})
    else:
        options, plain = ({"payload_attributes": {"k": Env("v")}},
                          {"payload_attributes": {"k": "v"}})
    spans = _one_span()
    assert (TraceMsgPackEncoder("v1.0", **options).encode_traces(spans)
            == TraceMsgPackEncoder("v1.0", **plain).encode_traces(spans))


@pytest.mark.parametrize("tid", ["ABCDEF0123456789", "zz", "0000000000000000", "00000000000000ab"])
@pytest.mark.parametrize("trace_id", [5, (0xAB << 64) | 5])
def test_trace_id_high_tag_v10_keeps_what_it_does_not_carry(tid, trace_id):
    """A _dd.p.tid the chunk's trace id does not say stays an attribute."""
    spans = [[support.good_span(trace_id=trace_id, meta={"_dd.p.tid": tid}),
              support.good_span(trace_id=trace_id, span_id=3, meta={"_dd.p.tid": tid})]]
    v10 = decode_v10(TraceMsgPackEncoder("v1.0").encode_traces(spans))
    chunk = v10[11][0]
    first, later = ([value for key, _, value in span.get(9, []) if key == "_dd.p.tid"]
                    for span in chunk[4])
    moved = tid == "00000000000000ab"  # 16 lowercase digits agreeing with the chunk
    assert first == ([] if moved else [tid])
    assert later == [tid]  # a later span's tag is its own
    assert _canonical("v1.0", spans) == _canonical("v0.4", spans)


@pytest.mark.parametrize("kind", ["gateway", "CLIENT", "", "internal", "server"])
def test_span_kind_text_outside_the_kinds_stays_an_attribute(kind):
    spans = _one_span(meta={"span.kind": kind})
    span = decode_v10(TraceMsgPackEncoder("v1.0").encode_traces(spans))[11][0][4][0]
    if kind in ("internal", "server"):
        assert KIND_NAMES[span[16]] == kind and 9 not in span
    else:
        assert 16 not in span and span[9] == [("span.kind", 1, kind)]
    assert _canonical("v1.0", spans) == _canonical("v0.4", spans)


@pytest.mark.parametrize("version", VERSIONS)
def test_empty_trace(version):
    got = TraceMsgPackEncoder(version).encode_traces([[], [support.good_span()]])
    assert [len(trace) for trace in CANONICAL[version](got)] == [0, 1]


def test_empty_trace_v10_chunk_has_a_trace_id():
    chunk = decode_v10(TraceMsgPackEncoder("v1.0").encode_traces([[]]))[11][0]
    assert chunk == {4: [], 6: bytes(16)}


@pytest.mark.parametrize("lenient", [False, True])
def test_v05_meta_struct_checked_and_counted(lenient):
    spans = _one_span(meta_struct={"a": {"x": 1}, "b": [1, 2]})
    encoder = TraceMsgPackEncoder("v0.5", lenient=lenient)
    assert canonical_v05(encoder.encode_traces(spans))[0][0]["meta_struct"] == {}
    assert encoder.dropped_tags == 2
    bad = _one_span(meta_struct={"a": {"x": 1j}})
    if lenient:
        encoder.encode_traces(bad)
        assert encoder.dropped_tags == 3
    else:
        with pytest.raises(TypeError, match="trace 0, span 0, meta_struct"):
            encoder.encode_traces(bad)


@pytest.mark.parametrize("version", VERSIONS)
def test_lenient_dropped_long_key_frees_its_cut_text(version):
    """Entry 1's key is cut, and the entry is dropped for its value; entry
    2's key cuts to the same text, and is now the only one written."""
    first = "k" * TRUNCATED_PREFIX_LEN + "A" * MAX_TEXT_LEN
    second = "k" * TRUNCATED_PREFIX_LEN + "B" * MAX_TEXT_LEN
    third = "k" * TRUNCATED_PREFIX_LEN + "C" * MAX_TEXT_LEN
    encoder = TraceMsgPackEncoder(version, lenient=True)
    spans = _one_span(meta={first: 5, second: "kept", third: "a twin: dropped"})
    meta = CANONICAL[version](encoder.encode_traces(spans))[0][0]["meta"]
    cut = "k" * TRUNCATED_PREFIX_LEN + TRUNCATION_SUFFIX
    assert meta == {cut: "kept"}
    assert encoder.dropped_tags == 2
