"""Bad span data: a matrix over every span field and a set of wrong values,
for v0.4 and v0.5 and each of encode_traces / put / encode_trace.

For each case: the exception type, a message that starts with "trace T, span
S, FIELD" (and "FIELD key 'k'" for tags), and atomicity: after the failure the
encoder's next payload is byte-identical to that of a fresh encoder that never
saw the bad trace.  Then the lenient mode: exactly the bad tag is dropped and
counted, the rest of the span is intact.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import spanpack

from tests.support import (
    CORE_FIELDS,
    assert_lenient_paths,
    feed,
    good_span,
    hooked_property_span,
    logical_traces,
    raising_property_span,
    to_form,
)

VERSIONS = ("v0.4", "v0.5")
PATHS = ("encode_traces", "put", "encode_trace")
MISSING = object()
NO_KEY = object()  # the error is not about one tag (key None is a tag key)


def span(**overrides):
    """The basic test span with overrides; MISSING removes a field."""
    values = good_span(**{key: value for key, value in overrides.items() if value is not MISSING})
    for key, value in overrides.items():
        if value is MISSING:
            values.pop(key, None)
    return values


# Good traces used around the failures.  They share strings with the bad
# trace (see bad_trace) so that a v0.5 table not rolled back would show.
GOOD_BEFORE = [span(service="before", meta={"k": "v"}), span(span_id=3, service="shared-service", metrics={"m": 1})]
GOOD_AFTER = [
    span(trace_id=(1 << 64) | 8, service="shared-service", name="fresh-name",
         meta={"fresh-key": "fresh-value", "_dd.p.tid": "0000000000000001"}, origin="synthetics"),
    span(span_id=4, span_type="web", meta={"k": "fresh-value"}),
]


def bad_trace(field, value, span_index):
    """Three spans; the bad value at `span_index`.  The spans before it add
    strings new to any table (rolled back on failure)."""
    spans = [
        span(service="shared-service", name="fresh-name", meta={"fresh-key": "fresh-value"}),
        span(span_id=3, resource="fresh-resource", metrics={"fresh-metric": 2.5}),
        span(span_id=4, service="fresh-service-2", meta={"fresh-key-2": "x"}),
    ]
    spans[span_index] = dict(spans[span_index])
    if value is MISSING:
        del spans[span_index][field]
    else:
        spans[span_index][field] = value
    return spans


# (field, value, {version: exception type or None}, key or None, trace-level)
# A trace-level field (trace_id, origin) is read from the first span only.
def case(field, value, errors, key=NO_KEY, ident=None):
    if not isinstance(errors, dict):
        errors = {"v0.4": errors, "v0.5": errors}
    return pytest.param(field, value, errors, key, id=ident or "%s=%r" % (field, value))


CASES = [
    # trace_id (first span)
    case("trace_id", "1", TypeError),
    case("trace_id", 1.0, TypeError),
    case("trace_id", None, TypeError),
    case("trace_id", MISSING, TypeError, ident="trace_id-missing"),
    case("trace_id", -1, ValueError),
    case("trace_id", 1 << 128, ValueError),
    case("trace_id", -(1 << 70), ValueError),
    # span_id
    case("span_id", None, TypeError),
    case("span_id", MISSING, TypeError, ident="span_id-missing"),
    case("span_id", "2", TypeError),
    case("span_id", 2.0, TypeError),
    case("span_id", -1, ValueError),
    case("span_id", 1 << 64, ValueError),
    case("span_id", 1 << 100, ValueError),
    # parent_id
    case("parent_id", "1", TypeError),
    case("parent_id", 1.5, TypeError),
    case("parent_id", -1, ValueError),
    case("parent_id", 1 << 64, ValueError),
    case("parent_id", b"1", TypeError),
]
for _text_field in ("service", "name", "resource", "span_type"):
    CASES += [
        case(_text_field, 5, TypeError),
        case(_text_field, 1.5, TypeError),
        case(_text_field, ["x"], TypeError),
        case(_text_field, {"x": "y"}, TypeError),
        case(_text_field, "lone \ud800 surrogate", ValueError),
        case(_text_field, "\udfff", ValueError),
        case(_text_field, b"\xff", ValueError),
        case(_text_field, b"abc\xc3", ValueError),
        case(_text_field, bytearray(b"\xfe\xff"), ValueError),
        case(_text_field, b"\xed\xa0\x80", ValueError),  # an encoded surrogate
    ]
CASES += [
    case("name", MISSING, TypeError, ident="name-missing"),
    # start/duration: within 64 bits in every version (v0.4 writes an int64
    # as it is, clamps beyond; v0.5 clamps), an error beyond; start None is
    # no time
    case("start_ns", MISSING, TypeError, ident="start_ns-missing"),
    case("start_ns", "5", TypeError),
    case("start_ns", 5.0, TypeError),
    case("start_ns", None, TypeError),
    case("start_ns", 1 << 63, None),
    case("start_ns", -(1 << 63) - 1, None),
    case("duration_ns", "7", TypeError),
    case("duration_ns", 7.5, TypeError),
    case("duration_ns", 1 << 64, ValueError),
    case("start_ns", -(1 << 64), ValueError),
    case("start_ns", 1 << 70, ValueError),
    case("duration_ns", [7], TypeError),
    # error: any int (v0.4 writes 1; v0.5 the int32, 1 beyond it)
    case("error", "x", TypeError),
    case("error", 1.5, TypeError),
    case("error", b"1", TypeError),
    case("error", 1 << 31, None),
    case("error", -(1 << 31) - 1, None),
    case("error", 1 << 64, None),
    # meta
    case("meta", [("a", "b")], TypeError),
    case("meta", "k=v", TypeError),
    case("meta", 5, TypeError),
    case("meta", {1: "v"}, TypeError, key=1),
    case("meta", {None: "v"}, TypeError, key=None),
    case("meta", {("t",): "v"}, TypeError, key=("t",)),
    case("meta", {"\ud800": "v"}, ValueError, key="\ud800"),
    case("meta", {b"\xff": "v"}, ValueError, key=b"\xff"),
    case("meta", {"k": 1}, TypeError, key="k"),
    case("meta", {"k": None}, TypeError, key="k"),
    case("meta", {"k": 1.5}, TypeError, key="k"),
    case("meta", {"k": True}, TypeError, key="k"),
    case("meta", {"k": ["v"]}, TypeError, key="k"),
    case("meta", {"k": "\ud800"}, ValueError, key="k"),
    case("meta", {"k": b"\xff"}, ValueError, key="k"),
    case("meta", {"k": bytearray(b"\x80")}, ValueError, key="k"),
    case("meta", {"ok": "v", "k": object()}, TypeError, key="k", ident="meta-second-entry-bad"),
    # metrics
    case("metrics", [("m", 1)], TypeError),
    case("metrics", 1.5, TypeError),
    case("metrics", {1: 1}, TypeError, key=1),
    case("metrics", {"\ud800": 1}, ValueError, key="\ud800"),
    case("metrics", {"m": "1"}, TypeError, key="m"),
    case("metrics", {"m": None}, TypeError, key="m"),
    case("metrics", {"m": [1]}, TypeError, key="m"),
    case("metrics", {"m": b"1"}, TypeError, key="m"),
    case("metrics", {"m": 1 << 64}, ValueError, key="m"),
    case("metrics", {"m": -(1 << 63) - 1}, ValueError, key="m"),
    # meta_struct: checked alike (v0.5 then drops it, counted)
    case("meta_struct", ["x"], TypeError),
    case("meta_struct", {5: {}}, TypeError, key=5),
    case("meta_struct", {"a": object()}, TypeError, key="a"),
    case("meta_struct", {"a": {"n": 1 << 64}}, ValueError, key="a"),
    # links
    case("links", 5, TypeError),
    case("links", [{"trace_id": -1, "span_id": 1}], TypeError),
    case("links", [{"trace_id": 1}], TypeError, ident="links-no-span_id"),
    case("links", [{"trace_id": 1, "span_id": 1 << 64}], TypeError),
    case("links", [object()], TypeError, ident="links-object"),
    # events
    case("events", 5, TypeError),
    # JSON events are whatever json.dumps makes of them (as in ddtrace);
    # native events check their fields (test_native_span_event_fields).
    case("events", [{"name": 5, "time_unix_nano": 1}], None),
    case("events", [{"name": "e", "time_unix_nano": -1}], None),
    case("events", [{"name": "e", "time_unix_nano": 1.5}], None),
    case("events", [{"name": "e", "time_unix_nano": 1, "attributes": {"o": object()}}], TypeError,
         ident="events-object-attribute"),
    case("events", [{"name": "e", "time_unix_nano": 1, "attributes": {"b": b"x"}}], TypeError,
         ident="events-bytes-attribute"),
    # origin (first span)
    case("origin", 5, TypeError),
    case("origin", b"synthetics", TypeError),
    case("origin", "\ud800", ValueError),
]

TRACE_LEVEL = {"trace_id", "origin"}


def _message_prefix(trace_index, span_index, field, key=NO_KEY):
    if key is not NO_KEY:
        return "trace %d, span %d, %s key %r" % (trace_index, span_index, field, key)
    return "trace %d, span %d, %s" % (trace_index, span_index, field)


def _fresh_payloads(version, traces, **options):
    """What a fresh encoder gives for good traces, on each path."""
    encoder = spanpack.TraceMsgPackEncoder(version, **options)
    one_shot = encoder.encode_traces(traces)
    encoder = spanpack.TraceMsgPackEncoder(version, **options)
    for trace in traces:
        encoder.put(trace)
    buffered = encoder.encode()
    encoder = spanpack.TraceMsgPackEncoder(version, **options)
    joined = encoder.join_encoded([encoder.encode_trace(t) for t in traces])
    assert buffered == [(one_shot, len(traces))] and joined == one_shot
    return one_shot


def check_failure_and_recovery(version, path, bad, expected_type, prefix_for, options=None):
    """Run the bad trace through `path` and check the exception and that the
    encoder then behaves exactly like a fresh one.  `prefix_for(trace_index)`
    gives the expected message prefix.  Returns the exception."""
    options = options or {}
    encoder = spanpack.TraceMsgPackEncoder(version, **options)
    if path == "put":
        encoder.put(GOOD_BEFORE)
        size_before = encoder.size
    elif path == "encode_trace":
        before_part = encoder.encode_trace(GOOD_BEFORE)

    with pytest.raises(expected_type) as info:
        if path == "encode_traces":
            encoder.encode_traces([GOOD_BEFORE, bad, GOOD_AFTER])
        elif path == "put":
            encoder.put(bad)
        else:
            encoder.encode_trace(bad)
    trace_index = 1 if path == "encode_traces" else 0
    message = str(info.value)
    assert message.startswith(prefix_for(trace_index)), message
    assert encoder.dropped_tags == 0

    # Atomicity: the encoder continues exactly like a fresh one.
    expected = _fresh_payloads(version, [GOOD_BEFORE, GOOD_AFTER], **options)
    if path == "encode_traces":
        assert encoder.encode_traces([GOOD_BEFORE, GOOD_AFTER]) == expected
        for trace in (GOOD_BEFORE, GOOD_AFTER):
            encoder.put(trace)
        assert encoder.encode() == [(expected, 2)]
    elif path == "put":
        assert len(encoder) == 1 and encoder.size == size_before
        encoder.put(GOOD_AFTER)
        assert encoder.encode() == [(expected, 2)]
    else:
        after_part = encoder.encode_trace(GOOD_AFTER)
        assert encoder.join_encoded([before_part, after_part]) == expected
        assert encoder.join_encoded([encoder.encode_trace(GOOD_BEFORE), encoder.encode_trace(GOOD_AFTER)]) == expected
    assert len(encoder) == 0
    return info.value


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("field,value,errors,key", CASES)
def test_bad_value_matrix(field, value, errors, key, version, path):
    expected_type = errors[version]
    span_index = 0 if field in TRACE_LEVEL else 2
    bad = bad_trace(field, value, span_index)
    if expected_type is None:
        # Valid for this version: encodes without error on every path.
        encoder = spanpack.TraceMsgPackEncoder(version)
        feed(encoder, path, [GOOD_BEFORE, bad])
        return
    check_failure_and_recovery(
        version, path, bad, expected_type, lambda t: _message_prefix(t, span_index, field, key)
    )


def test_origin_of_later_spans_is_not_read():
    """The origin comes from the first span only, so a bad value in a later
    span is never looked at (a later span's trace_id is checked:
    tests/spans/test_span_naming.py)."""
    for version in VERSIONS:
        spans = bad_trace("origin", 5, 2)
        spanpack.TraceMsgPackEncoder(version).encode_traces([spans])


NATIVE_EVENT_CASES = [
    ({"name": "e", "time_unix_nano": 1, "attributes": {"n": [[1]]}}, TypeError),
    ({"name": "e", "time_unix_nano": 1, "attributes": {"i": 1 << 64}}, ValueError),
    ({"name": "e", "time_unix_nano": 1, "attributes": {"o": None}}, TypeError),
    ({"name": "e", "time_unix_nano": 1, "attributes": {1: "x"}}, TypeError),
    ({"name": 5, "time_unix_nano": 1}, TypeError),
    ({"name": None, "time_unix_nano": 1}, TypeError),
    ({"name": "e", "time_unix_nano": -1}, TypeError),
    ({"name": "e", "time_unix_nano": 1 << 64}, TypeError),
    ({"name": "e", "time_unix_nano": 1.5}, TypeError),
    ({"name": "e", "time_unix_nano": True}, TypeError),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("event,error", NATIVE_EVENT_CASES, ids=repr)
def test_native_span_event_fields(event, error, path):
    """Native (v0.4 span_events) events are typed: bad names, times and
    attributes are errors there."""
    bad = bad_trace("events", [event], 2)
    check_failure_and_recovery("v0.4", path, bad, error, lambda t: _message_prefix(t, 2, "events"),
                               {"native_span_events": True})


@pytest.mark.parametrize("event,error", NATIVE_EVENT_CASES[:1] + NATIVE_EVENT_CASES[4:], ids=repr)
def test_native_setting_does_not_apply_to_v05(event, error):
    """v0.5 events are always JSON, where these values are fine."""
    bad = bad_trace("events", [event], 2)
    plain = spanpack.TraceMsgPackEncoder("v0.5").encode_traces([bad])
    assert spanpack.TraceMsgPackEncoder("v0.5", native_span_events=True).encode_traces([bad]) == plain


def test_errors_keep_the_original_as_cause():
    try:
        spanpack.TraceMsgPackEncoder("v0.4").encode_traces([[span(service="\ud800")]])
    except ValueError as error:
        assert isinstance(error.__cause__, UnicodeEncodeError)
    else:
        pytest.fail("no error")


# ---------------------------------------------------------------------------
# Span objects whose properties raise


class Boom(Exception):
    pass


PROPERTY_FIELDS = CORE_FIELDS


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("field", PROPERTY_FIELDS)
@pytest.mark.parametrize("exception_type", [Boom, RuntimeError, KeyError, ZeroDivisionError])
def test_property_exceptions_propagate_unchanged(exception_type, field, version, path):
    original = exception_type("from the %s property" % field)
    span_index = 0 if field in TRACE_LEVEL else 2
    bad = [dict(s) for s in bad_trace("service", "x", span_index)]
    bad[span_index] = raising_property_span(span(), field, original)
    encoder = spanpack.TraceMsgPackEncoder(version)
    if path == "put":
        encoder.put(GOOD_BEFORE)
    with pytest.raises(exception_type) as info:
        feed(encoder, path, [GOOD_BEFORE, bad] if path == "encode_traces" else [bad])
    assert info.value is original
    if path == "put":
        encoder.put(GOOD_AFTER)
        assert encoder.encode() == [(_fresh_payloads(version, [GOOD_BEFORE, GOOD_AFTER]), 2)]


def _raise_from_property(exception_type, field, version):
    original = exception_type("bad %s" % field)
    bad = [dict(s) for s in bad_trace("service", "x", 2)]
    bad[2] = raising_property_span(span(), field, original)
    with pytest.raises(exception_type) as info:
        spanpack.TraceMsgPackEncoder(version).encode_traces([GOOD_BEFORE, bad])
    return original, info.value


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("field", ["service", "start_ns", "meta"])
@pytest.mark.parametrize("exception_type", [TypeError, ValueError, AttributeError])
def test_property_errors_keep_type_and_cause(exception_type, field, version):
    """A TypeError/ValueError/AttributeError from a property is re-raised as
    the same type with the location prefixed and the original as __cause__
    (an AttributeError inside a getter is a bug to report, not a missing
    field)."""
    original, raised = _raise_from_property(exception_type, field, version)
    assert type(raised) is exception_type
    assert raised.__cause__ is original
    assert str(raised).startswith("trace 1, span 2, ")
    assert str(raised).endswith("bad %s" % field)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("field", ["service", "start_ns", "meta"])
@pytest.mark.parametrize("exception_type", [TypeError, ValueError, AttributeError])
def test_property_errors_name_the_field(exception_type, field, version):
    _, raised = _raise_from_property(exception_type, field, version)
    assert re.match(r"trace 1, span 2, %s\b" % field, str(raised)), str(raised)


@pytest.mark.parametrize("version", VERSIONS)
def test_getattr_hook_attribute_error_means_absent(version):
    """A class that customises attribute access keeps Python's semantics:
    what hasattr() calls missing is absent."""

    class Dynamic:
        def __init__(self, values):
            self._values = values

        def __getattr__(self, name):
            try:
                return self._values[name]
            except KeyError:
                raise AttributeError(name) from None

    plain = span()
    assert spanpack.TraceMsgPackEncoder(version).encode_traces([[Dynamic(plain)]]) == \
        spanpack.TraceMsgPackEncoder(version).encode_traces([[plain]])
    without_parent = {k: v for k, v in plain.items() if k != "parent_id"}
    assert spanpack.TraceMsgPackEncoder(version).encode_traces([[Dynamic(without_parent)]]) == \
        spanpack.TraceMsgPackEncoder(version).encode_traces([[without_parent]])


# ---------------------------------------------------------------------------
# Bad traces and trace lists


@pytest.mark.parametrize("version", VERSIONS)
def test_bad_trace_containers(version):
    encoder = spanpack.TraceMsgPackEncoder(version)
    with pytest.raises(TypeError, match=r"^trace 1: expected a list of spans"):
        encoder.encode_traces([[span()], 5])
    with pytest.raises(TypeError, match=r"^trace 1: expected a list of spans"):
        encoder.encode_traces([[span()], {"span_id": 1}])
    with pytest.raises(TypeError):
        encoder.encode_traces(5)
    with pytest.raises(TypeError):
        encoder.put(None)
    with pytest.raises(TypeError):
        encoder.encode_trace("spans")
    # A span that is neither a dict nor an object with attributes.
    with pytest.raises(TypeError, match=r"^trace 0, span 1: expected a span object or dict, not int"):
        encoder.encode_traces([[span(), 5]])
    with pytest.raises(TypeError, match=r"^trace 0, span 0: expected a span object or dict, not NoneType"):
        encoder.encode_traces([[None]])
    assert encoder.encode_traces([[span()]]) == spanpack.TraceMsgPackEncoder(version).encode_traces([[span()]])


# ---------------------------------------------------------------------------
# Lenient mode


def _lenient_and_clean(version, dirty_traces, clean_traces, expected_drops, **options):
    lenient = spanpack.TraceMsgPackEncoder(version, lenient=True, **options)
    expected = spanpack.TraceMsgPackEncoder(version, **options).encode_traces(clean_traces)
    assert_lenient_paths(lenient, dirty_traces, expected, expected_drops)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "bad_entry",
    [
        ("meta", "bad", 1),
        ("meta", "bad", None),
        ("meta", "bad", "\ud800"),
        ("meta", "bad", b"\xff"),
        ("meta", 7, "v"),
        ("meta", "\udc00", "v"),
        ("metrics", "bad", "1"),
        ("metrics", "bad", None),
        ("metrics", "bad", 1 << 64),
        ("metrics", "bad", -(1 << 63) - 1),
        ("metrics", 7, 1),
    ],
    ids=repr,
)
def test_lenient_drops_exactly_the_bad_tag(version, bad_entry):
    field, key, value = bad_entry
    meta = {"a": "1", "new-key-%s" % field: "new-value", "z": "26"}
    metrics = {"x": 1, "new-metric-%s" % field: 2.5, "y": -1}
    clean = span(span_type="web", error=1, meta=dict(meta), metrics=dict(metrics))
    dirty = span(span_type="web", error=1, meta=dict(meta), metrics=dict(metrics))
    # The bad entry in the middle, with a new (v0.5 table) key.
    entries = list(dirty[field].items())
    entries.insert(1, (key, value))
    dirty[field] = dict(entries)
    _lenient_and_clean(version, [[span(), dirty], [dirty]], [[span(), clean], [clean]], 2)


@pytest.mark.parametrize("version", VERSIONS)
def test_lenient_map_headers_shrink(version):
    """17 entries with 2 dropped: the meta header must be fixmap 15, and with
    every entry dropped an empty map (as ddtrace writes it) remains."""
    good = {"k%02d" % i: "v%d" % i for i in range(15)}
    dirty = dict(good, bad1=1, bad2=None)
    _lenient_and_clean(version, [[span(meta=dirty)]], [[span(meta=good)]], 2)
    # Every entry dropped: the (non-empty) map is still written, empty, as
    # ddtrace writes it ("meta": {} in v0.4; v0.5 always has both maps).
    encoder = spanpack.TraceMsgPackEncoder(version, lenient=True)
    payload = encoder.encode_traces([[span(meta={"bad": 1}, metrics={"bad": "x"})]])
    assert encoder.dropped_tags == 2
    clean = spanpack.TraceMsgPackEncoder(version).encode_traces([[span()]])
    if version == "v0.4":
        # 9 keys instead of 7, then "meta": {} and "metrics": {} at the end.
        assert payload == clean[:2] + b"\x89" + clean[3:] + bytes.fromhex("a46d657461 80 a76d657472696373 80")
    else:
        assert payload == clean
    many = {"k%03d" % i: "v" for i in range(300)}
    _lenient_and_clean(version, [[span(meta=dict(many, bad=1))]], [[span(meta=many)]], 1)


def test_lenient_meta_struct_v04():
    dirty = span(meta_struct={"ok": {"a": 1}, "bad": object(), 5: {}})
    clean = span(meta_struct={"ok": {"a": 1}})
    _lenient_and_clean("v0.4", [[dirty]], [[clean]], 2)


@pytest.mark.parametrize("version", VERSIONS)
def test_lenient_still_raises_for_non_tag_fields(version):
    encoder = spanpack.TraceMsgPackEncoder(version, lenient=True)
    bad = bad_trace("span_id", "x", 2)
    bad[0]["meta"] = {"dropped": 1}
    with pytest.raises(TypeError, match=r"^trace 0, span 2, span_id"):
        encoder.put(bad)
    with pytest.raises(TypeError, match=r"^trace 1, span 2, span_id"):
        encoder.encode_traces([[span(meta={"dropped": 1})], bad])
    with pytest.raises(TypeError, match=r"^trace 0, span 0, meta"):
        encoder.encode_traces([[span(meta=["not", "a", "dict"])]])
    # Drops in a trace that failed as a whole are not counted.
    assert encoder.dropped_tags == 0
    assert len(encoder) == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_lenient_property_exceptions_still_propagate(version):
    original = Boom()
    span_object = raising_property_span(span(), "meta", original)
    encoder = spanpack.TraceMsgPackEncoder(version, lenient=True)
    with pytest.raises(Boom) as info:
        encoder.encode_traces([[span_object]])
    assert info.value is original


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("field,value,error", [("span_id", "x", TypeError), ("service", b"\xff", ValueError),
                                               ("start_ns", 1.5, TypeError)])
def test_lenient_failure_after_drops_is_atomic(field, value, error, version, path):
    """A lenient encoder that drops tags in the first spans and then fails on
    a later span leaves no trace of either (table entries, counts, bytes)."""
    bad = bad_trace(field, value, 2)
    bad[0]["meta"] = dict(bad[0]["meta"], **{"dropped-new-key": 1})
    bad[1]["metrics"] = dict(bad[1]["metrics"], **{"dropped-new-metric": "x"})
    check_failure_and_recovery(version, path, bad, error, lambda t: _message_prefix(t, 2, field),
                               {"lenient": True})


# ---------------------------------------------------------------------------
# Span code that changes the trace or calls the encoder while it is read


def _span_with_hook(hook):
    """span(span_id=9) whose service property calls `hook` first."""
    return hooked_property_span(span(span_id=9), "service", hook)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("change", ["append", "pop", "clear"])
def test_trace_resized_by_a_span_property(change, version, path):
    trace = [span(), span(span_id=3)]
    actions = {"append": lambda: trace.append(span(span_id=4)), "pop": trace.pop, "clear": trace.clear}
    trace.insert(1, _span_with_hook(actions[change]))
    encoder = spanpack.TraceMsgPackEncoder(version)
    if path == "put":
        encoder.put(GOOD_BEFORE)
    with pytest.raises(RuntimeError, match=r"^trace \d+ changed size during encoding"):
        feed(encoder, path, [GOOD_BEFORE, trace] if path == "encode_traces" else [trace])
    if path == "put":
        encoder.put(GOOD_AFTER)
        assert encoder.encode() == [(_fresh_payloads(version, [GOOD_BEFORE, GOOD_AFTER]), 2)]


@pytest.mark.parametrize("version", VERSIONS)
def test_put_reentered_from_a_span_property(version):
    """A span property that itself calls put() on the same encoder: both
    traces end up buffered whole (the inner one first) and decode."""
    import msgpack

    encoder = spanpack.TraceMsgPackEncoder(version)
    inner = [span(service="inner", span_id=7)]
    outer = [span(service="outer", span_id=8), _span_with_hook(lambda: encoder.put(inner))]
    encoder.put(outer)
    assert len(encoder) == 2
    [(payload, count)] = encoder.encode()
    assert count == 2
    expected_outer = [span(service="outer", span_id=8), span(span_id=9)]
    assert payload == _fresh_payloads(version, [inner, expected_outer])
    msgpack.unpackb(payload, strict_map_key=False)


# ---------------------------------------------------------------------------
# Random good traces around a random bad one

_BAD_CASES = [c.values for c in CASES]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    good=st.lists(logical_traces(max_spans=3), min_size=1, max_size=3),
    version=st.sampled_from(VERSIONS),
    bad_case=st.sampled_from(_BAD_CASES),
    lenient=st.booleans(),
    data=st.data(),
)
def test_random_failure_leaves_no_trace(good, version, bad_case, lenient, data):
    field, value, errors, key = bad_case
    expected_type = errors[version]
    assume(expected_type is not None)
    assume(not (lenient and key is not NO_KEY))  # lenient drops bad tags instead
    good_traces = [to_form(trace, "dict") for trace in good]
    bad = [dict(s) for s in to_form(data.draw(st.sampled_from(good)), "dict")]
    span_index = 0 if field in TRACE_LEVEL else data.draw(st.integers(0, len(bad) - 1))
    if value is MISSING:
        bad[span_index].pop(field, None)
    else:
        bad[span_index][field] = value
    position = data.draw(st.integers(0, len(good_traces)))
    options = {"lenient": lenient}

    expected = spanpack.TraceMsgPackEncoder(version, **options).encode_traces(good_traces)

    # put() buffers the whole payload, which 9 generated spans can take far
    # beyond the default 20 MiB; the limit is sized for the example.
    encoder = spanpack.TraceMsgPackEncoder(version, max_size=max(20 << 20, len(expected)), **options)
    with pytest.raises(expected_type) as info:
        encoder.encode_traces(good_traces[:position] + [bad] + good_traces[position:])
    assert str(info.value).startswith(_message_prefix(position, span_index, field, key)), str(info.value)
    assert encoder.encode_traces(good_traces) == expected

    for trace in good_traces[:position]:
        encoder.put(trace)
    with pytest.raises(expected_type):
        encoder.put(bad)
    for trace in good_traces[position:]:
        encoder.put(trace)
    assert encoder.encode() == [(expected, len(good_traces))]

    parts = [encoder.encode_trace(trace) for trace in good_traces[:position]]
    with pytest.raises(expected_type):
        encoder.encode_trace(bad)
    parts += [encoder.encode_trace(trace) for trace in good_traces[position:]]
    assert encoder.join_encoded(parts) == expected
    # Three passes over the good traces, each counting what one does (v0.5:
    # the meta_struct entries it has no place for); the failed ones nothing.
    struct_entries = sum(len(s.get("meta_struct") or {}) for t in good_traces for s in t)
    assert encoder.dropped_tags == (3 * struct_entries if version == "v0.5" else 0)


@pytest.mark.parametrize("version", VERSIONS)
def test_lenient_dropped_trace_id_high_tag_is_replaced(version):
    trace_id = (7 << 64) | 1
    encoder = spanpack.TraceMsgPackEncoder(version, lenient=True)
    payload = encoder.encode_traces([[span(trace_id=trace_id, meta={"_dd.p.tid": 5})]])
    assert encoder.dropped_tags == 1
    assert payload == spanpack.TraceMsgPackEncoder(version).encode_traces([[span(trace_id=trace_id)]])


# ---------------------------------------------------------------------------
# Items that are not spans, and one format for missing fields


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("item, type_name", [
    (None, "NoneType"), (5, "int"), (True, "bool"), (1.5, "float"), ("span", "str"),
    (b"span", "bytes"), ([{"span_id": 1}], "list"), ((1, 2), "tuple"), ({1}, "set"),
])
@pytest.mark.parametrize("position", [0, 1])
def test_an_item_that_is_not_a_span_is_named(version, item, type_name, position):
    trace = [span(), span(span_id=3)]
    trace[position] = item
    with pytest.raises(TypeError) as info:
        spanpack.TraceMsgPackEncoder(version).encode_traces([[span()], trace])
    assert str(info.value) == "trace 1, span %d: expected a span object or dict, not %s" % (position, type_name)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("field", ["trace_id", "span_id", "name", "start_ns"])
@pytest.mark.parametrize("form", ["dict", "object"])
def test_missing_fields_are_reported_in_one_format(version, field, form):
    values = span(**{field: MISSING})
    item = values if form == "dict" else type("Partial", (), {})()
    if form == "object":
        item.__dict__.update(values)
    with pytest.raises(TypeError) as info:
        spanpack.TraceMsgPackEncoder(version).encode_traces([[item]])
    assert str(info.value) == "trace 0, span 0, %s: missing (no attribute or key '%s')" % (field, field)


# ---------------------------------------------------------------------------
# Keys that are cut to the same text


def _long_keys():
    """Two distinct keys over 25,000 characters with the same first 2,486."""
    return "k" * 25001, "k" * 25002


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("field", ["meta", "metrics"])
def test_keys_cut_to_the_same_text_raise(version, field):
    first, second = _long_keys()
    value = "v" if field == "meta" else 1
    bad = span(**{field: {first: value, "ok": value, second: value}})
    encoder = spanpack.TraceMsgPackEncoder(version)
    with pytest.raises(ValueError, match=r"^trace 1, span 0, %s: two keys are written as the same" % field):
        encoder.encode_traces([[span()], [bad]])


@pytest.mark.parametrize("version", VERSIONS)
def test_a_short_key_equal_to_a_cut_key_raises(version):
    first, _ = _long_keys()
    cut = first[:2486] + "<truncated>..."
    with pytest.raises(ValueError, match="two keys are written as the same 2500-character text"):
        spanpack.TraceMsgPackEncoder(version).encode_traces([[span(meta={first: "a", cut: "b"})]])


@pytest.mark.parametrize("version", VERSIONS)
def test_keys_cut_to_the_same_text_lenient_keeps_the_first(version):
    first, second = _long_keys()
    encoder = spanpack.TraceMsgPackEncoder(version, lenient=True)
    payload = encoder.encode_traces([[span(meta={first: "first", "ok": "x", second: "second"})]])
    assert encoder.dropped_tags == 1
    expected = spanpack.TraceMsgPackEncoder(version).encode_traces([[span(meta={first: "first", "ok": "x"})]])
    assert payload == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_one_long_key_per_map_is_fine(version):
    """The same long key in meta and in metrics: two maps, no conflict."""
    first, _ = _long_keys()
    encoder = spanpack.TraceMsgPackEncoder(version)
    payload = encoder.encode_traces([[span(meta={first: "v"}, metrics={first: 1}), span(span_id=3, meta={first: "w"})]])
    cut = first[:2486] + "<truncated>..."
    expected = spanpack.TraceMsgPackEncoder(version).encode_traces(
        [[span(meta={cut: "v"}, metrics={cut: 1}), span(span_id=3, meta={cut: "w"})]])
    assert payload == expected
