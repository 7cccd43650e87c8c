"""One trace, one meaning, through Datadog's APM test agent: a bounded sample
of generated traces with the values the versions used to disagree on
(negative times, bad text under the tags v1.0 turns into fields, span.kind
text outside the kinds, empty env, a later span's own _dd.p.tid, subclassed
event values), sent lenient as v0.4, v0.5 and v1.0 through every entry
point: the agent accepts every payload and gives back the same spans.
tests/spans/test_one_meaning.py checks the same without the agent, on more
examples and with refusals."""

from __future__ import annotations

import copy
from typing import Any, Dict, List

from hypothesis import given
from hypothesis import strategies as st

from tests.integration.test_v10_agent import (
    AGENT_PROPERTY,
    ENTRIES,
    _agent_traces,
    _form,
    _v10_payloads,
    assert_same,
    normalized,
    v10_traces,
)
from tests.spans.test_one_meaning import Label, Level, Ratio

_ODD_TAGS = {
    "env": st.sampled_from(["prod", "", b"\xff", "\ud800"]),
    "version": st.sampled_from(["1.0", "", b"v2"]),
    "component": st.sampled_from(["django", "\ud800"]),
    "span.kind": st.sampled_from(["server", "internal", "gateway", "CLIENT", ""]),
}


@st.composite
def odd_traces(draw) -> List[Dict[str, Any]]:
    traces = draw(v10_traces(max_traces=2))
    for trace in traces:
        for index, span in enumerate(trace["spans"]):
            span["meta"] = dict(span["meta"])
            span["meta"].pop("_dd.p.tid", None) if index else None
            if draw(st.booleans()):
                span["duration_ns"] = -draw(st.integers(1, 10**9))
            if draw(st.integers(0, 3)) == 0:
                span["start_ns"] = -draw(st.integers(1, 10**9))
            for name, values in _ODD_TAGS.items():
                if draw(st.integers(0, 2)) == 0:
                    span["meta"][name] = draw(values)
            if index and draw(st.integers(0, 3)) == 0:
                span["meta"]["_dd.p.tid"] = draw(st.sampled_from(["zz", "00000000000000ab"]))
            for event in span["events"]:
                event["attributes"] = {
                    k: (Ratio(v) if type(v) is float else Level.HIGH if v == 3 and type(v) is int
                        else Label(v) if type(v) is str else v)
                    for k, v in event["attributes"].items()
                }
    return traces


def _zero_negative_times(traces: List[List[Dict[str, Any]]]) -> List[List[Dict[str, Any]]]:
    """v0.4 writes a negative time as given and the test agent returns it;
    the agent's normalizer reads a negative duration as 0, which is what
    v0.5 and v1.0 write.  The test agent also sets _dd.p.tid from v1.0's
    chunk trace id on every span, over a span's own."""
    out = copy.deepcopy(traces)
    for trace in out:
        for span in trace:
            for key in ("start", "duration"):
                if isinstance(span.get(key), int) and span[key] < 0:
                    span[key] = 0
            (span.get("meta") or {}).pop("_dd.p.tid", None)
    return out


def _v05_shape(traces: List[List[Dict[str, Any]]]) -> List[List[Dict[str, Any]]]:
    """What v0.5 spells differently (docs/wire-format.md): every field
    present ("" and 0 for none), the error as its int, no meta_struct."""
    out = copy.deepcopy(traces)
    for trace in out:
        for span in trace:
            for key in ("service", "resource", "type", "name"):
                if span.get(key) in ("", None):
                    span.pop(key, None)
            if span.get("error"):
                span["error"] = 1  # v0.5 carries the int32, v0.4 writes 1
            for key in ("duration", "error", "parent_id"):
                if span.get(key) in (0, None):
                    span.pop(key, None)
            span.pop("meta_struct", None)
            if not span.get("metrics"):
                span.pop("metrics", None)
    return out


def _encode(version: str, traces: List[list], entry: str):
    options = {} if version == "v1.0" else {"native_span_events": True}
    return _v10_payloads(traces, entry, version, lenient=True, **options)


@AGENT_PROPERTY
@given(traces=odd_traces())
def test_agent_same_spans_from_every_version(test_agent, traces):
    expected = _zero_negative_times(
        _agent_traces(test_agent, "v0.4", _encode("v0.4", _form(traces, "dict"), "encode_traces")))
    for entry in ENTRIES:
        got = _agent_traces(test_agent, "v1.0", _encode("v1.0", _form(traces, "dict"), entry))
        assert_same(normalized(_zero_negative_times(got)), normalized(expected), "v1.0 " + entry)
    # v0.5 carries links and events as JSON meta: compared without them.
    # It also leaves an empty origin out, so a span's own `_dd.origin` tag
    # stays where v0.4's "" entry overrides it (docs/wire-format.md): such
    # tags are left out of traces whose origin is "".
    plain = copy.deepcopy(traces)
    for trace in plain:
        for span in trace["spans"]:
            span["links"], span["events"] = [], []
            if trace.get("origin") == "":
                span["meta"].pop("_dd.origin", None)
    expected = _v05_shape(_zero_negative_times(
        _agent_traces(test_agent, "v0.4", _encode("v0.4", _form(plain, "dict"), "encode_traces"))))
    for entry in ENTRIES:
        got = _agent_traces(test_agent, "v0.5", _encode("v0.5", _form(plain, "dict"), entry))
        assert_same(normalized(_v05_shape(_zero_negative_times(got))), normalized(expected),
                    "v0.5 " + entry)
