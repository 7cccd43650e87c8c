"""The APM test agent fixture works, independently of spanpack.

Payloads here are encoded with msgpack-python, so a failure in this file is a
problem with the agent or the fixture, never with spanpack.
"""

import json
import uuid

import msgpack
import pytest

SPAN = {
    "trace_id": 0xFEDCBA9876543210,  # above 2**63: must survive as unsigned 64-bit
    "span_id": 0x1234567890ABCDEF,
    "parent_id": 0,
    "service": "spanpack-smoke",
    "resource": "GET /users/{id}",
    "name": "http.request",
    "start": 1700000000123456789,
    "duration": 987654,
    "error": 1,
    "meta": {"http.method": "GET", "component": "smoke", "note": "héllo wörld ☃"},
    "metrics": {"_sampling_priority_v1": 1, "_dd.top_level": 1.0, "ratio": 0.25},
    "type": "web",
}


def one_trace_payload(span=SPAN):
    return msgpack.packb([[span]])


def test_v04_span_roundtrips_field_for_field(agent_session):
    status, body = agent_session.put_payload("v0.4", one_trace_payload(), trace_count=1)
    assert status == 200, body
    assert json.loads(body) == {"rate_by_service": {}}

    traces = agent_session.traces()
    assert len(traces) == 1 and len(traces[0]) == 1, traces
    got = traces[0][0]
    assert set(got) == set(SPAN)
    for key, value in SPAN.items():
        assert got[key] == value, key
        assert type(got[key]) is type(value), key


def test_v05_payload_is_decoded_with_its_string_table(agent_session):
    strings = ["", "svc5", "op.name", "resource five", "k", "v", "m", "custom"]
    # service, name, resource, trace_id, span_id, parent_id, start, duration,
    # error, meta, metrics, type -- strings as indexes into the table
    span = [1, 2, 3, 77, 88, 0, 1700000000000000000, 10, 0, {4: 5}, {6: 2.5}, 7]
    status, body = agent_session.put_payload("v0.5", msgpack.packb([strings, [[span]]]), 1)
    assert status == 200, body
    assert agent_session.traces() == [
        [
            {
                "service": "svc5",
                "name": "op.name",
                "resource": "resource five",
                "trace_id": 77,
                "span_id": 88,
                "parent_id": 0,
                "start": 1700000000000000000,
                "duration": 10,
                "error": 0,
                "meta": {"k": "v"},
                "metrics": {"m": 2.5},
                "type": "custom",
            }
        ]
    ]


@pytest.mark.parametrize("claimed", [0, 2, 5])
def test_wrong_trace_count_header_is_rejected(agent_session, claimed):
    # Proves the trace_count_header check is enabled: the same payload that
    # passes with the right count is refused with a wrong one.
    status, body = agent_session.put_payload("v0.4", one_trace_payload(), trace_count=claimed)
    assert status == 400, body
    assert "trace_count_header" in body
    assert "does not match actual number of traces (1)" in body


def test_missing_trace_count_header_is_rejected(agent_session):
    status, body = agent_session.put_payload("v0.4", one_trace_payload(), trace_count=None)
    assert status == 400, body
    assert "X-Datadog-Trace-Count header not found" in body


def test_missing_tracer_version_header_is_rejected(agent_session):
    status, body = agent_session.put_payload(
        "v0.4", one_trace_payload(), 1, headers={"Datadog-Meta-Tracer-Version": None}
    )
    assert status == 400, body
    assert "meta_tracer_version_header" in body


def test_payload_that_is_not_a_list_of_traces_is_rejected(agent_session):
    status, body = agent_session.put_payload("v0.4", msgpack.packb({"not": "traces"}), 0)
    assert status == 400, body


def test_sessions_are_separate_and_clear_forgets(test_agent):
    a, b = ("smoke-%s-%s" % (x, uuid.uuid4().hex) for x in "ab")
    test_agent.start_session(a)
    assert test_agent.put_payload("v0.4", one_trace_payload(), 1)[0] == 200
    test_agent.start_session(b)
    other = dict(SPAN, trace_id=1, span_id=2, service="other")
    assert test_agent.put_payload("v0.4", one_trace_payload(other), 1)[0] == 200

    assert test_agent.traces(a) == [[SPAN]]
    assert test_agent.traces(b) == [[other]]
    test_agent.clear(a)
    assert test_agent.traces(a) == []
    assert test_agent.traces(b) == [[other]]
