"""Adversarial checks of pyint_magnitude64_api (links, events, JSON text) and
of the v0.4 string cache skipping strs held by a tags dict made for the read.

Every int at and around each 64-bit bound, of every class json and the rules
treat differently, through every path that reads link and event ints, against
spanpack._extras (json.dumps); and the v0.4 payload with the string cache the
same bytes as without it, whatever shape the tags dicts take."""

import enum
import sys
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spanpack
from spanpack import _extras

from .test_links_events_paths import (
    IntSubclass,
    LinkObject,
    assert_written_as_reference,
    encoded,
    packed,
    reference,
    span_with,
)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Color(enum.IntEnum):
    RED = 2**63  # an int subclass whose repr/str is its own


BOUNDS = sorted({sign * (2**bits + delta) for bits in (0, 31, 32, 62, 63, 64, 65, 127, 128)
                 for delta in (-1, 0, 1) for sign in (1, -1)} | {0})
CLASSES = [int, IntSubclass, lambda value: Color.RED if value == 2**63 else value]
# Every bound, and the new C range: -(2**64 - 1) .. -(2**63) - 1.
bound_ints = st.one_of(
    st.sampled_from(BOUNDS),
    st.integers(-(2**64) - 2, -(2**63) + 2),
    st.integers(2**63 - 2, 2**64 + 2),
    st.integers(-(2**128) - 2, 2**128 + 2),
)
any_ints = st.one_of(bound_ints, bound_ints.map(IntSubclass), st.booleans(), st.just(Color.RED))


def test_json_dumps_writes_the_new_c_range_as_c_does():
    """The negative range moved to C: json.dumps's own text at every bound."""
    for value in BOUNDS:
        for make in CLASSES:
            number = make(value)
            items = [{"name": "e", "time_unix_nano": number, "attributes": {"k": [number, (number,)],
                                                                          "d": {"n": number}}}]
            for version in ("v0.4", "v0.5"):
                got = encoded(version, span_with(events=items))
                expected = _extras.events_json(items)
                assert not isinstance(got, Exception), got
                meta = got["meta"] if version == "v0.4" else got[9]
                assert meta["events"] == expected, (version, number)


@SETTINGS
@given(st.lists(any_ints, min_size=1, max_size=4), st.sampled_from(["v0.4", "v0.5"]))
def test_events_json_ints(numbers, version):
    items = [{"name": "e", "time_unix_nano": numbers[0], "attributes": {"k": numbers, "t": tuple(numbers)}}]
    expected = reference(_extras.events_json, items)
    expected = expected if isinstance(expected, Exception) else _extras._truncate(expected)
    got = encoded(version, span_with(events=items))
    assert_written_as_reference(
        got, expected, lambda span: (span["meta"] if version == "v0.4" else span[9])["events"])


@SETTINGS
@given(st.lists(any_ints, min_size=1, max_size=4))
def test_native_event_int_values(numbers):
    items = [{"name": "e", "time_unix_nano": abs(int(numbers[0])),
              "attributes": {"k%d" % i: n for i, n in enumerate(numbers)} | {"l": list(numbers)}}]
    expected = reference(_extras.events_for_v04, items, pack=True)
    got = encoded("v0.4", span_with(events=items), native_span_events=True)
    assert_written_as_reference(got, expected, lambda span: packed(span["span_events"]))


@SETTINGS
@given(any_ints, any_ints, st.one_of(st.none(), any_ints), st.one_of(st.none(), any_ints),
       st.lists(any_ints, max_size=3), st.booleans())
def test_protocol_link_ints(trace_id, span_id, flags, dropped, attribute_ints, as_object):
    fields = {"trace_id": trace_id, "span_id": span_id, "flags": flags,
              "dropped_attributes_count": dropped,
              "attributes": {"a%d" % i: n for i, n in enumerate(attribute_ints)} | {"l": attribute_ints}}
    link = types.SimpleNamespace(**fields) if as_object else fields
    expected = reference(_extras.links_for_v04, [link], pack=True)
    got = encoded("v0.4", span_with(links=[link]))
    assert_written_as_reference(got, expected, lambda span: packed(span["span_links"]))
    expected = reference(_extras.links_json, [link])
    expected = expected if isinstance(expected, Exception) else _extras._truncate(expected)
    got = encoded("v0.5", span_with(links=[link]))
    assert_written_as_reference(got, expected, lambda span: span[9]["_dd.span_links"])


@SETTINGS
@given(st.integers(0, 2**128 - 1), st.integers(0, 2**64 - 1), any_ints, any_ints)
def test_to_dict_link_extra_ints(trace_id, span_id, flags, other):
    """to_dict() ints other than the ids: flags (bit 31 set) and any other
    key (put_plain_int), in v0.4 and in v0.5 JSON."""
    link = LinkObject({"trace_id": "%032x" % trace_id, "span_id": "%016x" % span_id,
                       "flags": flags, "other": other})
    expected = reference(_extras.links_for_v04, [link], pack=True)
    got = encoded("v0.4", span_with(links=[link]))
    assert_written_as_reference(got, expected, lambda span: packed(span["span_links"]))
    expected = reference(_extras.links_json, [link])
    got = encoded("v0.5", span_with(links=[link]))
    assert_written_as_reference(got, expected, lambda span: span[9]["_dd.span_links"])


@pytest.mark.parametrize("high", [1, 2**4, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1])
def test_trace_id_high_tag_is_016x(high):
    low = 2**64 - 1
    span = span_with(trace_id=(high << 64) | low)
    got = encoded("v0.4", span)
    assert got["meta"]["_dd.p.tid"] == "{:016x}".format(high)
    assert got["trace_id"] == low


def test_small_int_max_str_digits_changes_nothing_within_64_bits():
    if not hasattr(sys, "set_int_max_str_digits"):
        pytest.skip("no limit on int digits in this interpreter")
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        for value in (-(2**64) + 1, 2**64 - 1, 10**639, -(10**640), 10**700):
            items = [{"name": "e", "time_unix_nano": 1, "attributes": {"k": value}}]
            expected = reference(_extras.events_json, items)
            got = encoded("v0.5", span_with(events=items))
            assert_written_as_reference(got, expected, lambda span: span[9]["events"])
            link = {"trace_id": 1, "span_id": 2, "attributes": {"k": value}}
            expected = reference(_extras.links_json, [link])
            got = encoded("v0.5", span_with(links=[link]))
            assert_written_as_reference(got, expected, lambda span: span[9]["_dd.span_links"])
    finally:
        sys.set_int_max_str_digits(old)


# ---------------------------------------------------------------------------
# The v0.4 string cache: never a byte of difference


class Getters:
    """meta and metrics read through properties; `mode` says what they give."""

    __slots__ = ("trace_id", "span_id", "parent_id", "name", "service", "resource", "start_ns",
                 "duration_ns", "error", "_meta", "_metrics", "_mode", "_kept")

    def __init__(self, span_id, meta, metrics, mode):
        self.trace_id, self.span_id, self.parent_id = 7, span_id, None
        self.name, self.service, self.resource = "n", "s", "r"
        self.start_ns, self.duration_ns, self.error = 1, 2, 0
        self._meta, self._metrics, self._mode, self._kept = meta, metrics, mode, None

    def _give(self, tags):
        if self._mode == "new":
            return dict(tags)
        if self._mode == "subclass":
            return DictSub(tags)
        if self._mode == "same":
            return tags
        if self._mode == "fresh-values":  # values held by the new dict alone
            return {k: (v + "") if isinstance(v, str) else v for k, v in tags.items()}
        if self._mode == "mixed":  # meta and metrics one new dict
            if self._kept is None:
                self._kept = {**self._meta, **self._metrics}
            return self._kept
        raise AssertionError(self._mode)

    @property
    def meta(self):
        return self._give(self._meta)

    @property
    def metrics(self):
        return self._give(self._metrics)


class DictSub(dict):
    pass


def _payloads(make_traces, version="v0.4", rounds=3, **options):
    """encode_traces and put()/encode() with interning on, several rounds,
    against one encoding with it off."""
    reference_encoder = spanpack.TraceMsgPackEncoder(version, intern=False, **options)
    expected = reference_encoder.encode_traces(make_traces())
    encoder = spanpack.TraceMsgPackEncoder(version, **options)
    for _ in range(rounds):
        assert encoder.encode_traces(make_traces()) == expected
    buffered = spanpack.TraceMsgPackEncoder(version, **options)
    ref_buffered = spanpack.TraceMsgPackEncoder(version, intern=False, **options)
    for _ in range(rounds):
        for trace in make_traces():
            buffered.put(trace)
            ref_buffered.put(trace)
        assert buffered.encode() == ref_buffered.encode()
    return expected


shared_values = ["shared-%d" % i for i in range(8)]


def _tags(i, share):
    meta = {"k%d" % (i % 5): shared_values[i % 8] if share else "v-%d" % i, "shared.key": shared_values[0],
            "uniq-%d" % i: "x" * (i % 300)}
    metrics = {"m%d" % (i % 3): 1.5, "shared.metric": i}
    return meta, metrics


@pytest.mark.parametrize("version", ["v0.4", "v0.5", "v1.0"])
@pytest.mark.parametrize("mode", ["new", "subclass", "same", "fresh-values", "mixed"])
@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("defaults", [False, True])
def test_cache_skip_never_changes_bytes(version, mode, share, defaults):
    fields = {"meta": "meta", "metrics": "metrics"}
    options = {}
    if mode == "mixed":
        fields = None
    if defaults and version != "v1.0":
        options = {"default_meta": {"env": "prod", "shared.key": "default"},
                   "default_metrics": {"_sampling_priority_v1": 1}}
    tags = [_tags(i, share) for i in range(300)]

    def make_traces():
        spans = [Getters(i + 1, *tags[i], mode) for i in range(300)]
        return [spans[i:i + 30] for i in range(0, 300, 30)]

    if mode == "mixed":
        # meta and metrics from one "tags" property giving the same new dict twice
        class Mixed(Getters):
            __slots__ = ()

            @property
            def tags(self):
                return self._give(self._meta)  # one kept dict: read twice, the same object

        def make_traces():  # noqa: F811
            spans = [Mixed(i + 1, tags[i][0], tags[i][1], "mixed") for i in range(300)]
            return [spans[i:i + 30] for i in range(0, 300, 30)]

        fields = {"meta": "tags", "metrics": "tags"}
    _payloads(make_traces, version, fields=fields, **options)


@pytest.mark.parametrize("lenient", [False, True])
def test_cache_skip_after_an_error_mid_map(lenient):
    """A span whose new meta dict holds a bad value mid-way: the error (or,
    lenient, the dropped tag) leaves the next traces' bytes those of an
    encoder without a cache."""

    class Bad(Getters):
        __slots__ = ()

        @property
        def meta(self):
            m = dict(self._meta)
            m["zz-bad"] = 3  # not a str: refused, or dropped when lenient
            m["zz-after"] = shared_values[1]
            return m

    tags = [_tags(i, True) for i in range(60)]
    encoders = {intern: spanpack.TraceMsgPackEncoder("v0.4", lenient=lenient, intern=intern)
                for intern in (True, False)}
    results = {}
    for intern, encoder in encoders.items():
        out = []
        for _ in range(3):
            good = [[Getters(i + 1, *tags[i], "new") for i in range(60)]]
            bad = [[Getters(1, *tags[0], "new"), Bad(2, *tags[1], "new"), Getters(3, *tags[2], "new")]]
            try:
                out.append(encoder.encode_traces(bad))
            except Exception as error:  # noqa: BLE001
                out.append(type(error).__name__)
            out.append(encoder.encode_traces(good))
            encoder.put(good[0])
            try:
                encoder.put(bad[0])
            except Exception as error:  # noqa: BLE001
                out.append(type(error).__name__)
            out.append(encoder.encode())
        results[intern] = out
    assert results[True] == results[False]
    if not lenient:
        assert "TypeError" in results[True] or "ValueError" in results[True]


def test_getter_reentering_the_encoder_between_meta_and_metrics():
    """A metrics getter that encodes with the same encoder, after a
    made-for-this-read meta dict: the outer and inner payloads are those of
    an encoder without a cache doing the same."""
    tags = [_tags(i, True) for i in range(20)]

    class Reentrant(Getters):
        __slots__ = ()
        encoder = None
        inner = None

        @property
        def metrics(self):
            try:
                Reentrant.inner.append(Reentrant.encoder.encode_traces([[Getters(99, *tags[3], "new")]]))
            except Exception as error:  # noqa: BLE001
                Reentrant.inner.append(repr(error))
            return dict(self._metrics)

    results = {}
    for intern in (True, False):
        Reentrant.encoder = spanpack.TraceMsgPackEncoder("v0.4", intern=intern)
        Reentrant.inner = []
        outer = [Reentrant.encoder.encode_traces([[Reentrant(i + 1, *tags[i], "new") for i in range(20)]])
                 for _ in range(3)]
        results[intern] = (outer, Reentrant.inner)
    assert results[True] == results[False]


@SETTINGS
@given(st.lists(st.tuples(st.dictionaries(st.sampled_from(shared_values + ["a", "b", "é", "x" * 40]),
                                          st.sampled_from(shared_values + ["v", "é", "x" * 300]), max_size=6),
                          st.sampled_from(["new", "subclass", "same", "fresh-values"])),
                min_size=1, max_size=20))
def test_cache_skip_random(spans_tags):
    def make_traces():
        return [[Getters(i + 1, meta, {"n": 1}, mode) for i, (meta, mode) in enumerate(spans_tags)]]

    _payloads(make_traces, rounds=2)
