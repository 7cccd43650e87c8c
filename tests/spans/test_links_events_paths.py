"""Links and events written in C agree with spanpack._extras, their reference.

The encoder writes the links and events that tracers make (a link object
whose to_dict() gives plain values, events with plain names, times and
attributes) in C, and hands anything else to spanpack._extras.  Whatever the
input, the payload must hold exactly what _extras makes of it, or the
encoder must raise the error _extras raises:

- v0.4 "span_links" and native "span_events": the msgpack of
  _extras.links_for_v04 / events_for_v04, key order and value types included
  (compared as bytes after packing both);
- meta "_dd.span_links" (v0.5) and meta "events" (v0.5, and v0.4 without
  native events): the very text of _extras.links_json / events_json
  (json.dumps).

The inputs mix the shapes the C paths take with every kind they must decline:
subclasses, keys json would convert, text long enough to be cut, ints beyond
64 bits, nested lists, floats that are not finite, non-ASCII and control
characters, ids that are not 32 hex digits.
"""

import gc
import math
import sys
import types
import weakref

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spanpack
from spanpack import _extras
from spanpack._spanpack import MAX_TEXT_LEN

from ..support import resolved_traces

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class TextSubclass(str):
    pass


class IntSubclass(int):
    pass


class DictSubclass(dict):
    pass


class LinkObject:
    """A link that gives its fields through to_dict(), as ddtrace's SpanLink."""

    def __init__(self, fields):
        self._fields = fields

    def to_dict(self):
        return dict(self._fields)

    def __repr__(self):
        return "LinkObject(%r)" % (self._fields,)


texts = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "a\"b\\c", "\n\t\r\b\f\x00\x1f\x7f", "é", "\u2028", "\U0001f600x", "\ud800"]),
    st.builds(lambda n: "x" * n, st.sampled_from([MAX_TEXT_LEN, MAX_TEXT_LEN + 1])),
    st.builds(TextSubclass, st.text(max_size=4)),
)
ints = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 10**30]),
    st.builds(IntSubclass, st.integers(0, 100)),
)
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.1, -0.0, 1e300, 5e-324]))
scalars = st.one_of(texts, ints, floats, st.booleans(), st.none())
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.lists(st.lists(scalars, max_size=2), max_size=2),
                   st.tuples(scalars), st.builds(DictSubclass, st.dictionaries(texts, scalars, max_size=2)))
keys = st.one_of(texts, st.sampled_from([1, 2.5, True, None]))
attribute_maps = st.one_of(
    st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=8), ints, floats, st.booleans(),
                                                   st.lists(st.one_of(st.text(max_size=4), ints, st.booleans(),
                                                                      floats), max_size=3)), max_size=4),
    st.dictionaries(keys, values, max_size=3),
    st.builds(DictSubclass, st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2)),
    st.sampled_from([None, {}, [], 0, "attrs"]),
)

good_trace_ids = st.integers(0, 2**128 - 1).map("{:032x}".format)
good_span_ids = st.integers(0, 2**64 - 1).map("{:016x}".format)
awkward_ids = st.one_of(
    st.integers(0, 2**64 - 1).map("{:x}".format),
    st.sampled_from(["", "0x1f", "ABCDEF0123456789abcdef0123456789", "g" * 32, "1" * 33, "1_2", " 12"]),
    st.integers(0, 2**64 - 1),
)
plain_text = st.text(max_size=8)
plain_values = st.one_of(plain_text, st.integers(-(2**63), 2**64 - 1), st.floats(), st.booleans())
plain_event_attributes = st.dictionaries(
    plain_text, st.one_of(plain_values, st.lists(plain_values, max_size=3)), max_size=4)


@st.composite
def link_fields(draw):
    """to_dict()'s fields: as ddtrace makes them, or (one time in four) awkward."""
    plain = draw(st.integers(0, 3)) > 0
    fields = {"trace_id": draw(good_trace_ids if plain else st.one_of(good_trace_ids, awkward_ids)),
              "span_id": draw(good_span_ids if plain else st.one_of(good_span_ids, awkward_ids))}
    if draw(st.booleans()):
        fields["attributes"] = draw(st.dictionaries(plain_text, plain_text, max_size=3) if plain
                                    else st.dictionaries(keys, values, max_size=2))
    if draw(st.booleans()):
        fields["tracestate"] = draw(plain_text if plain else texts)
    if draw(st.booleans()):
        fields["flags"] = draw(st.integers(0, 2**32 - 1) if plain
                               else st.sampled_from([-1, 2**63, True, 1.5, 2**31]))
    if draw(st.integers(0, 4)) == 0:
        fields["dropped_attributes_count"] = draw(st.integers(0, 5))
    if not plain and draw(st.booleans()):
        fields[draw(st.sampled_from(["trace_id_high", "other", "x" * (MAX_TEXT_LEN + 1)]))] = draw(values)
    if draw(st.integers(0, 5)) == 0:  # keys in another order
        fields = dict(reversed(list(fields.items())))
    return fields


link_attribute_values = st.recursive(
    st.one_of(plain_text, st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats()),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner)),
    max_leaves=6,
)


@st.composite
def protocol_links(draw):
    """A link as the span protocol gives it (a dict, or an object with the
    attributes): int ids, attributes of any kind (flattened and turned into
    text by the rules), dropped_attributes_count, tracestate, flags; plain,
    or (one time in four) awkward."""
    plain = draw(st.integers(0, 3)) > 0
    fields = {
        "trace_id": draw(st.integers(0, 2**128 - 1) if plain
                         else st.sampled_from([-1, 2**128, True, "1", 2**64, 2**63, None])),
        "span_id": draw(st.integers(0, 2**64 - 1) if plain else st.sampled_from([-1, 2**64, True, 1.0])),
    }
    for name, good, awkward in (
        ("attributes", st.dictionaries(plain_text, link_attribute_values, max_size=4),
         st.one_of(st.dictionaries(keys, values, max_size=2), st.sampled_from([[], "x", 0]))),
        ("dropped_attributes_count", st.integers(0, 5), st.sampled_from([-1, True, 1.5, None])),
        ("tracestate", st.one_of(plain_text, st.none()), st.sampled_from([3, TextSubclass("t")])),
        ("flags", st.one_of(st.integers(0, 2**32 - 1), st.none()), st.sampled_from([True, 1.5, -1, 2**63])),
    ):
        if draw(st.booleans()):
            fields[name] = draw(good if plain else st.one_of(good, awkward))
    if draw(st.booleans()):
        return types.SimpleNamespace(**fields)
    return fields


links = st.lists(
    st.one_of(
        link_fields().map(LinkObject),
        link_fields().map(LinkObject),
        link_fields(),  # to_dict()'s fields as a dict span's link: refused by the rules (ids not int)
        protocol_links(),
        protocol_links(),
    ),
    min_size=1, max_size=3,
)


@st.composite
def event_values(draw):
    """An event as a dict or an object: plain, or (one time in four) awkward."""
    plain = draw(st.integers(0, 3)) > 0
    name = draw(plain_text if plain else st.one_of(texts, st.sampled_from([None, 3])))
    time = draw(st.integers(0, 2**63 - 1) if plain
                else st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([-1, 2**64, True, None, 1.5])))
    attributes = draw(plain_event_attributes if plain else attribute_maps)
    form = draw(st.sampled_from(["dict", "object", "object", "dict subclass", "missing attributes"]))
    if form == "dict":
        return {"name": name, "time_unix_nano": time, "attributes": attributes}
    if form == "dict subclass":
        return DictSubclass(name=name, time_unix_nano=time, attributes=attributes)
    if form == "missing attributes":
        return types.SimpleNamespace(name=name, time_unix_nano=time)
    return types.SimpleNamespace(name=name, time_unix_nano=time, attributes=attributes)


events = st.lists(event_values(), min_size=1, max_size=3)


def span_with(**fields):
    span = {"trace_id": 1, "span_id": 2, "parent_id": 0, "name": "n", "service": "s", "resource": "r",
            "start_ns": 1, "duration_ns": 1, "error": 0, "meta": {}, "metrics": {}}
    span.update(fields)
    return span


def encoded(version, span, **options):
    """The one span as the encoder writes it, or the exception it raises."""
    try:
        payload = spanpack.TraceMsgPackEncoder(version, **options).encode_traces([[span]])
    except Exception as error:  # noqa: BLE001 - compared with the reference's below
        return error
    return resolved_traces(version, payload)[0][0]


def reference(convert, items, pack=False):
    """What _extras makes of the items (packed, for v0.4, as the encoder packs
    it: with spanpack's Packer, held byte-equal to msgpack-python's by its own
    tests), or the error it raises."""
    try:
        converted = convert(items)
        return spanpack.packb(converted) if pack else converted
    except Exception as error:  # noqa: BLE001
        return error


def assert_same_error(got, expected):
    assert isinstance(got, Exception), "written, but spanpack._extras raises %r" % (expected,)
    # The encoder locates the error (and OverflowError/UnicodeError become
    # ValueError); the message of the reference's error is kept.
    assert str(expected) in str(got)


def packed(value):
    return spanpack.packb(value)


def assert_written_as_reference(got, expected, written):
    """The encoder raised the reference's error, or wrote what it makes
    (`written(got)` is the part of the decoded span to compare)."""
    if isinstance(expected, Exception):
        assert_same_error(got, expected)
        return
    assert not isinstance(got, Exception), got
    assert written(got) == expected


@SETTINGS
@given(links)
def test_v04_links(items):
    expected = reference(_extras.links_for_v04, items, pack=True)
    got = encoded("v0.4", span_with(links=items))
    assert_written_as_reference(got, expected, lambda span: packed(span["span_links"]))


@SETTINGS
@given(links, st.sampled_from(["v0.5"]))
def test_links_json(items, version):
    expected = reference(_extras.links_json, items)
    got = encoded(version, span_with(links=items))
    # The text is a meta value like any: cut beyond MAX_TEXT_LEN.
    expected = expected if isinstance(expected, Exception) else _extras._truncate(expected)
    assert_written_as_reference(got, expected, lambda span: span[9]["_dd.span_links"])


@SETTINGS
@given(events)
def test_v04_native_events(items):
    expected = reference(_extras.events_for_v04, items, pack=True)
    got = encoded("v0.4", span_with(events=items), native_span_events=True)
    assert_written_as_reference(got, expected, lambda span: packed(span["span_events"]))


@SETTINGS
@given(events, st.sampled_from(["v0.4", "v0.5"]))
def test_events_json(items, version):
    expected = reference(_extras.events_json, items)
    got = encoded(version, span_with(events=items))
    expected = expected if isinstance(expected, Exception) else _extras._truncate(expected)
    assert_written_as_reference(
        got, expected, lambda span: (span["meta"] if version == "v0.4" else span[9])["events"])


def test_json_text_is_json_dumps_for_awkward_values():
    """Values whose JSON text is easy to get wrong, one by one."""
    awkward = ["\"\\/\b\f\n\r\t", "\x00\x01\x1f\x7f\x80", "\u00e9\u2028\uffff", "\U0001f600", "\udfff",
               0.1, 1e16, 1e-7, -0.0, 1.5e300, float("nan"), float("inf"), -math.inf, 2**64, -(2**70),
               IntSubclass(7), TextSubclass("sub"), True, False, None, [], {}, [[[]]], (1, "t")]
    for value in awkward:
        items = [{"name": "e", "time_unix_nano": 1, "attributes": {"k": value}}]
        assert encoded("v0.5", span_with(events=items))[9]["events"] == _extras.events_json(items), value


def test_deep_nesting_is_left_to_json():
    deep = []
    for _ in range(40):
        deep = [deep]
    items = [{"name": "e", "time_unix_nano": 1, "attributes": {"k": deep}}]
    assert encoded("v0.5", span_with(events=items))[9]["events"] == _extras.events_json(items)
    cycle = []
    cycle.append(cycle)
    items = [{"name": "e", "time_unix_nano": 1, "attributes": {"k": cycle}}]
    error = encoded("v0.5", span_with(events=items))
    assert isinstance(error, ValueError) and "Circular reference" in str(error)


def test_to_dict_that_empties_the_list_is_written_as_the_reference_writes_it():
    """to_dict() is Python code: one that changes the very list being
    written leaves the payload as _extras makes of the list afterwards."""
    items = []

    class Emptying(LinkObject):
        def to_dict(self):
            items.clear()
            return super().to_dict()

    fields = {"trace_id": "%032x" % 5, "span_id": "%016x" % 6}
    for version in ("v0.4", "v0.5"):
        items[:] = [Emptying(fields), LinkObject(fields)]
        got = encoded(version, span_with(links=items))
        assert not isinstance(got, Exception), got
        if version == "v0.4":
            assert got["span_links"] == _extras.links_for_v04(items) == []
        else:
            assert got[9]["_dd.span_links"] == _extras.links_json(items) == "[]"


@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
def test_to_dict_error_names_the_span_field(version):
    class Broken(LinkObject):
        def to_dict(self):
            raise RuntimeError("no dict today")

    error = encoded(version, span_with(links=[Broken({})]))
    assert isinstance(error, RuntimeError)
    assert "trace 0, span 0, field links" in error.__notes__[0]


def test_json_ints_at_the_64_bit_bounds_are_json_dumps():
    """Ints within 64 bits are written in C, larger ones by json.dumps: both
    sides of each bound, for int and an int subclass (whose own repr json
    never calls)."""
    bounds = [2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]
    for value in bounds + [IntSubclass(value) for value in bounds]:
        items = [{"name": "e", "time_unix_nano": value, "attributes": {"k": [value]}}]
        assert encoded("v0.5", span_with(events=items))[9]["events"] == _extras.events_json(items), value


@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
def test_int_json_cannot_write_names_the_span_field(version):
    """An int too long for int.__repr__ (sys.set_int_max_str_digits): the
    error json.dumps raises, located like any other."""
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    if not limit:
        pytest.skip("no limit on int digits in this interpreter")
    huge = 7 ** (limit * 2)  # more than `limit` decimal digits
    expected = reference(_extras.events_json, [{"name": "e", "time_unix_nano": 1, "attributes": {"k": huge}}])
    assert isinstance(expected, ValueError)
    error = encoded(version, span_with(events=[{"name": "e", "time_unix_nano": 1, "attributes": {"k": huge}}]))
    assert isinstance(error, ValueError) and str(expected) in str(error)
    assert "trace 0, span 0, events" in str(error)
    fields = {"trace_id": "%032x" % 5, "span_id": "%016x" % 6, "tracestate": huge}
    error = encoded("v0.5", span_with(links=[LinkObject(fields)]))
    assert isinstance(error, ValueError) and "trace 0, span 0, links" in str(error)


def test_python_code_run_by_a_long_int_repr_changes_nothing_written():
    """From CPython 3.12 the repr of an int of more than about 9,000 digits
    runs Python code (_pylong).  Code run then (here a profile hook standing
    for another thread or a finalizer) that empties the attributes being
    written must leave the text as json.dumps makes it: json holds what it
    walks; the encoder, walking containers it holds no reference to, would
    write a freed dict.  On older interpreters no Python code runs and the
    two agree trivially."""
    set_digits = getattr(sys, "set_int_max_str_digits", None)
    limit = sys.get_int_max_str_digits() if set_digits else 0

    def events():
        attributes = {"outer": {"k": 7**20000, "j": 1, "l": [1, 2]}, "after": "x"}
        return attributes, [{"name": "e", "time_unix_nano": 1, "attributes": attributes}]

    def under_hook(write):
        attributes, items = events()

        previous = sys.getprofile()

        def hook(frame, event, arg):
            if event == "call" and frame.f_code.co_name == "int_to_decimal_string":
                sys.setprofile(previous)
                attributes.clear()
                gc.collect()

        sys.setprofile(hook)
        try:
            return write(items)
        finally:
            sys.setprofile(previous)

    if set_digits:
        set_digits(0)
    try:
        expected = under_hook(_extras.events_json)
        got = under_hook(lambda items: encoded("v0.5", span_with(events=items))[9]["events"])
    finally:
        if set_digits:
            set_digits(limit)
    assert '"j": 1' in expected
    assert got == expected


# ---------------------------------------------------------------------------
# The three ways in: each writes what encode_traces writes, and a trace that
# fails after links or events were written (in C, or declined and handed to
# _extras) leaves a buffered encoder as it was.

ENCODINGS = [("v0.4", {}), ("v0.4", {"native_span_events": True}), ("v0.5", {})]


class RaisingLink(LinkObject):
    def to_dict(self):
        raise RuntimeError("to_dict failed")


def links_and_events_trace(trace_id, declined=False, failing=False):
    """Three spans with links and events (plain ones: C writes them; or with a
    str subclass: declined), the last one's link raising if `failing`."""
    text = TextSubclass("declined") if declined else "plain"
    spans = []
    for number in range(3):
        link = LinkObject({"trace_id": "%032x" % (2**70 + number), "span_id": "%016x" % (number + 1),
                           "attributes": {"k": text}, "tracestate": "ts", "flags": 1})
        event = {"name": "event-%d" % number, "time_unix_nano": number,
                 "attributes": {"a": text, "n": [1, 2.5, True], "i": -number}}
        span = span_with(trace_id=trace_id, span_id=number + 1, links=[link, link], events=[event],
                         meta={"own-%d-%d" % (trace_id, number): "v"})
        spans.append(span)
    if failing:
        spans[-1]["links"] = [spans[0]["links"][0], RaisingLink({})]
    return spans


@pytest.mark.parametrize("version,options", ENCODINGS)
@pytest.mark.parametrize("declined", [False, True])
def test_every_entry_point_writes_the_same_links_and_events(version, options, declined):
    traces = [links_and_events_trace(10 + i, declined=declined) for i in range(3)]
    expected = spanpack.TraceMsgPackEncoder(version, **options).encode_traces(traces)
    encoder = spanpack.TraceMsgPackEncoder(version, **options)
    assert encoder.join_encoded([encoder.encode_trace(trace) for trace in traces]) == expected
    for trace in traces:
        encoder.put(trace)
    assert encoder.encode() == [(expected, len(traces))]


@pytest.mark.parametrize("version,options", ENCODINGS)
@pytest.mark.parametrize("declined", [False, True])
def test_trace_failing_after_links_and_events_leaves_the_buffer_as_it_was(version, options, declined):
    before = [links_and_events_trace(10 + i, declined=declined) for i in range(2)]
    after = [links_and_events_trace(20, declined=not declined)]
    encoder = spanpack.TraceMsgPackEncoder(version, **options)
    for trace in before:
        encoder.put(trace)
    state = (encoder.size, len(encoder))
    with pytest.raises(RuntimeError, match="to_dict failed"):
        encoder.put(links_and_events_trace(30, declined=declined, failing=True))
    assert (encoder.size, len(encoder)) == state
    with pytest.raises(RuntimeError, match="to_dict failed"):
        encoder.encode_trace(links_and_events_trace(30, declined=declined, failing=True))
    for trace in after:
        encoder.put(trace)
    expected = spanpack.TraceMsgPackEncoder(version, **options).encode_traces(before + after)
    assert encoder.encode() == [(expected, len(before) + len(after))]


# ---------------------------------------------------------------------------
# Reading one item runs Python code (to_dict(), getters) that may change what
# an earlier item gave.  _extras's JSON is json.dumps of every item's fields,
# all read first; its v0.4 forms convert each item before reading the next.


def events_where_reading_the_second_changes_the_first():
    first_attributes = {"state": "before"}

    class LateEvent:
        time_unix_nano = 2
        attributes = {"b": 1}

        @property
        def name(self):
            first_attributes["state"] = "after"  # e.g. an event finished lazily
            first_attributes["new"] = 2
            return "second"

    return [{"name": "first", "time_unix_nano": 1, "attributes": first_attributes}, LateEvent()]


def links_where_reading_the_second_changes_the_first():
    first = {"trace_id": "%032x" % 5, "span_id": "%016x" % 6, "tracestate": "before"}

    class SharedLink(LinkObject):
        def to_dict(self):
            first["tracestate"] = "after"
            first["attributes"] = {"added": "later"}
            return super().to_dict()

    class FirstLink(LinkObject):
        def to_dict(self):
            return first  # not a copy: changed by the second link's to_dict()

    return [FirstLink({}), SharedLink({"trace_id": "%032x" % 7, "span_id": "%016x" % 8})]


@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
def test_events_json_sees_every_event_as_read_before_any_is_written(version):
    expected = _extras.events_json(events_where_reading_the_second_changes_the_first())
    assert '"state": "after"' in expected
    got = encoded(version, span_with(events=events_where_reading_the_second_changes_the_first()))
    assert (got["meta"] if version == "v0.4" else got[9])["events"] == expected


def test_links_json_sees_every_link_as_read_before_any_is_written():
    expected = _extras.links_json(links_where_reading_the_second_changes_the_first())
    assert '"tracestate": "after"' in expected
    got = encoded("v0.5", span_with(links=links_where_reading_the_second_changes_the_first()))
    assert got[9]["_dd.span_links"] == expected


def links_whose_second_changes_the_first_attributes():
    """A dict link of plain text attributes (which the encoder reads without
    flattening), then a link whose field getter changes those attributes."""
    first_attributes = {"state": "before"}

    class LateLink:
        span_id = 8
        attributes = None

        @property
        def trace_id(self):
            first_attributes["state"] = "after"
            first_attributes["new"] = "later"
            return 7

    return [{"trace_id": 5, "span_id": 6, "attributes": first_attributes}, LateLink()]


@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
def test_plain_link_attributes_are_written_as_read(version):
    """v0.4 writes each link before reading the next; JSON reads every link
    first, so plain attributes are taken as they were when read (a copy),
    as spanpack._extras takes them."""
    if version == "v0.4":
        expected = reference(_extras.links_for_v04, links_whose_second_changes_the_first_attributes(), pack=True)
        got = encoded(version, span_with(links=links_whose_second_changes_the_first_attributes()))
        assert packed(got["span_links"]) == expected
    else:
        expected = _extras.links_json(links_whose_second_changes_the_first_attributes())
        assert '"state": "before"' in expected
        got = encoded(version, span_with(links=links_whose_second_changes_the_first_attributes()))
        assert got[9]["_dd.span_links"] == expected


def links_freed_once_read():
    """A link that takes itself out of the list while read (the list keeps
    its length), with a finalizer that changes its attributes: freed by the
    encoder between reading and writing it, were it not held."""
    attributes = {"state": "before"}
    links = []

    class Link:
        trace_id, span_id = 1, 2

        def __init__(self):
            self.attributes = attributes

        @property
        def flags(self):
            links[0] = {"trace_id": 3, "span_id": 4}
            return None

    link = Link()
    weakref.finalize(link, attributes.update, state="after")
    links.append(link)
    del link
    return links


def test_a_link_freed_once_read_is_written_as_read():
    expected = reference(_extras.links_for_v04, links_freed_once_read(), pack=True)
    assert b"before" in expected
    got = encoded("v0.4", span_with(links=links_freed_once_read()))
    assert packed(got["span_links"]) == expected


def test_v04_forms_convert_each_item_before_reading_the_next():
    expected = reference(_extras.events_for_v04, events_where_reading_the_second_changes_the_first(), pack=True)
    got = encoded("v0.4", span_with(events=events_where_reading_the_second_changes_the_first()),
                  native_span_events=True)
    assert packed(got["span_events"]) == expected
    expected = reference(_extras.links_for_v04, links_where_reading_the_second_changes_the_first(), pack=True)
    got = encoded("v0.4", span_with(links=links_where_reading_the_second_changes_the_first()))
    assert packed(got["span_links"]) == expected


class HookLink(LinkObject):
    """A link whose to_dict() runs `hook` (once) first."""

    def __init__(self, fields, hook=None):
        super().__init__(fields)
        self._hook = hook

    def to_dict(self):
        hook, self._hook = self._hook, None
        if hook is not None:
            hook()
        return super().to_dict()


def hooked_links_trace(trace_id, hook=None, declined=False):
    """links_and_events_trace with the middle span's first link running `hook`."""
    spans = links_and_events_trace(trace_id, declined=declined)
    first = spans[1]["links"][0]
    spans[1]["links"] = [HookLink(first._fields, hook)] + spans[1]["links"][1:]
    return spans


@pytest.mark.parametrize("version,options", ENCODINGS)
@pytest.mark.parametrize("declined", [False, True])
def test_put_and_encode_from_to_dict_mid_trace(version, options, declined):
    """to_dict() is span code: a put() or an encode() it makes on the same
    encoder, while this trace's links are being written (in C, or declined
    and handed to _extras), gives what those calls give in that order."""
    def fresh():
        return spanpack.TraceMsgPackEncoder(version, **options)

    before = [links_and_events_trace(10 + i) for i in range(2)]
    inner = links_and_events_trace(15, declined=not declined)
    encoder = fresh()
    for trace in before:
        encoder.put(trace)
    encoder.put(hooked_links_trace(16, lambda: encoder.put(inner), declined=declined))
    expected = fresh().encode_traces(before + [inner, links_and_events_trace(16, declined=declined)])
    assert encoder.encode() == [(expected, len(before) + 2)]

    flushed = []
    for trace in before:
        encoder.put(trace)
    encoder.put(hooked_links_trace(16, lambda: flushed.extend(encoder.encode()), declined=declined))
    assert flushed == [(fresh().encode_traces(before), len(before))]
    assert encoder.encode() == [(fresh().encode_traces([links_and_events_trace(16, declined=declined)]), 1)]


@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
def test_list_attributes_flattened_past_ten_items_and_under_any_key(version):
    """key.0 ... key.11 (indexes of two digits), nested lists, a key that is
    not ASCII: the flattened names as spanpack._extras makes them."""
    items = [{"trace_id": 1, "span_id": 2,
              "attributes": {"k": list(range(12)), "cl\u00e9": ["a", "b"], "n": [[1, 2]] * 11}}]
    if version == "v0.4":
        expected = reference(_extras.links_for_v04, items, pack=True)
        written = lambda span: packed(span["span_links"])  # noqa: E731
    else:
        expected = reference(_extras.links_json, items)
        written = lambda span: span[9]["_dd.span_links"]  # noqa: E731
    assert "k.11" in str(expected) and "n.10.1" in str(expected)
    assert_written_as_reference(encoded(version, span_with(links=items)), expected, written)
