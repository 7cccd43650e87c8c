"""ddtrace's own SpanLink read from its fields (links_events.c,
link_fields_made) must give the bytes, or the exception, that calling its
to_dict() gives.  The reference here is an object whose to_dict() calls the
link's to_dict(): always called, never read field by field."""

import dataclasses
import enum
import functools
import math
import sys

import pytest

import spanpack

from .test_links_events_paths import span_with

span_link = pytest.importorskip("ddtrace._trace._span_link")
formats = pytest.importorskip("ddtrace.internal.utils.formats")
SpanLink = span_link.SpanLink

VERSIONS = ["v0.4", "v0.5", "v1.0"]


class Called:
    def __init__(self, link):
        self.link = link

    def to_dict(self):
        return self.link.to_dict()


def outcome(version, links, encoder=None):
    try:
        encoder = encoder or spanpack.TraceMsgPackEncoder(version)
        return encoder.encode_traces([[span_with(links=links)]])
    except Exception as error:  # noqa: BLE001 - compared with the reference's
        return type(error), str(error)


def assert_as_to_dict(version, make):
    assert outcome(version, make()) == outcome(version, [Called(link) for link in make()])


def link_with(**fields):
    link = SpanLink(trace_id=1, span_id=1)
    for name, value in fields.items():
        setattr(link, name, value)
    return link


class Kind(enum.IntEnum):
    A = 5


class Text(str):
    pass


FIELDS = {
    "trace_id_0": dict(trace_id=0), "trace_id_negative": dict(trace_id=-1),
    "trace_id_2_64_less_1": dict(trace_id=2**64 - 1), "trace_id_2_64": dict(trace_id=2**64),
    "trace_id_2_128_less_1": dict(trace_id=2**128 - 1), "trace_id_2_128": dict(trace_id=2**128),
    "trace_id_bool": dict(trace_id=True), "trace_id_intenum": dict(trace_id=Kind.A),
    "trace_id_float": dict(trace_id=1.0), "span_id_0": dict(span_id=0), "span_id_2_64": dict(span_id=2**64),
    "span_id_2_64_less_1": dict(span_id=2**64 - 1), "span_id_bool": dict(span_id=False),
    "dropped_none": dict(_dropped_attributes=None), "dropped_negative": dict(_dropped_attributes=-3),
    "dropped_bool": dict(_dropped_attributes=True), "dropped_huge": dict(_dropped_attributes=2**70),
    "dropped_2_63": dict(_dropped_attributes=2**63), "dropped_float": dict(_dropped_attributes=1.5),
    "dropped_text": dict(_dropped_attributes="1"),
    "tracestate_none": dict(tracestate=None), "tracestate_empty": dict(tracestate=""),
    "tracestate_int": dict(tracestate=0), "tracestate_subclass": dict(tracestate=Text("x")),
    "tracestate_empty_subclass": dict(tracestate=Text("")),
    "flags_none": dict(flags=None), "flags_0": dict(flags=0), "flags_bool": dict(flags=True),
    "flags_negative": dict(flags=-1), "flags_huge": dict(flags=2**70),
    "attributes_none": dict(attributes=None), "attributes_list": dict(attributes=[]),
    "attributes_pairs": dict(attributes=[("a", "b")]), "attributes_int_key": dict(attributes={1: "x"}),
    "attributes_text_key": dict(attributes={Text("k"): "x"}),
    "attributes_numbers": dict(attributes={
        "b": True, "i": 5, "f": 1.5, "nan": math.nan, "inf": math.inf, "ninf": -math.inf, "nz": -0.0,
        "e16": 1e16, "em7": 1e-7, "big": 2**100, "neg": -(2**70), "e22": 1e22, "sum": 0.1 + 0.2,
        "max": sys.float_info.max, "tiny": 5e-324}),
    "attributes_none_value": dict(attributes={"n": None}), "attributes_bytes": dict(attributes={"b": b"x"}),
    "attributes_nested": dict(attributes={"l": [1, [2, (3, "x")], ()], "t": (True, 1.0)}),
    "attributes_set": dict(attributes={"s": {1}}), "attributes_frozenset": dict(attributes={"s": frozenset([1])}),
    "attributes_dict_value": dict(attributes={"d": {"x": 1}}),
    "attributes_deep_7": dict(attributes={"d": [[[[[[[1]]]]]]]}),
    "attributes_deep_8": dict(attributes={"d": [[[[[[[[1]]]]]]]]}),
    "attributes_deep_9": dict(attributes={"d": [[[[[[[[[1]]]]]]]]]}),
    "attributes_duplicate": dict(attributes={"a": [1], "a.0": 2}),
    "attributes_duplicate_first": dict(attributes={"a.0": 2, "a": [1]}),
    "attributes_only_empty_list": dict(attributes={"a": []}),
    "attributes_intenum": dict(attributes={"a": Kind.A}), "attributes_text_value": dict(attributes={"a": Text("v")}),
    "attributes_int_too_long": dict(attributes={"a": 10**5000}),
    "attributes_int_longest": dict(attributes={"a": 10**4299}),
    "attributes_empty_key": dict(attributes={"": "x"}), "attributes_surrogate_key": dict(attributes={"\ud800": "x"}),
    "attributes_surrogate_value": dict(attributes={"k": "\udc80"}),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(FIELDS))
def test_a_field_value_is_written_as_to_dict_makes_it(name, version):
    assert_as_to_dict(version, lambda: [link_with(**FIELDS[name])])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("field", ["trace_id", "span_id", "attributes"])
def test_a_field_the_link_lacks_raises_as_to_dict_does(field, version):
    def make():
        link = SpanLink(trace_id=1, span_id=1, attributes={"a": "b"})
        delattr(link, field)
        return [link]

    assert_as_to_dict(version, make)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_to_dict_set_on_the_link_is_called(version):
    def make():
        link = SpanLink(trace_id=1, span_id=1)
        link.to_dict = lambda: {"trace_id": "%032x" % 9, "span_id": "%016x" % 9}
        return [link]

    assert_as_to_dict(version, make)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_to_dict_wrapped_with_functools_wraps_is_called(version, monkeypatch):
    original = SpanLink.to_dict
    encoder = spanpack.TraceMsgPackEncoder(version)
    before = outcome(version, [SpanLink(trace_id=1, span_id=1)], encoder)

    @functools.wraps(original)
    def to_dict(self):
        made = original(self)
        made.setdefault("attributes", {})["patched"] = "yes"
        return made

    monkeypatch.setattr(SpanLink, "to_dict", to_dict)
    assert_as_to_dict(version, lambda: [SpanLink(trace_id=1, span_id=1)])
    after = outcome(version, [SpanLink(trace_id=1, span_id=1)], encoder)
    assert after != before
    assert after == outcome(version, [Called(SpanLink(trace_id=1, span_id=1))])


@pytest.mark.parametrize("version", VERSIONS)
def test_a_to_dict_whose_code_was_replaced_is_called(version, monkeypatch):
    encoder = spanpack.TraceMsgPackEncoder(version)
    outcome(version, [SpanLink(trace_id=1, span_id=1)], encoder)

    def to_dict(self):
        return {"trace_id": "%032x" % 3, "span_id": "%016x" % 3}

    monkeypatch.setattr(SpanLink.to_dict, "__code__", to_dict.__code__)
    expected = outcome(version, [Called(SpanLink(trace_id=1, span_id=1))])
    assert outcome(version, [SpanLink(trace_id=1, span_id=1)], encoder) == expected
    assert outcome(version, [SpanLink(trace_id=1, span_id=1)]) == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_a_replaced_flatten_key_value_is_called(version, monkeypatch):
    encoder = spanpack.TraceMsgPackEncoder(version)
    outcome(version, [SpanLink(trace_id=1, span_id=1, attributes={"k": "v"})], encoder)
    monkeypatch.setattr(span_link, "flatten_key_value", lambda key, value: {key.upper(): value})
    make = lambda: [SpanLink(trace_id=1, span_id=1, attributes={"k": "v"})]  # noqa: E731
    expected = outcome(version, [Called(link) for link in make()])
    assert outcome(version, make(), encoder) == expected
    assert outcome(version, make()) == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_a_replaced_is_sequence_is_called(version, monkeypatch):
    encoder = spanpack.TraceMsgPackEncoder(version)
    outcome(version, [SpanLink(trace_id=1, span_id=1, attributes={"k": [1, 2]})], encoder)
    monkeypatch.setattr(formats, "is_sequence", lambda value: False)
    make = lambda: [SpanLink(trace_id=1, span_id=1, attributes={"k": [1, 2]})]  # noqa: E731
    expected = outcome(version, [Called(link) for link in make()])
    assert outcome(version, make(), encoder) == expected
    assert outcome(version, make()) == expected


@dataclasses.dataclass
class Impostor:
    """Same module, name, fields, to_dict __module__ and __qualname__; not ddtrace's."""

    trace_id: int
    span_id: int
    tracestate: object = None
    flags: object = None
    attributes: dict = dataclasses.field(default_factory=dict)
    _dropped_attributes: int = 0

    def to_dict(self):
        return {"trace_id": "%032x" % 77, "span_id": "%016x" % 77}


Impostor.__name__ = Impostor.__qualname__ = "SpanLink"
Impostor.__module__ = Impostor.to_dict.__module__ = "ddtrace._trace._span_link"
Impostor.to_dict.__qualname__ = "SpanLink.to_dict"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_class_that_only_looks_like_ddtraces_is_called(version):
    assert_as_to_dict(version, lambda: [Impostor(1, 1)])


@pytest.mark.parametrize("version", VERSIONS)
def test_ddtraces_own_link_is_still_read_without_to_dict(version):
    calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "to_dict":
            calls.append(frame.f_code)

    links = [SpanLink(trace_id=2**100 + 5, span_id=7, attributes={"a": [1, "x"], "b": True},
                      tracestate="dd=s:1", flags=1, _dropped_attributes=2)]
    expected = outcome(version, [Called(link) for link in links])
    encoder = spanpack.TraceMsgPackEncoder(version)
    sys.setprofile(profile)
    try:
        got = [outcome(version, links, encoder) for _ in range(2)]
    finally:
        sys.setprofile(None)
    assert got == [expected, expected]
    if version != "v1.0":  # v1.0 converts links in Python
        assert calls == []
