"""Default tags (``default_meta=`` / ``default_metrics=``, v0.4 and v0.5).

Every span gets each default tag whose key it does not have itself, after its
own entries.  The reference for every byte is msgpack-python packing the
spans as they would be after ``meta.setdefault(key, value)`` for each default
(v0.5: with the string table built in the order the strings are first
written), through every entry point; the buffered encoder's size, its limits
and its rollback on a failed trace are checked with defaults on.
"""

from __future__ import annotations

import enum
from typing import Any, Dict, List, Optional

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spanpack import BufferFull, TraceMsgPackEncoder
from spanpack._spanpack import (
    MAX_TEXT_LEN,
    ORIGIN_KEY,
    SPAN_EVENTS_KEY,
    SPAN_LINKS_KEY,
    TRACE_ID_HIGH_KEY,
    TRUNCATED_PREFIX_LEN,
    TRUNCATION_SUFFIX,
)

from tests.spans.test_buffered import HookSpan  # a span whose resource runs a hook
from tests.support import assert_all_paths_equal, assert_lenient_paths, describe_difference, spanpack_paths

VERSIONS = ["v0.4", "v0.5"]
DEFAULT_META = {"_dd.hostname": "web-1", "env": "prod", "version": "1.2.3", "runtime-id": "rt-1"}
DEFAULT_METRICS = {"n": 7, "ratio": 0.25, "on": 1, "big": (1 << 64) - 1, "neg": -(1 << 63)}


def span(span_id: int, meta: Any = "absent", metrics: Any = "absent", **fields: Any) -> Dict[str, Any]:
    """A dict span of the fields the references below write; "absent" leaves
    meta or metrics out of the dict."""
    out = {"trace_id": 77, "span_id": span_id, "name": "op", "service": "svc", "resource": "res-%d" % span_id,
           "start_ns": 1_700_000_000_000_000_000 + span_id, "duration_ns": 10 + span_id}
    out.update(fields)
    if meta != "absent":
        out["meta"] = meta
    if metrics != "absent":
        out["metrics"] = metrics
    return out


def with_defaults(tags: Any, defaults: Dict[str, Any]) -> Dict[str, Any]:
    """The span's tag dict after setdefault of every default."""
    merged = dict(tags) if isinstance(tags, dict) else {}
    for key, value in defaults.items():
        merged.setdefault(key, value)
    return merged


def reference_payload(version: str, traces: List[List[Dict[str, Any]]], meta: Dict[str, str],
                      metrics: Dict[str, Any], extra_meta: Optional[Dict[str, str]] = None) -> bytes:
    """msgpack-python's bytes for `traces` with the defaults set on each span
    by setdefault (`extra_meta`: entries the encoder adds after them on the
    first span of each trace: its _dd.p.tid, or an origin)."""
    table: List[str] = ["", ORIGIN_KEY]

    def index(text: Optional[str]) -> int:
        if text is None:
            return 0
        if text not in table:
            table.append(text)
        return table.index(text)

    out = []
    for trace in traces:
        spans = []
        for position, s in enumerate(trace):
            span_meta = with_defaults(s.get("meta"), meta)
            if position == 0 and extra_meta:
                span_meta.update(extra_meta)
            span_metrics = with_defaults(s.get("metrics"), metrics)
            if version == "v0.4":
                written: Dict[str, Any] = {
                    "trace_id": trace[0]["trace_id"] & ((1 << 64) - 1), "span_id": s["span_id"],
                    "service": s["service"], "resource": s["resource"], "name": s["name"],
                    "start": s["start_ns"], "duration": s["duration_ns"],
                }
                if span_meta:
                    written["meta"] = span_meta
                if span_metrics:
                    written["metrics"] = span_metrics
                spans.append(written)
            else:
                strings = [index(s["service"]), index(s["name"]), index(s["resource"])]
                meta_indexes = {}
                for key, value in span_meta.items():
                    key_index = index(key)  # the key enters the table before its value
                    meta_indexes[key_index] = index(value)
                metric_indexes = {index(key): value for key, value in span_metrics.items()}
                spans.append(strings + [trace[0]["trace_id"] & ((1 << 64) - 1), s["span_id"], 0,
                                        s["start_ns"], s["duration_ns"], 0, meta_indexes, metric_indexes, 0])
        out.append(spans)
    if version == "v0.4":
        return msgpack.packb(out)
    return msgpack.packb([table, out])


def encoder(version: str, **options: Any) -> TraceMsgPackEncoder:
    return TraceMsgPackEncoder(version, default_meta=DEFAULT_META, default_metrics=DEFAULT_METRICS, **options)


# A span of each form: with none of the default keys, some, all of them; meta
# and metrics None, absent and empty.
SHAPES = [
    span(1),
    span(2, meta=None, metrics=None),
    span(3, meta={}, metrics={}),
    span(4, meta={"a": "b", "env": "staging"}, metrics={"n": 1.5, "x": 3}),
    span(5, meta=dict(DEFAULT_META, own="x"), metrics=dict(DEFAULT_METRICS)),
    span(6, meta={"version": "own"}, metrics=None),
    span(7, meta=None, metrics={"ratio": 9}),
]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("intern", [True, False])
def test_defaults_match_msgpack_python_after_setdefault(version, intern):
    """Every shape, as one trace and as one trace per span, through every
    entry point: the bytes of the spans after setdefault of each default."""
    for traces in ([SHAPES], [[s] for s in SHAPES], [SHAPES[3:], SHAPES[:3], SHAPES]):
        expected = reference_payload(version, traces, DEFAULT_META, DEFAULT_METRICS)
        options = {"intern": intern} if version == "v0.4" else {}
        paths = spanpack_paths(version, traces, default_meta=DEFAULT_META, default_metrics=DEFAULT_METRICS,
                               **options)
        assert_all_paths_equal(expected, paths)


tag_keys = st.sampled_from(["env", "version", "a", "b", "_dd.hostname", "n", "x", "ratio"])
tag_values = st.text(alphabet="pqrs\u00e9\u4e2d", max_size=4)
metric_values = st.one_of(st.integers(-(1 << 63), (1 << 64) - 1), st.floats(allow_nan=False))
maybe = lambda strategy: st.one_of(st.just("absent"), st.none(), strategy)  # noqa: E731


@settings(max_examples=150, deadline=None)
@given(
    version=st.sampled_from(VERSIONS),
    meta=st.dictionaries(tag_keys, tag_values, max_size=4),
    metrics=st.dictionaries(tag_keys, metric_values, max_size=4),
    spans=st.lists(st.tuples(maybe(st.dictionaries(tag_keys, tag_values, max_size=5)),
                             maybe(st.dictionaries(tag_keys, metric_values, max_size=5))),
                   min_size=1, max_size=4),
    split=st.booleans(),
)
def test_generated_defaults_match_msgpack_python(version, meta, metrics, spans, split):
    """Generated defaults and span tags (keys drawn from one small set, so
    that spans often have a default's key): every entry point writes the
    setdefault reference."""
    made = [span(i + 1, meta=m, metrics=n) for i, (m, n) in enumerate(spans)]
    traces = [[s] for s in made] if split else [made]
    expected = reference_payload(version, traces, meta, metrics)
    assert_all_paths_equal(expected, spanpack_paths(version, traces, default_meta=meta or None,
                                                    default_metrics=metrics or None))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_spans_own_value_wins_and_no_key_is_written_twice(version):
    """A span with a default's key keeps its value; the map holds each key
    once (decoded as pairs, so that a duplicate would show)."""
    trace = [span(1, meta={"env": "staging"}, metrics={"n": 1})]
    pairs = msgpack.unpackb(encoder(version).encode_traces([trace]), object_pairs_hook=list, strict_map_key=False)
    if version == "v0.4":
        written = dict(pairs[0][0])
        meta, metrics = written["meta"], written["metrics"]
    else:
        table, traces = pairs
        meta = [(table[k], table[v]) for k, v in traces[0][0][9]]
        metrics = [(table[k], v) for k, v in traces[0][0][10]]
    assert [k for k, _ in meta] == ["env", "_dd.hostname", "version", "runtime-id"]
    assert dict(meta)["env"] == "staging"
    assert [k for k, _ in metrics] == ["n", "ratio", "on", "big", "neg"]
    assert dict(metrics)["n"] == 1


class Text(str):
    pass


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("own_key", [b"env", Text("env")], ids=["bytes", "str-subclass"])
def test_a_key_the_span_has_in_another_text_form_counts_as_its_own(version, own_key):
    """A span key written as the default's text (bytes, a str subclass)
    is the span's: the default is not written beside it."""
    trace = [span(1, meta={own_key: "staging"})]
    expected = reference_payload(version, [[span(1, meta={"env": "staging"})]], DEFAULT_META, DEFAULT_METRICS)
    assert_all_paths_equal(expected, spanpack_paths(version, [trace], default_meta=DEFAULT_META,
                                                    default_metrics=DEFAULT_METRICS))


@pytest.mark.parametrize("version", VERSIONS)
def test_long_keys_and_values_are_cut_as_span_tags_are(version):
    """A default key or value over 25,000 characters is written cut, like a
    span's; a span key cut to the same text is the span's own."""
    long_key, long_value = "k" * (MAX_TEXT_LEN + 5), "v" * (MAX_TEXT_LEN + 1)
    cut = lambda text: text[:TRUNCATED_PREFIX_LEN] + TRUNCATION_SUFFIX  # noqa: E731
    options = {"default_meta": {long_key: long_value, "env": Text("prod")}}
    plain = [span(1)]
    expected = reference_payload(version, [plain], {cut(long_key): cut(long_value), "env": "prod"}, {})
    assert_all_paths_equal(expected, spanpack_paths(version, [plain], **options))
    own = [span(1, meta={long_key + "other tail": "mine"})]
    expected = reference_payload(version, [[span(1, meta={cut(long_key): "mine"})]], {"env": "prod"}, {})
    assert_all_paths_equal(expected, spanpack_paths(version, [own], **options))


@pytest.mark.parametrize("version", VERSIONS)
def test_defaults_come_before_the_trace_id_high_tag_and_the_origin(version):
    """The encoder's own entries (_dd.p.tid on the first span, the trace's
    origin) follow the span's entries and the defaults."""
    trace_id = (0xABC << 64) | 77
    trace = [span(1, trace_id=trace_id, origin="synthetics", meta={"a": "b"}), span(2, trace_id=trace_id)]
    extra = {TRACE_ID_HIGH_KEY: "%016x" % 0xABC, ORIGIN_KEY: "synthetics"}
    payload = encoder(version).encode_traces([trace])
    if version == "v0.4":
        spans = msgpack.unpackb(payload)[0]
        assert list(spans[0]["meta"]) == ["a"] + list(DEFAULT_META) + list(extra)
        assert list(spans[1]["meta"]) == list(DEFAULT_META) + [ORIGIN_KEY]
    else:
        table, traces = msgpack.unpackb(payload, strict_map_key=False)
        assert [table[k] for k in traces[0][0][9]] == ["a"] + list(DEFAULT_META) + list(extra)
        assert [table[k] for k in traces[0][1][9]] == list(DEFAULT_META) + [ORIGIN_KEY]
    # Without an origin or a high half, exactly the setdefault reference.
    plain = [span(1, meta={"a": "b"})]
    assert encoder(version).encode_traces([plain]) == reference_payload(version, [plain], DEFAULT_META,
                                                                        DEFAULT_METRICS)


@pytest.mark.parametrize("version", VERSIONS)
def test_lenient_a_dropped_own_entry_leaves_the_default(version):
    """lenient=True: a span's own entry dropped for a bad value is not
    written, so the default of its key is, and the drop is counted."""
    bad = [span(1, meta={"env": 5, "a": "b"}, metrics={"n": "seven", "x": 1})]
    good = [span(1, meta={"a": "b"}, metrics={"x": 1})]
    expected = reference_payload(version, [good], DEFAULT_META, DEFAULT_METRICS)
    assert_lenient_paths(encoder(version, lenient=True), [bad], expected, drops=2)
    # Strict mode names the bad entry.
    with pytest.raises(TypeError, match="span 0, meta key 'env'"):
        encoder(version).encode_traces([bad])


class Level(enum.IntEnum):
    HIGH = 3


class Ratio(float):
    pass


@pytest.mark.parametrize("version", VERSIONS)
def test_metric_values_are_written_as_their_int_or_float(version):
    """int and float subclasses are written as the int or float they are."""
    options = {"default_metrics": {"level": Level.HIGH, "ratio": Ratio(0.5)}}
    expected = reference_payload(version, [[span(1)]], {}, {"level": 3, "ratio": 0.5})
    assert_all_paths_equal(expected, spanpack_paths(version, [[span(1)]], **options))


BAD_OPTIONS = [
    ({"default_meta": {"env": 1}}, TypeError, r"default_meta key 'env': values must be str, not int"),
    ({"default_meta": {"env": b"prod"}}, TypeError, r"default_meta key 'env': values must be str, not bytes"),
    ({"default_meta": {b"env": "prod"}}, TypeError, r"default_meta key b'env': keys must be str, not bytes"),
    ({"default_meta": {"env": "\ud800"}}, ValueError, r"default_meta key 'env': values must be valid text"),
    ({"default_meta": {"\ud800": "x"}}, ValueError, r"default_meta key '\\ud800': keys must be valid text"),
    ({"default_meta": ["env"]}, TypeError, r"default_meta must be a mapping of str to str, not list"),
    ({"default_meta": "env"}, TypeError, r"default_meta must be a mapping"),
    ({"default_meta": {"k" * 30000: "a", "k" * 30001: "b"}}, ValueError,
     r"default_meta key 'k+': another key is written as the same text"),
    ({"default_metrics": {"n": True}}, TypeError, r"default_metrics key 'n': values must be int or float, not bool"),
    ({"default_metrics": {"n": "7"}}, TypeError, r"default_metrics key 'n': values must be int or float, not str"),
    ({"default_metrics": {"n": 1 << 64}}, ValueError, r"default_metrics key 'n': 18446744073709551616 does not fit"),
    ({"default_metrics": {"n": -(1 << 63) - 1}}, ValueError, r"default_metrics key 'n': .* does not fit in 64 bits"),
    ({"default_metrics": {7: 1}}, TypeError, r"default_metrics key 7: keys must be str, not int"),
    ({"default_metrics": 3}, TypeError, r"default_metrics must be a mapping of str to int or float"),
] + [
    ({"default_meta": {key: "x"}}, ValueError, r"default_meta key %r: the encoder writes this meta key itself" % key)
    for key in (ORIGIN_KEY, TRACE_ID_HIGH_KEY, SPAN_LINKS_KEY, SPAN_EVENTS_KEY)
]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("options, error, message", BAD_OPTIONS)
def test_bad_option_values_are_refused_naming_the_option_and_key(version, options, error, message):
    with pytest.raises(error, match=message):
        TraceMsgPackEncoder(version, **options)


@pytest.mark.parametrize("options", [{"default_meta": {"env": "prod"}}, {"default_metrics": {}},
                                     {"default_meta": {}, "default_metrics": {"n": 1}}])
def test_v1_0_refuses_default_tags_and_names_its_payload_fields(options):
    named = ", ".join(sorted(options))
    with pytest.raises(TypeError, match=r"^%s: default tags are for versions .*payload_attributes" % named):
        TraceMsgPackEncoder("v1.0", **options)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_mapping_that_is_not_a_dict_is_read_once_at_construction(version):
    """Any mapping is taken (its items() read when the encoder is made);
    changing it afterwards changes nothing."""

    class Tags:
        def __init__(self, items):
            self._items = items

        def items(self):
            return list(self._items)

    given_meta = {"env": "prod"}
    made = TraceMsgPackEncoder(version, default_meta=Tags(given_meta.items()))
    given_meta["env"] = "changed"
    assert made.encode_traces([[span(1)]]) == reference_payload(version, [[span(1)]], {"env": "prod"}, {})


@pytest.mark.parametrize("version", VERSIONS)
def test_init_again_replaces_the_defaults(version):
    made = encoder(version)
    made.__init__(version, default_meta={"env": "other"})
    assert made.encode_traces([[span(1)]]) == reference_payload(version, [[span(1)]], {"env": "other"}, {})
    made.__init__(version)
    assert made.encode_traces([[span(1)]]) == reference_payload(version, [[span(1)]], {}, {})


def _failing_trace(i: int) -> List[Dict[str, Any]]:
    """New strings in the first spans (and the defaults written for them),
    then a bad meta value in the last span."""
    spans = [span(s + 1, trace_id=900 + i, meta={"fresh-%d-%d" % (i, s): "value-%d" % s}) for s in range(3)]
    spans[-1]["meta"] = {"fresh-last": "ok", "bad": 12}
    return spans


@pytest.mark.parametrize("version", VERSIONS)
def test_a_failing_trace_leaves_the_buffer_as_it_was(version):
    """put() of a trace that fails in its last span (after the defaults of
    its earlier spans were written): size, length and the payloads encode()
    returns are those of a twin that never saw it."""
    good = [[span(s + 1, trace_id=100 + t, meta={"t%d" % t: "x"}) for s in range(2)] for t in range(4)]
    tried, twin = encoder(version), encoder(version)
    for trace in good[:2]:
        tried.put(trace)
        twin.put(trace)
    for attempt in range(3):
        with pytest.raises(TypeError, match="span 2, meta key 'bad'"):
            tried.put(_failing_trace(attempt))
        assert (tried.size, len(tried)) == (twin.size, len(twin))
    for trace in good[2:]:
        tried.put(trace)
        twin.put(trace)
    assert tried.size == twin.size
    got, reference = tried.encode(), twin.encode()
    assert got == reference, describe_difference(reference[0][0], got[0][0])
    assert got == [(reference_payload(version, good, DEFAULT_META, DEFAULT_METRICS), len(good))]


@pytest.mark.parametrize("version", VERSIONS)
def test_buffer_limits_count_the_defaults(version):
    """The buffer's size counts the default tags' bytes: max_size of exactly
    the payload fits it, one byte less refuses the last trace."""
    traces = [[span(s + 1, trace_id=300 + t) for s in range(3)] for t in range(3)]
    exact = len(reference_payload(version, traces, DEFAULT_META, DEFAULT_METRICS))
    fits = encoder(version, max_size=exact)
    for trace in traces:
        fits.put(trace)
    assert fits.size == exact
    short = encoder(version, max_size=exact - 1)
    for trace in traces[:-1]:
        short.put(trace)
    with pytest.raises(BufferFull):
        short.put(traces[-1])
    assert len(short) == len(traces) - 1


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("at", [0, 2])
def test_put_from_span_code_mid_trace_with_defaults(version, at):
    """Span code that put()s another trace into the same encoder while a
    trace with default tags is being encoded: both come out as their
    setdefault reference, in the order they were accepted (v0.5: the join
    then rewrites the outer trace's string references)."""
    before = [[span(s + 1, trace_id=500 + t, meta={"b%d" % t: "x"}) for s in range(2)] for t in range(2)]
    inner = [span(1, trace_id=600, meta={"env": "inner", "fresh": "y"})]
    outer_fields = [span(s + 1, trace_id=700, meta={"o%d" % s: "z"}) for s in range(3)]
    made = encoder(version)
    for trace in before:
        made.put(trace)
    outer = [HookSpan(hook=(lambda: made.put(inner)) if s == at else None, **fields)
             for s, fields in enumerate(outer_fields)]
    made.put(outer)
    expected = reference_payload(version, before + [inner, outer_fields], DEFAULT_META, DEFAULT_METRICS)
    (payload, count), = made.encode()
    assert count == 4
    assert payload == expected, describe_difference(expected, payload)
