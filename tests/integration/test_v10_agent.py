"""v1.0 payloads against independent decoders.

* Datadog's APM test agent decodes /v1.0/traces into v0.4-shaped spans: the
  same spans sent as v0.4 and as v1.0 (through every entry point, split
  payloads included) must come back equal, up to the differences the v1.0
  format itself makes (``normalized`` lists them, each with its reason).
* tests/v10_decoder.py, written from the agent decoder's rules, must accept
  every payload spanpack writes, and refuse hand-broken ones.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any, Dict, List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spanpack
from spanpack import TraceMsgPackEncoder, samples

from tests import support as strategies
from tests.v10_decoder import DecodeError, decode

AGENT_PROPERTY = settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DECODER_PROPERTY = settings(AGENT_PROPERTY, max_examples=150)

LOW64 = (1 << 64) - 1
I64_MAX = (1 << 63) - 1


# ---------------------------------------------------------------------------
# Inputs: hypothesis traces within what v1.0 carries


def _json_document(value: Any) -> bool:
    """The test agent returns what it decoded as JSON: no bytes, str keys."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_document(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_json_document(item) for item in value)
    return not isinstance(value, bytes)


def _homogeneous(value: Any) -> bool:
    """The test agent's v0.4 check refuses event arrays of mixed types."""
    if not isinstance(value, list):
        return True
    return len({type(item) for item in value}) <= 1


@st.composite
def v10_traces(draw, max_traces: int = 3) -> List[Dict[str, Any]]:
    """Logical traces (tests.support) with v1.0's limits: start and
    duration unsigned (v1.0 has no negative times); and what the test
    agent's v0.4 checks ask for: a name, meta_struct documents that are maps
    (also all that its v1.0 decoder gives back) it can return as JSON, event arrays
    of one type, distinct low trace ids (it groups spans by them), and
    distinct non-zero span ids whose parents come earlier (it walks the span
    tree, and hangs on a cycle)."""
    traces = draw(st.lists(strategies.logical_traces(), min_size=1, max_size=max_traces))
    for number, trace in enumerate(traces):
        used = set()
        for position, span in enumerate(trace["spans"]):
            if span["span_id"] == 0 or span["span_id"] in used:
                span["span_id"] = 0xC0DE00 + position
            if span["parent_id"] is not None:
                span["parent_id"] = trace["spans"][position - 1]["span_id"] if position else 0
            used.add(span["span_id"])
            span["start_ns"] = min(abs(span["start_ns"]), I64_MAX)
            if span["duration_ns"] is not None:
                span["duration_ns"] = min(abs(span["duration_ns"]), I64_MAX)
            if span["name"] is None:
                span["name"] = "n"
            span["meta_struct"] = {
                k: v for k, v in span["meta_struct"].items()
                if isinstance(v, dict) and _json_document(v)
            }
            for event in span["events"]:
                event["attributes"] = {k: v for k, v in event["attributes"].items() if _homogeneous(v)}
        first = trace["spans"][0]
        first["trace_id"] = (first["trace_id"] >> 64 << 64) | (0x5A00 + number)
        for span in trace["spans"][1:]:
            span["trace_id"] = first["trace_id"]
    return traces


def _form(traces: List[Dict[str, Any]], form: str) -> List[list]:
    return [strategies.to_form(trace, form) for trace in traces]


# ---------------------------------------------------------------------------
# Comparing what the test agent decoded


def _metric(value: Any) -> Any:
    # v1.0 ints are int64: a larger metric travels as a double.
    if isinstance(value, int) and not isinstance(value, bool) and value > I64_MAX:
        return float(value)
    return value


def normalized(traces: List[List[Dict[str, Any]]]) -> str:
    """The agent's decoded traces with the differences v1.0 makes by design
    removed, as canonical JSON (NaN metrics compare equal as text):

    * the chunk's trace id high half, origin "", and sampling priority come
      back on every span; v0.4 has them on the first (or, for _dd.origin "",
      on each) only;
    * an origin over 25,000 characters is truncated like every other string
      (v0.4 writes it whole, as the reference tracer does);
    * absent vs None fields (service, type, duration), a parent_id or a
      link's trace_id_high of 0, a link's empty attributes;
    * metrics beyond int64 travel as doubles.
    """
    out = []
    for trace in traces:
        spans = []
        for index, span in enumerate(trace):
            span = {k: v for k, v in span.items() if v is not None}
            if span.get("parent_id") == 0:
                del span["parent_id"]
            meta = dict(span.get("meta") or {})
            metrics = {k: _metric(v) for k, v in (span.get("metrics") or {}).items()}
            if meta.get("_dd.origin") == "":
                del meta["_dd.origin"]
            origin = meta.get("_dd.origin")
            if origin is not None and len(origin) > 25000:
                meta["_dd.origin"] = origin[:2486] + "<truncated>..."
            if index > 0:
                meta.pop("_dd.p.tid", None)
                metrics.pop("_sampling_priority_v1", None)
            span["meta"] = meta
            span["metrics"] = metrics
            for link in span.get("span_links") or ():
                if link.get("trace_id_high") == 0:
                    del link["trace_id_high"]
                if link.get("attributes") == {}:
                    del link["attributes"]
            spans.append(span)
        out.append(sorted(spans, key=lambda s: (s["span_id"], json.dumps(s, sort_keys=True))))
    out.sort(key=lambda t: (t[0]["trace_id"], t[0]["span_id"]) if t else (0, 0))
    return json.dumps(out, sort_keys=True)


def assert_same(got: str, expected: str, context: str = "") -> None:
    """Equal normalized traces, or the first differing span field named."""
    if got == expected:
        return
    got_traces, expected_traces = json.loads(got), json.loads(expected)
    assert len(got_traces) == len(expected_traces), context
    for t, (got_trace, expected_trace) in enumerate(zip(got_traces, expected_traces)):
        assert len(got_trace) == len(expected_trace), (context, t)
        for s, (got_span, expected_span) in enumerate(zip(got_trace, expected_trace)):
            for key in sorted(set(got_span) | set(expected_span)):
                g, e = got_span.get(key), expected_span.get(key)
                if isinstance(g, dict) and isinstance(e, dict):
                    keys = sorted(k for k in set(g) | set(e) if g.get(k) != e.get(k))
                    g = {k: g.get(k) for k in keys}
                    e = {k: e.get(k) for k in keys}
                assert g == e, "%s: trace %d span %d field %s" % (context, t, s, key)
    raise AssertionError(context)


def _agent_traces(agent, version: str, payloads) -> List[List[Dict[str, Any]]]:
    agent.start_session("v10-%s" % uuid.uuid4().hex)
    for payload, count in payloads:
        status, body = agent.put_payload(version, payload, count)
        assert status == 200, body
    return agent.traces()


def _v10_payloads(traces: List[list], entry: str, version: str = "v1.0", **options: Any):
    """spanpack's payloads (v1.0 unless told) for `traces` through one entry point."""
    encoder = TraceMsgPackEncoder(version, **options)
    if entry == "encode_traces":
        return [(encoder.encode_traces(traces), len(traces))]
    if entry == "join_encoded":
        return [(encoder.join_encoded([encoder.encode_trace(t) for t in traces]), len(traces))]
    for trace in traces:
        encoder.put(trace)
    return encoder.encode()


def _v04_payload(traces: List[list]):
    encoder = TraceMsgPackEncoder("v0.4", native_span_events=True)
    return [(encoder.encode_traces(traces), len(traces))]


ENTRIES = ("encode_traces", "join_encoded", "put")


@AGENT_PROPERTY
@given(traces=v10_traces(), form=st.sampled_from(strategies.INPUT_FORMS[:4]))
def test_agent_v10_equals_v04(test_agent, traces, form):
    """The same hypothesis traces sent as v0.4 and (through every entry
    point) as v1.0 decode to the same spans in the test agent."""
    spans = _form(traces, form)
    expected = normalized(_agent_traces(test_agent, "v0.4", _v04_payload(spans)))
    for entry in ENTRIES:
        payloads = _v10_payloads(_form(traces, form), entry)
        for payload, _ in payloads:
            decode(payload)
        got = normalized(_agent_traces(test_agent, "v1.0", payloads))
        assert_same(got, expected, entry)


@pytest.fixture(name="ddtrace", scope="module")
def _ddtrace_fixture():
    # The [test] extra installs ddtrace on 3.9-3.14 only (tests/conftest.py
    # makes this skip a failure in CI where it installs).
    return pytest.importorskip("ddtrace")


@AGENT_PROPERTY
@given(traces=v10_traces())
def test_agent_v10_ddtrace_spans(ddtrace, test_agent, traces):
    """ddtrace Spans (fields="ddtrace"): v1.0 decodes as their v0.4 does."""
    spans = _form(traces, "ddtrace")
    v04 = TraceMsgPackEncoder("v0.4", "ddtrace", native_span_events=True)
    expected = normalized(
        _agent_traces(test_agent, "v0.4", [(v04.encode_traces(spans), len(spans))])
    )
    v10 = TraceMsgPackEncoder("v1.0", "ddtrace")
    payload = v10.encode_traces(_form(traces, "ddtrace"))
    decode(payload)
    assert_same(normalized(_agent_traces(test_agent, "v1.0", [(payload, len(spans))])), expected)


@pytest.mark.parametrize("shape", ["web", "spans_50", "origin", "int_metrics", "one_tag"])
def test_agent_v10_bench_shapes(agent_session, shape):
    """The bench shapes, as slotted spans and as dicts, through put() and
    encode(), decode as their v0.4 payload does."""
    records = samples.build(shape, quick=True)
    expected = normalized(_agent_traces(agent_session, "v0.4", _v04_payload(samples.as_dicts(records))))
    for spans in (samples.as_slotted(records), samples.as_dicts(records)):
        encoder = TraceMsgPackEncoder("v1.0")
        for trace in spans:
            encoder.put(trace)
        payloads = encoder.encode()
        for payload, _ in payloads:
            decode(payload)
        assert_same(normalized(_agent_traces(agent_session, "v1.0", payloads)), expected, shape)


def test_agent_v10_split_payloads(agent_session):
    """12 web traces with max_payload_size about 2.5 traces: several
    payloads, each at most that size and streaming its own strings,
    together decoding as the one v0.4 payload of the same traces."""
    records = samples.web_traces(12)
    expected = normalized(_agent_traces(agent_session, "v0.4", _v04_payload(samples.as_dicts(records))))
    one = len(TraceMsgPackEncoder("v1.0").encode_traces(samples.as_dicts(records[:1])))
    limit = one * 5 // 2
    encoder = TraceMsgPackEncoder("v1.0", max_payload_size=limit)
    for trace in samples.as_slotted(records):
        encoder.put(trace)
    payloads = encoder.encode()
    assert len(payloads) >= 4
    for payload, count in payloads:
        assert len(payload) <= limit
        assert len(decode(payload)[11]) == count
    assert_same(normalized(_agent_traces(agent_session, "v1.0", payloads)), expected)


def test_agent_lists_v10_endpoint(test_agent):
    """The test agent announces /v1.0/traces in /info; agent_versions reads it."""
    assert spanpack.agent_versions(test_agent.info()) == ["v1.0", "v0.5", "v0.4"]


def test_agent_accepts_payload_fields(agent_session):
    """Every payload field set: the agent decodes the payload (attributes
    land on every span as tags and metrics)."""
    encoder = TraceMsgPackEncoder(
        "v1.0", runtime_id="rt-1", env="prod", hostname="h", app_version="1.2",
        container_id="c-1", payload_attributes={"_dd.git.commit.sha": "abc", "n": 2, "on": True},
    )
    span = strategies.good_span(meta={"a": "prod"})
    payload = encoder.encode_traces([[span]])
    decode(payload)
    (trace,) = _agent_traces(agent_session, "v1.0", [(payload, 1)])
    assert trace[0]["meta"]["_dd.git.commit.sha"] == "abc"
    assert trace[0]["meta"]["a"] == "prod"
    assert trace[0]["metrics"]["n"] == 2 and trace[0]["metrics"]["on"] == 1


# ---------------------------------------------------------------------------
# The strict decoder


@DECODER_PROPERTY
@given(traces=v10_traces(max_traces=4), lenient=st.booleans(), split=st.sampled_from([None, 600, 4096]))
def test_decoder_accepts_every_payload(traces, lenient, split):
    """Every payload from every entry point passes the strict decoder, and
    put()'s split payloads hold the traces of one encode_traces() payload."""
    whole = decode(_v10_payloads(_form(traces, "dict"), "encode_traces", lenient=lenient)[0][0])
    joined = decode(_v10_payloads(_form(traces, "slots"), "join_encoded", lenient=lenient)[0][0])
    assert repr(joined) == repr(whole)  # repr: NaN metrics compare equal
    options = {"lenient": lenient}
    if split is not None:
        options["max_payload_size"] = split
    try:
        payloads = _v10_payloads(_form(traces, "dict"), "put", **options)
    except spanpack.BufferItemTooLarge:
        return
    chunks = []
    for payload, count in payloads:
        assert split is None or len(payload) <= split
        decoded = decode(payload)
        assert len(decoded[11]) == count
        chunks += decoded[11]
    assert repr(chunks) == repr(whole[11])


def _payload(*body: bytes) -> bytes:
    return b"".join(body)


# A valid payload to break: {11: [{4: [{4: 1, 6: 2, 2: "n", 16: 1}], 6: bin16}]}
TRACE_ID = b"\xc4\x10" + bytes(15) + b"\x01"
SPAN = b"\x84\x04\x01\x06\x02\x02\xa1n\x10\x01"
VALID = b"\x81\x0b\x91\x82\x04\x91" + SPAN + b"\x06" + TRACE_ID


def test_decoder_accepts_the_base_payload():
    assert decode(VALID) == {11: [{4: [{4: 1, 6: 2, 2: "n", 16: 1}], 6: bytes(15) + b"\x01"}]}


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"\x82\x01\x91\xa1n\x0b\x90", "unknown payload key 1"),
        (b"\x81\x0c\x90", "unknown payload key 12"),
        (b"\x81\x0b\x91\x82\x04\x90\x05\xc2", "unknown chunk key 5"),
        (b"\x81\x0b\x91\x82\x04\x90\x06\xc4\x08" + bytes(8), "trace id of 8 bytes"),
        (b"\x81\x0b\x91\x81\x04\x91\x81\x02\x01", "string id 1 not streamed"),
        (b"\x81\x0b\x91\x81\x04\x91\x82\x02\xa1n\x01\xa1n", "streamed twice"),
        (b"\x81\x0b\x91\x81\x04\x91\x81\x09\x92\xa1k\x01", "not a multiple of 3"),
        (b"\x81\x0b\x91\x81\x04\x91\x81\x09\x93\xa1k\x03\x01", "float64 or float32"),
        (b"\x81\x0b\x91\x81\x04\x91\x81\x09\x93\xa1k\x06\x93\x04\x01\x04", "type/value pairs"),
        (b"\x81\x0b\x91\x81\x04\x91\x81\x08\x01", "expected a bool"),
        (b"\x81\x0b\x91\x81\x04\x91\x81\x06\xff", "expected a uint64"),
        (b"\x81\x0b\x91\x81\x04\x91\x81\x11\x01", "unknown span key 17"),
        (b"\x81\x0b\x91\x81\x04\x91\x81\x10\x09", "span kind 9"),
        (b"\x81\x0b\x91\x81\x04\x91\x81\x02\xa2\xc3\x28", "invalid UTF-8"),
        (VALID + b"\x00", "after the payload"),
    ],
)
def test_decoder_refuses_broken_payloads(payload, reason):
    with pytest.raises(DecodeError, match=reason):
        decode(payload)


def test_nan_metrics_compare_as_text():
    """normalized() relies on JSON text for NaN (NaN != NaN as a float)."""
    assert normalized([[{"span_id": 1, "trace_id": 1, "metrics": {"m": math.nan}}]]) == normalized(
        [[{"span_id": 1, "trace_id": 1, "metrics": {"m": math.nan}}]]
    )


# ---------------------------------------------------------------------------
# Atomicity: a failed trace streams nothing


def _failing_copy(trace: List[Dict[str, Any]], position: int) -> List[Dict[str, Any]]:
    """The trace with fresh strings everywhere before a bad span at
    `position` (its meta value is an int), so a leak of the strings the
    failed trace streamed would change every later id."""
    spans = [dict(span, service="fresh-service-%d" % i, resource="fresh-%d" % i,
                  meta={**span["meta"], "fresh-key-%d" % i: "fresh-value-%d" % i})
             for i, span in enumerate(trace)]
    spans.insert(position, dict(spans[0], meta={"fresh-bad": 1}))
    return spans


@DECODER_PROPERTY
@given(traces=v10_traces(max_traces=3), data=st.data())
def test_failed_trace_leaves_no_trace(traces, data):
    """put() and encode_traces() of a trace that fails part-way (after
    streaming new strings) leave the encoder as it was: the payloads equal
    those of an encoder that never saw the trace."""
    good = _form(traces, "dict")
    failing_at = data.draw(st.integers(0, len(good)), label="failing trace position")
    bad = _failing_copy(good[0], data.draw(st.integers(1, len(good[0])), label="bad span"))
    reference = TraceMsgPackEncoder("v1.0")
    for trace in good:
        reference.put(trace)
    expected = reference.encode()
    encoder = TraceMsgPackEncoder("v1.0")
    for index, trace in enumerate(good):
        if index == failing_at:
            with pytest.raises(TypeError, match="meta key 'fresh-bad'"):
                encoder.put(bad)
            with pytest.raises(TypeError, match="meta key 'fresh-bad'"):
                encoder.encode_traces([bad])
        encoder.put(trace)
    if failing_at == len(good):
        with pytest.raises(TypeError):
            encoder.put(bad)
    assert encoder.encode() == expected
