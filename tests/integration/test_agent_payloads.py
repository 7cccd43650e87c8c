"""Payloads from put()/encode() sent to Datadog's APM test agent and read back.

The agent decodes v0.4/v0.5 with msgpack-python (strict UTF-8, str and not
bin), validates every span, and runs its ENABLED_CHECKS (trace_count_header,
meta_tracer_version_header, trace_content_length) on each request.  Every
request must answer 200, every check must pass (the agent's per-session
summary is read back), and every span field must come back as the model in
this file says it should, which is written from the span inputs, not from
spanpack's output.
"""

from __future__ import annotations

import json
import urllib.parse

import pytest

import spanpack
from spanpack import TraceMsgPackEncoder

from tests.integration.agent import ENABLED_CHECKS, SESSION_TOKEN_HEADER
from tests.support import good_span

VERSIONS = ["v0.4", "v0.5"]
LOW64 = (1 << 64) - 1
JSON_META_KEYS = ("events", "_dd.span_links")


# ---------------------------------------------------------------------------
# Span inputs


# The agent tests' span unless a test says otherwise (good_span for the rest).
AGENT_SPAN_DEFAULTS = {
    "service": "spanpack-agent-test",
    "name": "agent.op",
    "resource": "GET /agent",
    "span_type": "web",
    "start_ns": 1_700_000_000_123_456_789,
    "duration_ns": 5_000_000,
}


def span(trace_id, span_id, **fields):
    return good_span(trace_id=trace_id, span_id=span_id, **dict(AGENT_SPAN_DEFAULTS, **fields))


HIGH = 0x6543210F00000000
BIG_ID = (HIGH << 64) | 0xFEDCBA9876543210  # 128-bit, low half above 2**63


def rich_traces(base):
    """Traces exercising every field; trace ids start at `base` (low 64 bits
    distinct, because the agent groups spans by trace_id)."""
    link_128 = {
        "trace_id": (0xABCDEF << 64) | 0x1122334455667788,
        "span_id": 0x99AABBCCDDEEFF00,
        "attributes": {"link.kind": "follows_from", "list": ["a", 2, True], "flag": False, "n": 1.5},
        "tracestate": "dd=s:1;o:rum",
        "flags": 1,
    }
    link_64 = {"trace_id": 77, "span_id": 78, "dropped_attributes_count": 2, "flags": 0}
    event = {
        "name": "exception ☃",
        "time_unix_nano": 1_700_000_000_200_000_000,
        "attributes": {"exception.message": "boom ü", "count": 3, "ratio": 0.5, "ok": True,
                       "tags": ["x", "y"]},
    }
    root = span(
        (HIGH << 64) | (base + 1),
        (1 << 64) - 1,  # largest span id
        service="sérvice-ü",
        name="operation.名前",
        resource="SELECT * FROM t WHERE x = '🚀'",
        span_type="sql",
        error=1,
        meta={
            "http.method": "GET",
            "unicode.é": "ünïcødé ☃ 🚀 𝄞",
            "empty": "",
            "bytes.value": b"raw bytes \xc3\xa9",
            "long": "L" * 30000,  # truncated to 2,486 + "<truncated>..."
        },
        metrics={
            "_sampling_priority_v1": 1,
            "_dd.top_level": 1.0,
            "ratio": 0.1,
            "neg": -42,
            "big": (1 << 63) + 5,
            "huge.float": 1.5e300,
            "tiny": -1e-300,
        },
        links=[link_128, link_64],
        events=[event, {"name": "plain", "time_unix_nano": 5}],
        origin="synthetics-browser",
        meta_struct={"appsec": {"triggers": [{"rule": "r1", "n": 1}], "ok": True},
                     "other": {"é": "ü"}},
    )
    child = span(
        root["trace_id"],
        2,
        parent_id=root["span_id"],
        service=None,
        name="child",
        resource="child-resource",
        span_type=None,
        error=0,
        meta={"child": "yes"},
        metrics={"i": 7},
    )
    unfinished = span(
        root["trace_id"], 3, parent_id=2, name="unfinished", duration_ns=None, error=True,
        meta={}, metrics={},
    )
    plain = [
        span(base + 2, 10, service="plain", name="p0", meta={"a": "b"}, metrics={"f": 2.0}),
        span(base + 2, 11, parent_id=10, name="p1", resource="", span_type=""),
    ]
    with_id_high_in_meta = [
        span((5 << 64) | (base + 3), 20, name="tid-set",
             meta={"_dd.p.tid": "0000000000000005", "k": "v"}),
    ]
    max_low = [span((base + 4) | (1 << 63), 30, name="max-low", start_ns=0, duration_ns=0)]
    return [[root, child, unfinished], plain, with_id_high_in_meta, max_low]


# ---------------------------------------------------------------------------
# The model: what the agent should hand back for an input span


def truncated(text):
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    if text is not None and len(text) > 25000:
        return text[:2486] + "<truncated>..."
    return text


def flatten(attributes):
    flat = {}

    def walk(key, value):
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk("%s.%d" % (key, i), item)
        elif isinstance(value, bool):
            flat[key] = "true" if value else "false"
        elif isinstance(value, str):
            flat[key] = value
        else:
            flat[key] = str(value)

    for k, v in attributes.items():
        walk(k, v)
    return flat


def link_json_form(link):
    d = {"trace_id": "%032x" % link["trace_id"], "span_id": "%016x" % link["span_id"]}
    if link.get("attributes"):
        d["attributes"] = flatten(link["attributes"])
    if link.get("dropped_attributes_count"):
        d["dropped_attributes_count"] = link["dropped_attributes_count"]
    if link.get("tracestate"):
        d["tracestate"] = link["tracestate"]
    if link.get("flags") is not None:
        d["flags"] = link["flags"]
    return d


def link_v04_form(link):
    d = link_json_form(link)
    # left out of v0.4 links: libdatadog's decoder rejects the key
    d.pop("dropped_attributes_count", None)
    d["trace_id"] = link["trace_id"] & LOW64
    d["span_id"] = link["span_id"]
    if link["trace_id"] >> 64:
        d["trace_id_high"] = link["trace_id"] >> 64
    if "flags" in d:
        d["flags"] |= 1 << 31
    return d


def event_json_form(event):
    d = {"name": event["name"], "time_unix_nano": event["time_unix_nano"]}
    if event.get("attributes"):
        d["attributes"] = event["attributes"]
    return d


def native_attribute(value):
    if isinstance(value, str):
        return {"type": 0, "string_value": value}
    if isinstance(value, bool):
        return {"type": 1, "bool_value": value}
    if isinstance(value, int):
        return {"type": 2, "int_value": value}
    if isinstance(value, float):
        return {"type": 3, "double_value": value}
    return {"type": 4, "array_value": {"values": [native_attribute(v) for v in value]}}


def event_native_form(event):
    d = {"name": event["name"], "time_unix_nano": event["time_unix_nano"]}
    if event.get("attributes"):
        d["attributes"] = {k: native_attribute(v) for k, v in event["attributes"].items()}
    return d


def expected_trace(version, trace, native_events=False):
    first = trace[0]
    tid = first["trace_id"]
    origin = first.get("origin")
    out = []
    for index, s in enumerate(trace):
        meta = {truncated(k): truncated(v) for k, v in (s.get("meta") or {}).items()}
        if index == 0 and tid >> 64 and "_dd.p.tid" not in meta:
            meta["_dd.p.tid"] = "%016x" % (tid >> 64)
        if origin:
            meta["_dd.origin"] = origin
        links = s.get("links") or []
        events = s.get("events") or []
        metrics = dict(s.get("metrics") or {})
        if version == "v0.4":
            e = {
                "trace_id": tid & LOW64,
                "span_id": s["span_id"],
                "service": s["service"],
                "resource": truncated(s["resource"]),
                "name": s["name"],
                "start": s["start_ns"],
                "duration": s["duration_ns"],
            }
            if s["parent_id"] is not None:
                e["parent_id"] = s["parent_id"]
            if s["error"]:
                e["error"] = 1
            if s["span_type"] is not None:
                e["type"] = s["span_type"]
            if links:
                e["span_links"] = [link_v04_form(link) for link in links]
            if events and native_events:
                e["span_events"] = [event_native_form(ev) for ev in events]
            elif events:
                meta["events"] = [event_json_form(ev) for ev in events]
            if meta:
                e["meta"] = meta
            if s.get("meta_struct"):
                e["meta_struct"] = s["meta_struct"]
            if metrics:
                e["metrics"] = metrics
        else:
            if links:
                meta["_dd.span_links"] = [link_json_form(link) for link in links]
            if events:
                meta["events"] = [event_json_form(ev) for ev in events]
            e = {
                "service": s["service"] or "",
                "name": s["name"],
                "resource": truncated(s["resource"]) or "",
                "trace_id": tid & LOW64,
                "span_id": s["span_id"],
                "parent_id": s["parent_id"] or 0,
                "start": s["start_ns"],
                "duration": s["duration_ns"] or 0,
                "error": int(s["error"]),
                "meta": meta,
                "metrics": metrics,
                "type": s["span_type"] or "",
            }
        out.append(e)
    return out


def parsed(agent_span):
    """The agent's span with JSON-valued meta entries parsed."""
    s = dict(agent_span)
    if "meta" in s:
        meta = dict(s["meta"])
        for key in JSON_META_KEYS:
            if key in meta:
                meta[key] = json.loads(meta[key])
        s["meta"] = meta
    return s


def assert_same_span(got, want):
    got = parsed(got)
    assert got == want
    # ints stay ints and floats stay floats (JSON keeps 1 and 1.0 apart)
    for key, value in want.get("metrics", {}).items():
        assert type(got["metrics"][key]) is type(value), key


# ---------------------------------------------------------------------------
# Talking to the agent


def send_payloads(agent, encoder, payloads):
    """PUT every (payload, count) with encoder.headers(count); all must be accepted."""
    url = agent.base_url + encoder.endpoint
    for payload, count in payloads:
        headers = dict(encoder.headers(count))
        headers[SESSION_TOKEN_HEADER] = agent.session_token
        status, body = spanpack.send(payload, count, url, headers=headers)
        assert status == 200, body.decode("utf-8", "replace")
        assert json.loads(body) == {"rate_by_service": {}}


def check_summary(agent, requests, failed=0):
    """The agent's per-session check results: every enabled check ran on
    every request, and `failed` of those runs failed."""
    query = urllib.parse.urlencode({"test_session_token": agent.session_token})
    status, body = agent.request("GET", "/test/trace_check/summary?" + query)
    assert status == 200, body
    summary = json.loads(body)
    enabled = set(ENABLED_CHECKS.split(","))
    assert enabled <= set(summary), summary
    for name in enabled:
        result = summary[name]
        assert result["Failed_Checks"] == (failed if name == "trace_count_header" else 0), (
            name, result)
        assert result["Passed_Checks"] + result["Failed_Checks"] == requests, (name, result)
    return summary


def agent_traces(agent):
    by_id = {}
    for trace in agent.traces():
        ids = {s["trace_id"] for s in trace}
        assert len(ids) == 1
        by_id[ids.pop()] = trace
    return by_id


def assert_traces_arrived(agent, version, traces, native_events=False):
    got = agent_traces(agent)
    want = [t for t in traces if t]
    assert len(got) == len(want)
    for trace in want:
        expected = expected_trace(version, trace, native_events)
        arrived = got[expected[0]["trace_id"]]
        assert len(arrived) == len(expected)
        for g, w in zip(arrived, expected):
            assert_same_span(g, w)


# ---------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("version", VERSIONS)
def test_every_field_survives(agent_session, version):
    traces = rich_traces(1000) + [[]]  # an empty trace still counts as a chunk
    e = TraceMsgPackEncoder(version)
    for t in traces:
        e.put(t)
    payloads = e.encode()
    assert [c for _, c in payloads] == [len(traces)]
    send_payloads(agent_session, e, payloads)
    check_summary(agent_session, requests=1)
    assert_traces_arrived(agent_session, version, traces)

    # spot checks, independent of the model above
    got = agent_traces(agent_session)
    root = got[1001][0]  # low 64 bits of the 128-bit id
    assert root["span_id"] == (1 << 64) - 1
    assert root["meta"]["_dd.p.tid"] == "6543210f00000000"
    assert root["meta"]["unicode.é"] == "ünïcødé ☃ 🚀 𝄞"
    assert root["meta"]["_dd.origin"] == "synthetics-browser"
    assert len(root["meta"]["long"]) == 2500
    assert root["metrics"]["big"] == (1 << 63) + 5
    unfinished = got[1001][2]
    assert unfinished["duration"] == (None if version == "v0.4" else 0)
    assert got[(1004 | 1 << 63)][0]["trace_id"] == 1004 | 1 << 63


def test_native_span_events_v04(agent_session):
    traces = rich_traces(2000)
    e = TraceMsgPackEncoder("v0.4", native_span_events=True)
    for t in traces:
        e.put(t)
    payloads = e.encode()
    send_payloads(agent_session, e, payloads)
    check_summary(agent_session, requests=1)
    assert_traces_arrived(agent_session, "v0.4", traces, native_events=True)
    root = agent_traces(agent_session)[2001][0]
    assert "events" not in root["meta"]
    assert root["span_events"][0]["attributes"]["tags"] == {
        "type": 4,
        "array_value": {"values": [{"type": 0, "string_value": "x"},
                                   {"type": 0, "string_value": "y"}]},
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_split_encode_every_payload_accepted(agent_session, version):
    traces = []
    for i in range(40):
        traces.extend(rich_traces(10_000 + 10 * i))
    one_shot = TraceMsgPackEncoder(version).encode_traces
    limit = max(len(one_shot(traces)) // 5, max(len(one_shot([t])) for t in traces))
    e = TraceMsgPackEncoder(version, max_payload_size=limit)
    for t in traces:
        e.put(t)
    size = e.size
    payloads = e.encode()
    assert len(payloads) >= 3
    assert sum(len(p) for p, _ in payloads) == size
    assert all(len(p) <= limit for p, _ in payloads)
    assert sum(c for _, c in payloads) == len(traces)
    send_payloads(agent_session, e, payloads)
    check_summary(agent_session, requests=len(payloads))
    assert_traces_arrived(agent_session, version, traces)


@pytest.mark.parametrize("version", VERSIONS)
def test_buffer_reused_across_encodes(agent_session, version):
    """Several put/encode rounds on one encoder (v0.5: a fresh string table
    each time), each payload accepted."""
    e = TraceMsgPackEncoder(version)
    sent = []
    requests = 0
    for round_ in range(4):
        traces = rich_traces(50_000 + 10 * round_)[: round_ + 1]
        for t in traces:
            e.put(t)
        payloads = e.encode()
        send_payloads(agent_session, e, payloads)
        requests += len(payloads)
        sent.extend(traces)
    check_summary(agent_session, requests=requests)
    assert_traces_arrived(agent_session, version, sent)


@pytest.mark.parametrize("version", VERSIONS)
def test_ddtrace_spans(agent_session, version):
    pytest.importorskip("ddtrace")
    from ddtrace._trace.context import Context
    from ddtrace._trace.span import Span

    tid = (0x1234 << 64) | 0x42
    ctx = Context(trace_id=tid, span_id=1, dd_origin="rum")
    root = Span("ddtrace.root", service="ddsvc", resource="/ü", span_type="web",
                trace_id=tid, span_id=1, start=1_700_000_000.25, context=ctx)
    root.set_tag("http.url", "https://example.com/ä")
    root.set_metric("m", 3)
    root.set_metric("f", 0.25)
    root.set_link(trace_id=99, span_id=98, tracestate="a=b", flags=1, attributes={"k": ["v", 1]})
    root._add_event("ev", {"a": "b", "n": 2}, timestamp=1_700_000_000_300_000_000)
    root.error = 1
    root.finish(1_700_000_001.0)
    child = Span("ddtrace.child", service="ddsvc", trace_id=tid, span_id=2, parent_id=1,
                 start=1_700_000_000.5, context=ctx)  # never finished
    trace = [root, child]

    e = TraceMsgPackEncoder(version, fields="ddtrace")
    e.put(trace)
    payloads = e.encode()
    send_payloads(agent_session, e, payloads)
    check_summary(agent_session, requests=1)

    as_dicts = []
    for s in trace:
        as_dicts.append(
            span(
                s.trace_id, s.span_id, parent_id=s.parent_id, service=s.service, name=s.name,
                resource=s.resource, span_type=s.span_type, start_ns=s.start_ns,
                duration_ns=s.duration_ns, error=s.error, meta=dict(s._meta),
                metrics=dict(s._metrics),
                links=[{"trace_id": link.trace_id, "span_id": link.span_id,
                        "attributes": link.attributes, "tracestate": link.tracestate,
                        "flags": link.flags} for link in s._links],
                events=[{"name": ev.name, "time_unix_nano": ev.time_unix_nano,
                         "attributes": ev.attributes} for ev in s._events],
                origin=s.context.dd_origin,
            )
        )
    assert_traces_arrived(agent_session, version, [as_dicts])
    got = agent_traces(agent_session)[0x42]
    assert got[0]["meta"]["_dd.origin"] == "rum" == got[1]["meta"]["_dd.origin"]
    assert got[0]["meta"]["_dd.p.tid"] == "%016x" % 0x1234


@pytest.mark.parametrize("version", VERSIONS)
def test_agent_catches_a_wrong_trace_count(agent_session, version):
    """Negative control: the same spanpack payload with a header claiming one
    trace too many is refused, and the summary records the failure; so the
    passing summaries above really come from checks that ran."""
    e = TraceMsgPackEncoder(version)
    for t in rich_traces(3000):
        e.put(t)
    [(payload, count)] = e.encode()
    url = agent_session.base_url + e.endpoint
    headers = dict(e.headers(count + 1))
    headers[SESSION_TOKEN_HEADER] = agent_session.session_token
    status, body = spanpack.send(payload, count + 1, url, headers=headers)
    assert status == 400
    assert b"trace_count_header" in body
    assert b"does not match actual number of traces (%d)" % count in body
    check_summary(agent_session, requests=1, failed=1)


@pytest.mark.parametrize("version", VERSIONS)
def test_agent_rejects_bin_where_a_str_is_expected(agent_session, version):
    """Negative control for the decoder: the agent does not accept bin for a
    string, so the string fields above really arrived as msgpack str."""
    e = TraceMsgPackEncoder(version)
    e.put([span(4000, 1, name="NAMEVALUE")])
    [(payload, count)] = e.encode()
    assert payload.count(b"\xa9NAMEVALUE") == 1
    bad = payload.replace(b"\xa9NAMEVALUE", b"\xc4\x09NAMEVALUE")
    url = agent_session.base_url + e.endpoint
    headers = dict(e.headers(count))
    headers[SESSION_TOKEN_HEADER] = agent_session.session_token
    status, body = spanpack.send(bad, count, url, headers=headers)
    assert status == 400, body
    status, body = spanpack.send(payload, count, url, headers=headers)
    assert status == 200, body
