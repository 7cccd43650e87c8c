"""One mixed tags mapping for meta and metrics.

A span whose meta and metrics are one and the same dict (an object span with
fields={"meta": "tags", "metrics": "tags"}, or a dict span whose "meta" and
"metrics" keys hold one mapping) has it split by value type as the encoder
reads the span: str to meta, bool to meta as "true"/"false", int and float
to metrics, anything else a TypeError naming the span, the field and the key
(dropped and counted in lenient mode).

The reference for every case is the same span as a dict with two separate
dicts, split here in Python by the documented rule, through spanpack's own
separate meta/metrics path: the bytes must be equal (the split keeps the
mapping's order, and so does the reference).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Dict, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

import spanpack

from tests.support import assert_lenient_paths, good_span, one_payload

VERSIONS = ("v0.4", "v0.5", "v1.0")
PATHS = ("encode_traces", "put", "encode_trace")
MIXED = {"meta": "tags", "metrics": "tags"}
BASE_FIELDS = ("trace_id", "span_id", "parent_id", "service", "name", "resource", "span_type",
               "start_ns", "duration_ns", "error")


class Label(str):
    pass


class Count(int):
    pass


class Ratio(float):
    pass


class Level(enum.IntEnum):
    HIGH = 3


class SlotsSpan:
    __slots__ = BASE_FIELDS + ("tags",)

    def __init__(self, tags, **fields):
        for name, value in good_span(**fields).items():
            if name in BASE_FIELDS:
                setattr(self, name, value)
        self.tags = tags


class PlainSpan:
    def __init__(self, tags, **fields):
        for name, value in good_span(**fields).items():
            if name in BASE_FIELDS:
                setattr(self, name, value)
        self.tags = tags


@dataclass
class DataclassSpan:
    trace_id: int
    span_id: int
    parent_id: Optional[int]
    service: str
    name: str
    resource: str
    span_type: Optional[str]
    start_ns: int
    duration_ns: int
    error: int
    tags: Any


class PropertySpan:
    """Every field a property, the tags included."""

    def __init__(self, tags, **fields):
        self._values = {name: value for name, value in good_span(**fields).items() if name in BASE_FIELDS}
        self._values["tags"] = tags


for _name in BASE_FIELDS + ("tags",):
    setattr(PropertySpan, _name, property(lambda self, _name=_name: self._values[_name]))


class BuiltTagsSpan(PropertySpan):
    """Tags a property builds anew at every read (a copy of what the span
    keeps): read for meta and for metrics, two dicts, one mapping."""

    @property
    def tags(self):
        kept = self._values["tags"]
        return None if kept is None else dict(kept)


def make_span(form: str, tags: Any, **fields: Any) -> Any:
    """A span of `form` whose meta and metrics are the one mapping `tags`."""
    if form == "dict":
        return good_span(meta=tags, metrics=tags, **fields)
    if form == "dataclass":
        values = {name: value for name, value in good_span(**fields).items() if name in BASE_FIELDS}
        return DataclassSpan(tags=tags, **values)
    return {"slots": SlotsSpan, "plain": PlainSpan, "property": PropertySpan,
            "built": BuiltTagsSpan}[form](tags, **fields)


FORMS = ("slots", "plain", "dataclass", "property", "built", "dict")


def split(tags: Dict[str, Any]):
    """The documented rule, in Python: (meta, metrics)."""
    meta, metrics = {}, {}
    for key, value in tags.items():
        if isinstance(value, bool):
            meta[key] = "true" if value else "false"
        elif isinstance(value, str):
            meta[key] = value
        elif isinstance(value, (int, float)):
            metrics[key] = value
        else:
            raise AssertionError(f"not a mixed tag value: {value!r}")
    return meta, metrics


def reference(version: str, tags: Dict[str, Any], options: Optional[Dict[str, Any]] = None, **fields: Any) -> bytes:
    meta, metrics = split(tags)
    encoder = spanpack.TraceMsgPackEncoder(version, **(options or {}))
    return encoder.encode_traces([[good_span(meta=meta, metrics=metrics, **fields)]])


TAGS = {
    "http.method": "GET",
    "http.status_code": 200,
    "_sampling_priority_v1": 1,
    "cache.hit": True,
    "retry": False,
    "db.rows": 12.5,
    "peer.service": "db",
    "env": "prod",  # v1.0 writes env, version, component and span.kind as span fields
    "component": "web",
    "span.kind": "server",
    "version": 2,  # a number: a metric, never the version field
    "big": 2**63 - 1,
    "negative": -(2**63),
    "label": Label("sub"),
    "count": Count(7),
    "ratio": Ratio(0.25),
    "level": Level.HIGH,
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("form", FORMS)
def test_one_mapping_is_written_as_the_split_meta_and_metrics(form, version, path):
    encoder = spanpack.TraceMsgPackEncoder(version, None if form == "dict" else MIXED)
    span = make_span(form, dict(TAGS), span_id=9)
    assert one_payload(encoder, path, [[span]]) == reference(version, TAGS, span_id=9)


@pytest.mark.parametrize("version", ("v0.4", "v0.5"))
@pytest.mark.parametrize("form", ("slots", "dict"))
def test_default_tags_fill_in_as_for_separate_maps(form, version):
    options = {"default_meta": {"env": "prod", "http.method": "POST"},
               "default_metrics": {"_dd.measured": 1, "db.rows": 0}}
    encoder = spanpack.TraceMsgPackEncoder(version, None if form == "dict" else MIXED, **options)
    expected = reference(version, TAGS, options)
    for path in PATHS:
        assert one_payload(encoder, path, [[make_span(form, dict(TAGS))]]) == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_bools_are_text_in_meta(version):
    encoder = spanpack.TraceMsgPackEncoder(version, MIXED)
    payload = encoder.encode_traces([[SlotsSpan({"on": True, "off": False})]])
    expected = spanpack.TraceMsgPackEncoder(version).encode_traces(
        [[good_span(meta={"on": "true", "off": "false"}, metrics={})]])
    assert payload == expected


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("form", ("slots", "dict"))
def test_no_tags_and_an_empty_mapping_write_empty_maps(form, version):
    encoder = spanpack.TraceMsgPackEncoder(version, None if form == "dict" else MIXED)
    for tags in ({}, None):
        assert encoder.encode_traces([[make_span(form, tags)]]) == reference(version, {})


@pytest.mark.parametrize("version", VERSIONS)
def test_separate_dicts_with_equal_contents_keep_their_rules(version):
    # Only one dict given as both is split: two dicts, even equal, are meta
    # and metrics as always, so a str in metrics is still refused.
    encoder = spanpack.TraceMsgPackEncoder(version)
    with pytest.raises(TypeError, match="metrics key 'a'"):
        encoder.encode_traces([[good_span(meta={"a": "x"}, metrics={"a": "x"})]])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("bad", [None, b"bytes", ["a"], {"a": 1}, object()])
def test_any_other_value_is_refused_naming_span_field_and_key(bad, form, version):
    encoder = spanpack.TraceMsgPackEncoder(version, None if form == "dict" else MIXED)
    good = make_span(form, {"a": "x", "n": 1}, span_id=1)
    encoder.put([good])
    size = encoder.size
    with pytest.raises(TypeError) as raised:
        encoder.put([good, make_span(form, {"a": "x", "odd": bad}, span_id=2)])
    assert str(raised.value) == (
        "trace 0, span 1, meta key 'odd': a mixed tags mapping (one dict given as both meta and "
        f"metrics) takes str, bool, int or float, not {type(bad).__name__}")
    assert (len(encoder), encoder.size) == (1, size)
    [(payload, count)] = encoder.encode()
    assert count == 1
    assert payload == reference(version, {"a": "x", "n": 1}, span_id=1)


@pytest.mark.parametrize("version", VERSIONS)
def test_lenient_mode_drops_and_counts_other_values(version):
    tags = {"a": "x", "none": None, "n": 1, "raw": b"b"}
    encoder = spanpack.TraceMsgPackEncoder(version, MIXED, lenient=True)
    expected = reference(version, {"a": "x", "n": 1})
    assert_lenient_paths(encoder, [[SlotsSpan(tags)]], expected, drops=2)


@pytest.mark.parametrize("version", VERSIONS)
def test_what_meta_and_metrics_refuse_is_refused_the_same(version):
    # Keys and numbers go through the meta and metrics writers' own checks.
    encoder = spanpack.TraceMsgPackEncoder(version, MIXED)
    with pytest.raises(TypeError, match="trace 0, span 0, meta key 1: keys must be str, not int"):
        encoder.encode_traces([[SlotsSpan({1: "x"})]])
    with pytest.raises(ValueError, match="trace 0, span 0, metrics key 'huge': .* does not fit in 64 bits"):
        encoder.encode_traces([[SlotsSpan({"huge": 2**64})]])


def test_a_mapping_that_is_no_dict_is_refused_as_meta_is():
    encoder = spanpack.TraceMsgPackEncoder("v0.4", MIXED)
    with pytest.raises(TypeError, match="trace 0, span 0, meta"):
        encoder.encode_traces([[SlotsSpan([("a", "x")])]])


@pytest.mark.parametrize("version", VERSIONS)
def test_a_refused_value_among_numbers_only_is_refused_too(version):
    # No str entry, so no meta entry: the refused value still is refused.
    encoder = spanpack.TraceMsgPackEncoder(version, MIXED)
    with pytest.raises(TypeError, match="meta key 'odd': a mixed tags mapping"):
        encoder.encode_traces([[SlotsSpan({"n": 1, "odd": None})]])


@pytest.mark.parametrize("version", ("v0.4", "v0.5"))
def test_a_number_under_the_trace_id_high_key_is_a_metric(version):
    # A 128-bit trace's first span gets _dd.p.tid unless its meta has it:
    # a number under that key is a metric, so the meta still lacks it.
    tags = {"_dd.p.tid": 5, "a": "x"}
    encoder = spanpack.TraceMsgPackEncoder(version)
    payload = encoder.encode_traces([[good_span(trace_id=2**64 + 7, meta=tags, metrics=tags)]])
    expected = encoder.encode_traces(
        [[good_span(trace_id=2**64 + 7, meta={"a": "x"}, metrics={"_dd.p.tid": 5})]])
    assert payload == expected


@pytest.mark.parametrize("version", ("v0.4", "v0.5"))
def test_a_mapping_changed_after_it_was_counted_is_refused(version):
    # Converting a span's events runs Python code after the mapping's
    # entries were counted for the map headers: an entry added then would
    # make a header lie, so the trace is refused.
    class Event:
        time_unix_nano = 1
        attributes: Dict[str, Any] = {}

        @property
        def name(self):
            tags["late"] = "x"
            return "event"

    tags: Dict[str, Any] = {"a": "x", "n": 1}
    encoder = spanpack.TraceMsgPackEncoder(version)
    span = good_span(meta=tags, metrics=tags, events=[Event()])
    with pytest.raises(RuntimeError, match="dict changed during encoding"):
        encoder.encode_traces([[span]])


keys = st.text(min_size=0, max_size=12)
values = st.one_of(
    st.text(max_size=20),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
)


@given(tags=st.dictionaries(keys, values, max_size=20), version=st.sampled_from(VERSIONS),
       form=st.sampled_from(FORMS), path=st.sampled_from(PATHS))
def test_any_mixed_mapping_equals_its_split(tags, version, form, path):
    encoder = spanpack.TraceMsgPackEncoder(version, None if form == "dict" else MIXED)
    assert one_payload(encoder, path, [[make_span(form, dict(tags))]]) == reference(version, tags)
