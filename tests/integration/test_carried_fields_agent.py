"""The v1.0 payload fields of an AgentWriter mean the same to the agent in
every version it may send.

The writer sends the same traces with the same options three ways, to the
fault-injecting server: as v1.0, and as v0.5 and v0.4 after the agent refused
v1.0 (its /info lacks it, or it answers 404).  The payloads it sent are then
given to the APM test agent, which decodes them:

* payload_attributes: the test agent puts a v1.0 payload's attributes on
  every span that lacks the key (str as meta, numbers as metrics, bools as
  1/0); the v0.4/v0.5 spans must decode to the same spans;
* hostname, env, app_version: the Datadog agent reads them from a v1.0
  payload's fields, and from a v0.4/v0.5 payload's root span (meta
  ``_dd.hostname``; ``env`` and ``version`` of the root, else of any span):
  both must give the same values for every trace.  (The test agent does not
  put v1.0's payload fields on spans, so the tags that carry them in
  v0.4/v0.5 are checked on every span and then set aside.)
"""

from __future__ import annotations

import copy
import uuid
from typing import Any, Dict, List, Optional

import pytest

from spanpack.writer import supported_versions

from tests.integration import chained_trace
from tests.integration.fault_server import FaultServer
from tests.integration.test_v10_agent import assert_same, normalized
from tests.integration.test_writer import writers  # noqa: F401  (the fixture)
from tests.v10_decoder import decode

pytestmark = pytest.mark.skipif("v1.0" not in supported_versions(), reason="the installed encoder has no v1.0")

FIELDS = {
    "hostname": "web-1",
    "env": "prod",
    "app_version": "1.2.3",
    "runtime_id": "rt-42",
    "payload_attributes": {"_dd.git.commit.sha": "abc", "team": "core", "n": 7, "ratio": 0.25,
                           "on": True, "off": False},
}
# The tags v0.4/v0.5 carry the payload fields as (not attributes).
FIELD_TAGS = {"_dd.hostname": "web-1", "env": "prod", "version": "1.2.3", "runtime-id": "rt-42"}
# What the agent reads from a payload, by field.
AGENT_VIEW = {"hostname": "web-1", "env": "prod", "app_version": "1.2.3"}


def traces() -> List[List[Dict[str, Any]]]:
    """Chains of spans; some have an attribute's key themselves (theirs wins)."""
    made = []
    for t in range(1, 5):
        trace = chained_trace(t, 3, 10, service="svc", resource="res-%d" % t, meta={"k": "v%d" % t},
                              metrics={"m": 1.5})
        trace[1]["meta"]["team"] = "mine"
        trace[2]["metrics"]["n"] = 1
        made.append(trace)
    return made


def sent_payloads(writers, endpoints, rule=None, version="auto"):
    """(version, body, trace count) of each payload the writer delivered."""
    with FaultServer(endpoints) as server:
        server.keep_bodies = True
        server.rule = rule
        writer = writers(server.url, version=version, **FIELDS)
        for trace in traces():
            writer.write(trace)
        assert writer.flush(timeout=10)
        stats = writer.stats
        assert stats["traces_sent"] == len(traces()) and stats["traces_dropped"] == 0, stats
        accepted = list(server.accepted)
    return [(p.path.split("/")[1], p.body, len(p.traces)) for p in accepted]


def decoded_by_agent(agent, payloads) -> List[List[Dict[str, Any]]]:
    agent.start_session("carried-%s" % uuid.uuid4().hex)
    for version, body, count in payloads:
        status, reply = agent.put_payload(version, body, count)
        assert status == 200, reply
    return agent.traces()


def root(trace: List[Dict[str, Any]]) -> Dict[str, Any]:
    ids = {span["span_id"] for span in trace}
    return next(span for span in trace if not span.get("parent_id") or span["parent_id"] not in ids)


def tag_of_root_or_any(trace: List[Dict[str, Any]], key: str) -> Optional[str]:
    value = (root(trace).get("meta") or {}).get(key)
    if value is None:
        value = next((s["meta"][key] for s in trace if key in (s.get("meta") or {})), None)
    return value


def agent_view_of_spans(trace: List[Dict[str, Any]]) -> Dict[str, Any]:
    """What the agent reads from a v0.4/v0.5 trace (pkg/trace/agent: the
    payload has no such fields of its own)."""
    return {
        "hostname": (root(trace).get("meta") or {}).get("_dd.hostname"),
        "env": tag_of_root_or_any(trace, "env"),
        "app_version": tag_of_root_or_any(trace, "version"),
    }


def without_field_tags(decoded: List[List[Dict[str, Any]]]) -> List[List[Dict[str, Any]]]:
    """The decoded spans with the tags that carry the payload fields checked
    on every span, then removed; and an error of 0 and a type of "" removed
    (a v0.5 span array has every field, where v0.4 and v1.0 leave those
    out: not what this test is about)."""
    out = copy.deepcopy(decoded)
    for trace in out:
        for span in trace:
            assert {k: span["meta"].get(k) for k in FIELD_TAGS} == FIELD_TAGS, span
            for key in FIELD_TAGS:
                del span["meta"][key]
            if span.get("error") == 0:
                del span["error"]
            if span.get("type") == "":
                del span["type"]
    return out


@pytest.fixture(name="as_v10")
def _as_v10(writers):  # noqa: F811
    payloads = sent_payloads(writers, ["/v0.4/traces", "/v0.5/traces", "/v1.0/traces"], version="v1.0")
    assert {version for version, _, _ in payloads} == {"v1.0"}
    return payloads


FALLBACKS = {
    "v0.5 (no v1.0 in /info)": (["/v0.4/traces", "/v0.5/traces"], None, "v0.5"),
    "v0.4 (only v0.4 in /info)": (["/v0.4/traces"], None, "v0.4"),
    "v0.5 (404 for v1.0)": (["/v0.4/traces", "/v0.5/traces", "/v1.0/traces"],
                            lambda path, payload: ("status", 404) if path == "/v1.0/traces" else None, "v0.5"),
}


@pytest.mark.parametrize("fallback", list(FALLBACKS))
def test_fallback_payloads_decode_to_the_v10_spans(agent_session, writers, as_v10, fallback):  # noqa: F811
    endpoints, rule, expected_version = FALLBACKS[fallback]
    fallen = sent_payloads(writers, endpoints, rule)
    assert {version for version, _, _ in fallen} == {expected_version}
    reference = decoded_by_agent(agent_session, as_v10)
    got = decoded_by_agent(agent_session, fallen)
    # The attributes: on every span lacking the key, the span's own value kept.
    for decoded in (reference, got):
        spans = [span for trace in decoded for span in trace]
        assert len(spans) == 12
        for span in spans:
            assert span["meta"]["_dd.git.commit.sha"] == "abc"
            assert span["meta"]["team"] in ("core", "mine")
            assert (span["metrics"]["n"], span["metrics"]["ratio"]) in ((7, 0.25), (1, 0.25))
            assert (span["metrics"]["on"], span["metrics"]["off"]) == (1, 0)
        assert sum(span["meta"]["team"] == "mine" for span in spans) == 4
    assert_same(normalized(without_field_tags(got)), normalized(reference), fallback)
    # hostname, env, app version: as the agent reads each version.
    for _, body, _ in as_v10:
        fields = decode(body)
        assert {"hostname": fields.get(8), "env": fields.get(7), "app_version": fields.get(9)} == AGENT_VIEW
    assert len(got) == len(traces())
    for trace in got:
        assert agent_view_of_spans(trace) == AGENT_VIEW
