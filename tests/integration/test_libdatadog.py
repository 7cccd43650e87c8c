"""spanpack payloads through libdatadog's decoder (ddtrace's native TraceExporter).

ddtrace 4.x ships libdatadog's trace exporter in ``ddtrace.internal.native``.
``send(data, trace_count)`` DEcodes the v0.4/v0.5 bytes with libdatadog's
strict Rust decoder, then re-encodes and POSTs them to the agent; here the
agent is the APM test agent, so what libdatadog understood can be read back.

What libdatadog itself changes on the way (verified with ddtrace 4.2.3, and
applied to the expected spans by ``libdatadog_form``):

* every metric becomes a float64 (ints > 2**53 lose precision);
* v0.4: a None service becomes "", an unfinished span's duration 0, an empty
  span type is left out, and every span link carries ``trace_id_high`` (0 when
  the id is 64-bit);
* X-Datadog-Trace-Count is the chunk count it decoded; the ``trace_count``
  argument is ignored.
"""

from __future__ import annotations

import json
import urllib.parse

import pytest

from spanpack import TraceMsgPackEncoder

from tests.integration.test_agent_payloads import LOW64, check_summary, expected_trace, parsed, rich_traces

native = pytest.importorskip("ddtrace.internal.native")
if not hasattr(native, "TraceExporterBuilder") or not hasattr(native, "TraceExporter"):
    pytest.skip("ddtrace.internal.native has no TraceExporter", allow_module_level=True)

VERSIONS = ["v0.4", "v0.5"]


# ---------------------------------------------------------------------------
# The exporter


@pytest.fixture
def exporter_for(agent_session):
    """exporter_for(version) -> a native TraceExporter sending to the test
    agent in this test's session."""
    built = []

    def make(version):
        builder = (
            native.TraceExporterBuilder()
            .set_url(agent_session.base_url)
            .set_language("python")
            .set_language_version("3.11")
            .set_language_interpreter("CPython")
            .set_tracer_version("spanpack-test")
            .set_input_format(version)
            .set_output_format(version)
        )
        if hasattr(builder, "set_test_session_token"):
            builder = builder.set_test_session_token(agent_session.session_token)
        try:
            exporter = builder.build()
        except TypeError:  # ddtrace >= 4.16: build(shared_runtime)
            exporter = builder.build(native.SharedRuntime())
        built.append(exporter)
        return exporter

    yield make
    for exporter in built:
        try:
            exporter.shutdown(2_000_000_000)
        except Exception:
            pass


def send(exporter, payload, trace_count):
    try:
        return exporter.send(payload, trace_count)
    except TypeError as e:  # ddtrace >= 4.16: send(data)
        if "argument" not in str(e):
            raise
        return exporter.send(payload)


def trace_requests(agent):
    query = urllib.parse.urlencode({"test_session_token": agent.session_token})
    status, body = agent.request("GET", "/test/session/requests?" + query)
    assert status == 200, body
    return [r for r in json.loads(body) if r["url"].endswith("/traces")]


# ---------------------------------------------------------------------------
# The expected spans after libdatadog's re-encoding


def libdatadog_form(version, span):
    s = dict(span)
    s["metrics"] = {k: float(v) for k, v in s.get("metrics", {}).items()}
    if not s["metrics"] and version == "v0.4":
        del s["metrics"]
    if version == "v0.4":
        if s["service"] is None:
            s["service"] = ""
        if s["duration"] is None:
            s["duration"] = 0
        if s.get("type") == "":
            del s["type"]
        if "span_links" in s:
            s["span_links"] = [dict({"trace_id_high": 0}, **link) for link in s["span_links"]]
    return s


def without_dropped_attributes_count(traces):
    """Links as the v0.4 payload carries them (spanpack leaves this key out)."""
    for trace in traces:
        for span in trace:
            for link in span.get("links", []):
                link.pop("dropped_attributes_count", None)
    return traces


def assert_arrived(agent, version, traces, native_events=False):
    got = {}
    for trace in agent.traces():
        got[trace[0]["trace_id"]] = trace
    want = [t for t in traces if t]
    assert len(got) == len(want)
    for trace in want:
        expected = [libdatadog_form(version, s) for s in expected_trace(version, trace, native_events)]
        arrived = got[expected[0]["trace_id"]]
        assert len(arrived) == len(expected)
        for g, w in zip(arrived, expected):
            g = parsed(g)
            assert g == w
            for key, value in w.get("metrics", {}).items():
                assert type(g["metrics"][key]) is float, key


# ---------------------------------------------------------------------------
# spanpack payloads are decoded by libdatadog and arrive intact


@pytest.mark.parametrize("version", VERSIONS)
def test_spanpack_payload_arrives_intact(agent_session, exporter_for, version):
    traces = without_dropped_attributes_count(rich_traces(1000)) + [[]]
    e = TraceMsgPackEncoder(version)
    for t in traces:
        e.put(t)
    [(payload, count)] = e.encode()
    body = send(exporter_for(version), payload, count)
    assert json.loads(body) == {"rate_by_service": {}}
    check_summary(agent_session, requests=1)
    assert_arrived(agent_session, version, traces)

    root = agent_session.traces()[0][0]
    assert root["trace_id"] == 1001 and root["span_id"] == LOW64
    assert root["meta"]["_dd.p.tid"] == "6543210f00000000"
    assert root["meta"]["unicode.é"] == "ünïcødé ☃ 🚀 𝄞"
    assert root["meta"]["_dd.origin"] == "synthetics-browser"


def test_native_span_events_arrive_intact(agent_session, exporter_for):
    traces = without_dropped_attributes_count(rich_traces(2000))
    e = TraceMsgPackEncoder("v0.4", native_span_events=True)
    for t in traces:
        e.put(t)
    [(payload, count)] = e.encode()
    send(exporter_for("v0.4"), payload, count)
    check_summary(agent_session, requests=1)
    assert_arrived(agent_session, "v0.4", traces, native_events=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_split_payloads_each_decoded(agent_session, exporter_for, version):
    traces = []
    for i in range(20):
        traces.extend(without_dropped_attributes_count(rich_traces(10_000 + 10 * i)))
    one_shot = TraceMsgPackEncoder(version).encode_traces
    limit = max(len(one_shot(traces)) // 4, max(len(one_shot([t])) for t in traces))
    e = TraceMsgPackEncoder(version, max_payload_size=limit)
    for t in traces:
        e.put(t)
    payloads = e.encode()
    assert len(payloads) >= 3
    exporter = exporter_for(version)
    for payload, count in payloads:
        send(exporter, payload, count)
    check_summary(agent_session, requests=len(payloads))
    assert_arrived(agent_session, version, traces)


@pytest.mark.parametrize("version", VERSIONS)
def test_trace_count_argument_is_ignored(agent_session, exporter_for, version):
    """libdatadog sets X-Datadog-Trace-Count from what it decoded."""
    e = TraceMsgPackEncoder(version)
    traces = without_dropped_attributes_count(rich_traces(3000))
    for t in traces:
        e.put(t)
    [(payload, count)] = e.encode()
    send(exporter_for(version), payload, count + 10)
    check_summary(agent_session, requests=1)
    [request] = trace_requests(agent_session)
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["x-datadog-trace-count"] == str(count)


# ddtrace 4.2.3's Python encoder writes dropped_attributes_count into v0.4
# span links and libdatadog refuses the whole payload for it ("Invalid span
# link key"); spanpack leaves that key out of v0.4 links.
def test_link_with_dropped_attributes_count(agent_session, exporter_for):
    link = {"trace_id": 5, "span_id": 6, "dropped_attributes_count": 3}
    trace = [
        {
            "trace_id": 4000, "span_id": 1, "parent_id": None, "service": "s", "name": "n",
            "resource": "r", "span_type": None, "start_ns": 1, "duration_ns": 2, "error": 0,
            "meta": {}, "metrics": {}, "links": [link],
        }
    ]
    e = TraceMsgPackEncoder("v0.4")
    e.put(trace)
    [(payload, count)] = e.encode()
    send(exporter_for("v0.4"), payload, count)


# ---------------------------------------------------------------------------
# libdatadog's decoder is strict: a broken payload is refused and nothing is sent


def small_trace(trace_id):
    return [
        {
            "trace_id": trace_id, "span_id": 1, "parent_id": None, "service": "strict-svc",
            "name": "NAMEVALUE", "resource": "strict-resource", "span_type": "web",
            "start_ns": 1_700_000_000_000_000_000, "duration_ns": 10, "error": 0,
            "meta": {"key": "value"}, "metrics": {"m": 1.5},
        }
    ]


def _bin_for_str(payload):
    assert payload.count(b"\xa9NAMEVALUE") == 1
    return payload.replace(b"\xa9NAMEVALUE", b"\xc4\x09NAMEVALUE")


def _invalid_utf8(payload):
    assert payload.count(b"\xa9NAMEVALUE") == 1
    return payload.replace(b"\xa9NAMEVALUE", b"\xa9NAMEVAL\xc3\x28")


def _truncated(payload):
    return payload[:-3]


def _unknown_span_key(payload):
    """v0.4: a span map key libdatadog does not know."""
    assert payload.count(b"\xa4type") == 1
    return payload.replace(b"\xa4type", b"\xa4typo")


def _index_out_of_range(payload):
    """v0.5: the service of the span points past the end of the string table."""
    span_start = b"\x9c\x02\x03\x04"  # [service, name, resource, ... = 2, 3, 4
    assert payload.count(span_start) == 1
    return payload.replace(span_start, b"\x9c\x7f\x03\x04")


BREAKERS = {
    "bin_for_str": _bin_for_str,
    "invalid_utf8": _invalid_utf8,
    "truncated": _truncated,
    "unknown_key_or_bad_index": {"v0.4": _unknown_span_key, "v0.5": _index_out_of_range},
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("broken", sorted(BREAKERS))
def test_decoder_rejects_broken_payload(agent_session, exporter_for, version, broken):
    breaker = BREAKERS[broken]
    if isinstance(breaker, dict):
        breaker = breaker[version]
    e = TraceMsgPackEncoder(version)
    e.put(small_trace(4242))
    [(payload, count)] = e.encode()
    exporter = exporter_for(version)

    bad = breaker(payload)
    assert bad != payload
    with pytest.raises(native.DeserializationError):
        send(exporter, bad, count)
    assert trace_requests(agent_session) == []  # nothing reached the agent
    assert agent_session.traces() == []

    # control: the intact payload goes through the same exporter
    send(exporter, payload, count)
    [[span]] = agent_session.traces()
    assert span["name"] == "NAMEVALUE" and span["trace_id"] == 4242
    assert len(trace_requests(agent_session)) == 1
