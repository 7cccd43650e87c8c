"""ddtrace's pure-Python SpanLink (ddtrace 4.2 and 4.3): the encoder reads
its fields and applies the link rules its to_dict() applies, without calling
it; what those rules decline is made by to_dict() itself.  The payload must
be the one to_dict() gives, byte for byte: here a subclass of SpanLink (whose
to_dict() is always called) is the reference, for every field kind the
dataclass may hold."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spanpack

from .test_links_events_paths import span_with

span_link = pytest.importorskip("ddtrace._trace._span_link")
SpanLink = span_link.SpanLink

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class CalledLink(SpanLink):
    """A subclass: not ddtrace's own class, so its to_dict() is called."""


class Text(str):
    pass


scalars = st.one_of(
    st.text(max_size=4), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.sampled_from([None, Text("t"), math.inf, b"x", 0, -1, 2**63]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.lists(inner, max_size=3).map(tuple),
                                                        st.frozensets(st.integers(0, 3), max_size=2)),
                      max_leaves=6)
link_fields = st.fixed_dictionaries({
    "trace_id": st.one_of(st.integers(-1, 2**64 + 1), st.integers(2**127, 2**128 + 1), st.just(True)),
    "span_id": st.one_of(st.integers(-1, 2**64 + 1), st.just(False)),
    "tracestate": st.sampled_from([None, "", "dd=s:1", 0, Text("x")]),
    "flags": st.sampled_from([None, 0, 1, 2**31, True, -1]),
    "attributes": st.one_of(st.dictionaries(st.one_of(st.text(max_size=3), st.sampled_from(["a.0", 1])), values,
                                            max_size=4),
                            st.sampled_from([{}, None])),
})
dropped = st.sampled_from([0, 1, 5, -1, True, 2**70])


def outcome(version, links):
    try:
        return spanpack.TraceMsgPackEncoder(version).encode_traces([[span_with(links=links)]])
    except Exception as error:  # noqa: BLE001 - the reference's outcome is compared
        return type(error), str(error)


def made(cls, fields, dropped_count):
    """A link holding the fields as given (its constructor refuses some ids:
    they are set after it)."""
    link = cls(trace_id=1, span_id=1)
    for name, value in fields.items():
        setattr(link, name, value)
    link._dropped_attributes = dropped_count
    return link


@SETTINGS
@given(st.lists(st.tuples(link_fields, dropped), min_size=1, max_size=3), st.sampled_from(["v0.4", "v0.5"]))
def test_a_span_link_is_written_as_its_to_dict_makes_it(links, version):
    own = [made(SpanLink, fields, count) for fields, count in links]
    called = [made(CalledLink, fields, count) for fields, count in links]
    assert outcome(version, own) == outcome(version, called)


def test_a_span_link_whose_to_dict_was_replaced_is_written_by_it(monkeypatch):
    """A to_dict() put on the class since is called, as any link's; the
    class is asked about again once changed."""
    link = SpanLink(trace_id=1, span_id=2, attributes={"k": "v"})
    before = outcome("v0.4", [link])
    monkeypatch.setattr(SpanLink, "to_dict", lambda self: {"trace_id": "%032x" % 7, "span_id": "%016x" % 8})
    encoder = spanpack.TraceMsgPackEncoder("v0.4")
    replaced = encoder.encode_traces([[span_with(links=[link])]])
    assert replaced != before
    assert replaced == outcome("v0.4", [SpanLink(trace_id=7, span_id=8)])
    monkeypatch.undo()
    assert encoder.encode_traces([[span_with(links=[link])]]) == before
