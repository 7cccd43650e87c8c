"""Data lost to naming: a span class whose fields are not where spanpack reads
them.

- a fields= mapping that names an attribute the class can never have is a
  TypeError at the class's first span, naming the class and the attribute;
- ddtrace's own Span class is read as fields="ddtrace" reads it, without
  fields=;
- the first span of a class that lacks meta (metrics, duration_ns,
  parent_id, span_type) but has it under a common other name gives one
  SpanFieldWarning per class, naming the attribute and the fields= that
  reads it; that fields= writes the data; a class that simply has no tags
  gives none; the warning made an error by a filter fails the trace and
  leaves the encoder as it was;
- every span's trace_id is checked for presence and type (the first span's
  is the one written).

References: the same spans as dicts with the protocol's keys (the dict path
reads no attribute names), fields="ddtrace" on ddtrace's Spans, and the
decoded payload.
"""

from __future__ import annotations

import ast
import re
import warnings

import msgpack
import pytest

import spanpack
from spanpack import SpanFieldWarning

from tests.support import feed, good_span

VERSIONS = ("v0.4", "v0.5", "v1.0")
PATHS = ("encode_traces", "put", "encode_trace")

GOOD_BEFORE = [good_span(span_id=11, service="before", meta={"k": "before"})]
GOOD_AFTER = [good_span(span_id=12, service="after", metrics={"m": 1})]


def payload(encoder, path, traces):
    """One payload for `traces` through `path`."""
    fed = feed(encoder, path, traces)
    if path == "encode_traces":
        return fed
    if path == "put":
        ((data, count),) = encoder.encode()
        assert count == len(traces)
        return data
    return encoder.join_encoded(fed)


def dict_payload(version, traces):
    return spanpack.TraceMsgPackEncoder(version).encode_traces(traces)


def span_class(names, slots=True, base=object, extra=None):
    """A span class with these attribute names (slots, or a plain class)."""
    namespace = dict(extra or {})
    if slots:
        namespace["__slots__"] = tuple(names)
    return type("UserSpan", (base,), namespace)


def make(cls, **values):
    span = cls()
    for name, value in values.items():
        setattr(span, name, value)
    return span


def core(**overrides):
    """The fields of a small span, by their protocol names."""
    values = good_span(span_type="web", parent_id=3, meta={"http.method": "GET"},
                       metrics={"_dd.measured": 1})
    values.update(overrides)
    return values


def field_warnings(record):
    return [w for w in record if issubclass(w.category, SpanFieldWarning)]


# ---------------------------------------------------------------------------
# fields= naming an attribute the class can never have


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
def test_mapping_to_an_impossible_attribute_is_a_type_error(version, path):
    values = core()
    values["tags"] = values.pop("meta")
    cls = span_class(values)
    encoder = spanpack.TraceMsgPackEncoder(version, fields={"meta": "tagz"})
    with pytest.raises(TypeError) as info:
        payload(encoder, path, [[make(cls, **values)]])
    message = str(info.value)
    assert message.startswith("trace 0, span 0, meta: "), message
    assert "'tagz'" in message and "UserSpan" in message, message
    # The encoder is untouched: dict spans (which fields= does not rename)
    # encode as on a fresh encoder.
    assert payload(encoder, path, [GOOD_BEFORE, GOOD_AFTER]) == dict_payload(
        version, [GOOD_BEFORE, GOOD_AFTER])


@pytest.mark.parametrize("version", VERSIONS)
def test_dotted_mapping_checks_its_first_step(version):
    cls = span_class(core())
    encoder = spanpack.TraceMsgPackEncoder(version, fields={"origin": "ctx.dd_origin"})
    with pytest.raises(TypeError, match=r"origin.*'ctx'.*UserSpan"):
        encoder.encode_traces([[make(cls, **core())]])


class WithGetattr:
    def __getattr__(self, name):
        if name == "tagz":
            return {"from": "getattr"}
        raise AttributeError(name)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "cls,written",
    [
        # instances may have it in their __dict__: absent is a per-span matter
        (span_class((), slots=False), None),
        # a class attribute
        (span_class(core(), extra={"tagz": {"from": "class"}}), {"from": "class"}),
        # a class's own __getattr__ decides
        (type("UserSpan", (WithGetattr,), {}), {"from": "getattr"}),
    ],
    ids=["instance-dict", "class-attribute", "getattr"],
)
def test_mapping_to_an_attribute_the_class_may_have_is_read(cls, written, version):
    values = core()
    del values["meta"]
    span = make(cls, **values)
    encoder = spanpack.TraceMsgPackEncoder(version, fields={"meta": "tagz"})
    expected = dict(values) if written is None else dict(values, meta=written)
    assert encoder.encode_traces([[span]]) == dict_payload(version, [[expected]])


# ---------------------------------------------------------------------------
# ddtrace's own Span without fields=


try:
    import ddtrace  # noqa: F401  (the pinned test dependency, absent on the newest CPython)
except ImportError:
    ddtrace = None
needs_ddtrace = pytest.mark.skipif(ddtrace is None, reason="ddtrace is not installed")


def ddtrace_trace():
    from ddtrace._trace.span import Span

    root = Span("web.request", service="web", resource="GET /", span_type="web",
                trace_id=0x1234, span_id=0x10, start=1.0)
    root.set_tag("http.method", "GET")
    root.set_metric("_dd.measured", 1)
    root.context._meta["_dd.origin"] = "synthetics"
    child = Span("db.query", service="db", trace_id=0x1234, span_id=0x11, parent_id=0x10,
                 start=1.5)
    child.set_tag("db.system", "postgresql")
    child.set_metric("rows", 3)
    for span in (root, child):
        span.duration_ns = 1000
    return [root, child]


@needs_ddtrace
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
def test_ddtrace_span_is_recognised_without_fields(version, path):
    trace = ddtrace_trace()
    expected = payload(spanpack.TraceMsgPackEncoder(version, fields="ddtrace"), path, [trace])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = payload(spanpack.TraceMsgPackEncoder(version), path, [trace])
    assert got == expected
    if version == "v0.4":
        root, child = msgpack.unpackb(got)[0]
        assert root["meta"]["http.method"] == "GET" and root["meta"]["_dd.origin"] == "synthetics"
        assert child["metrics"]["rows"] == 3


@needs_ddtrace
@pytest.mark.parametrize("version", VERSIONS)
def test_ddtrace_span_subclass_is_read_as_ddtrace_reads_it(version):
    from ddtrace._trace.span import Span

    class MySpan(Span):
        __slots__ = ()

    trace = ddtrace_trace()
    mine = []
    for span in trace:
        copy = MySpan(span.name, service=span.service, resource=span.resource,
                      span_type=span.span_type, trace_id=span.trace_id, span_id=span.span_id,
                      parent_id=span.parent_id, start=span.start)
        copy._meta.update(span._meta)
        copy._metrics.update(span._metrics)
        copy.duration_ns = span.duration_ns
        mine.append(copy)
    mine[0].context._meta.update(trace[0].context._meta)
    expected = spanpack.TraceMsgPackEncoder(version, fields="ddtrace").encode_traces([trace])
    assert spanpack.TraceMsgPackEncoder(version).encode_traces([mine]) == expected


# ---------------------------------------------------------------------------
# SpanFieldWarning: a field kept under another common name

OTHER_NAMES = [
    ("meta", "tags"),
    ("meta", "attributes"),
    ("meta", "attrs"),
    ("meta", "labels"),
    ("metrics", "measures"),
    ("metrics", "numeric_tags"),
    ("duration_ns", "duration"),
    ("parent_id", "parent"),
    ("span_type", "type"),
]


def renamed(field, other):
    values = core()
    values[other] = values.pop(field)
    return values


def suggested_fields(message):
    """The fields= mapping the warning's message proposes."""
    found = re.search(r"fields=(\{[^}]*\})", message)
    assert found, message
    return ast.literal_eval(found.group(1))


@pytest.mark.parametrize("slots", [True, False], ids=["slots", "dict"])
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("field,other", OTHER_NAMES)
def test_other_name_warns_once_and_its_fields_reads_it(field, other, version, slots):
    values = renamed(field, other)
    cls = span_class(values, slots=slots)
    spans = [make(cls, **dict(values, span_id=20 + i)) for i in range(3)]
    encoder = spanpack.TraceMsgPackEncoder(version)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        lost = encoder.encode_traces([spans])
        encoder.encode_traces([spans])  # the class is known: no second warning
        spanpack.TraceMsgPackEncoder(version).encode_traces([[spans[0]]])  # per encoder
    found = field_warnings(record)
    assert len(found) == 2, [str(w.message) for w in found]
    message = str(found[0].message)
    assert "UserSpan" in message and repr(other) in message and repr(field) in message, message
    assert found[0].filename == __file__  # attributed to the caller's line
    # What was lost: the encoding is that of the spans without the field.
    without = [{k: v for k, v in dict(values, span_id=20 + i).items() if k != other}
               for i in range(3)]
    assert lost == dict_payload(version, [without])

    # The fields= of the message writes the field and silences the warning.
    mapping = suggested_fields(message)
    assert mapping == {field: other}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = spanpack.TraceMsgPackEncoder(version, fields=mapping).encode_traces([spans])
    expected = [dict(core(), span_id=20 + i) for i in range(3)]
    assert written == dict_payload(version, [expected])


@pytest.mark.parametrize("version", VERSIONS)
def test_one_warning_names_every_other_name_of_the_class(version):
    values = core()
    values["tags"] = values.pop("meta")
    values["duration"] = values.pop("duration_ns")
    cls = span_class(values)
    with pytest.warns(SpanFieldWarning) as record:
        spanpack.TraceMsgPackEncoder(version).encode_traces([[make(cls, **values)]])
    assert len(record) == 1
    assert suggested_fields(str(record[0].message)) == {"meta": "tags", "duration_ns": "duration"}


class PropertyTags:
    """tags as a property (computed): present without being called."""

    calls = 0

    @property
    def tags(self):
        PropertyTags.calls += 1
        return {"from": "property"}


@pytest.mark.parametrize("version", VERSIONS)
def test_property_under_another_name_warns_without_being_called(version):
    values = core()
    del values["meta"]
    cls = type("UserSpan", (PropertyTags,), {})
    with pytest.warns(SpanFieldWarning, match="'tags' but no 'meta'"):
        spanpack.TraceMsgPackEncoder(version).encode_traces([[make(cls, **values)]])
    assert PropertyTags.calls == 0


NO_ALARM_CLASSES = {
    # no tags at all, under any name
    "no-tags": (span_class([k for k in core() if k != "meta"]), [k for k in core() if k != "meta"]),
    # both meta and tags: meta is read
    "meta-and-tags": (span_class(list(core()) + ["tags"]), list(core()) + ["tags"]),
    # methods named like fields are no data
    "methods": (span_class([k for k in core() if k not in ("meta", "span_type")],
                           extra={"labels": lambda self: {}, "type": lambda self: "web"}),
                [k for k in core() if k not in ("meta", "span_type")]),
    # an empty slot of another name holds nothing
    "empty-slot": (span_class([k for k in core() if k != "meta"] + ["tags"]),
                   [k for k in core() if k != "meta"]),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(NO_ALARM_CLASSES))
def test_no_false_alarm(case, version):
    cls, names = NO_ALARM_CLASSES[case]
    values = {name: core(tags={"x": "y"}).get(name) for name in names}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spanpack.TraceMsgPackEncoder(version).encode_traces([[make(cls, **values)]])


@pytest.mark.parametrize("version", VERSIONS)
def test_mapping_the_field_silences_the_warning(version):
    values = renamed("meta", "tags")
    cls = span_class(values, slots=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # meta mapped elsewhere (the class's instances may have it): no word
        spanpack.TraceMsgPackEncoder(version, fields={"meta": "meta"}).encode_traces(
            [[make(cls, **values)]])


def class_span_with_tags():
    values = renamed("meta", "tags")
    return make(span_class(values), **values)


def dict_span_with_tags():
    span = core()
    del span["meta"]
    return dict(span, tags={"a": "b"})


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("bad_span", [class_span_with_tags, dict_span_with_tags], ids=["class", "dict"])
def test_warning_made_an_error_fails_the_trace_atomically(bad_span, version, path):
    encoder = spanpack.TraceMsgPackEncoder(version)
    if path == "put":
        encoder.put(GOOD_BEFORE)
        size = encoder.size
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpanFieldWarning)
        for attempt in range(2):  # refused each time, as Python's own warnings are
            with pytest.raises(SpanFieldWarning) as info:
                if path == "encode_traces":
                    encoder.encode_traces([GOOD_BEFORE, [bad_span()]])
                elif path == "put":
                    encoder.put([bad_span()])
                else:
                    encoder.encode_trace([bad_span()])
            trace_index = 1 if path == "encode_traces" else 0
            assert info.value.__notes__ == ["trace %d, span 0, field meta" % trace_index]
    if path == "put":
        assert (len(encoder), encoder.size) == (1, size)
        encoder.put(GOOD_AFTER)
        assert encoder.encode() == [(dict_payload(version, [GOOD_BEFORE, GOOD_AFTER]), 2)]
    else:
        assert payload(encoder, path, [GOOD_BEFORE, GOOD_AFTER]) == dict_payload(
            version, [GOOD_BEFORE, GOOD_AFTER])


# ---------------------------------------------------------------------------
# Every span's trace_id


def trace_with(index, trace_id, form):
    spans = [core(span_id=30 + i, trace_id=0x77) for i in range(4)]
    if trace_id is None:
        del spans[index]["trace_id"]
    else:
        spans[index]["trace_id"] = trace_id
    if form == "dict":
        return spans
    return [make(span_class(span), **span) for span in spans]


@pytest.mark.parametrize("form", ["dict", "slots"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "trace_id,expected",
    [(None, "trace_id: missing"), ("0x77", "trace_id: expected int, not str"),
     (7.0, "trace_id: expected int, not float")],
    ids=["missing", "str", "float"],
)
@pytest.mark.parametrize("index", [0, 2])
def test_every_spans_trace_id_is_checked(index, trace_id, expected, version, path, form):
    encoder = spanpack.TraceMsgPackEncoder(version)
    with pytest.raises(TypeError) as info:
        payload(encoder, path, [trace_with(index, trace_id, form)])
    assert str(info.value).startswith("trace 0, span %d, %s" % (index, expected)), str(info.value)
    assert payload(encoder, path, [GOOD_BEFORE]) == dict_payload(version, [GOOD_BEFORE])


@pytest.mark.parametrize("version", VERSIONS)
def test_first_spans_trace_id_is_written(version):
    """As ddtrace does: a later span's (valid) trace_id is checked, not written."""
    trace = trace_with(2, 0x99, "dict")
    same = [dict(span, trace_id=0x77) for span in trace]
    assert dict_payload(version, [trace]) == dict_payload(version, [same])


# ---------------------------------------------------------------------------
# Dict spans: keys that hold what spanpack does not write


def dict_span(**extra):
    span = core()
    span.pop("meta")
    span.update(extra)
    return span


def caught(encoder, path, traces):
    with warnings.catch_warnings(record=True) as caught_warnings:
        warnings.simplefilter("always")
        payload(encoder, path, traces)
    return [str(w.message) for w in caught_warnings if issubclass(w.category, SpanFieldWarning)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("key, field", [("tags", "meta"), ("attributes", "meta"), ("measures", "metrics"),
                                        ("duration", "duration_ns"), ("parent_span_id", "parent_id"),
                                        ("type", "span_type"), ("service_name", "service")])
def test_dict_key_under_another_name_warns_once_per_encoder(key, field, version, path):
    span = dict_span(**{key: {"a": "b"}})
    span.pop(field, None)
    encoder = spanpack.TraceMsgPackEncoder(version)
    messages = caught(encoder, path, [[span], [dict(span)]])
    assert messages == ["dict span has key %r but no %r, which spanpack does not write: "
                        "name the key %r to write it" % (key, field, field)]
    assert caught(encoder, path, [[dict(span)]]) == []  # once per key and encoder
    # A key built at run time (not interned) is the same key.
    runtime_key = "".join(list(key))
    assert runtime_key is not key
    fresh = spanpack.TraceMsgPackEncoder(version)
    assert len(caught(fresh, path, [[{**{k: v for k, v in span.items() if k != key}, runtime_key: 1}]])) == 1


@pytest.mark.parametrize("key", ["kind", "span_kind", "span.kind"])
@pytest.mark.parametrize("version", VERSIONS)
def test_dict_span_kind_key_warns(key, version):
    span = dict_span(meta={"a": "b"}, **{key: "server"})
    assert caught(spanpack.TraceMsgPackEncoder(version), "encode_traces", [[span]]) == [
        "dict span has key %r, which spanpack does not write: give the span kind as "
        "meta['span.kind']" % key]


@pytest.mark.parametrize("version", VERSIONS)
def test_dict_keys_with_the_field_or_harmless_give_no_warning(version):
    spans = [dict_span(meta={"a": "b"}, tags={"c": "d"}),  # the field is there too
             dict_span(env="prod", component="db", **{"_private": 1}),  # no field's other name
             dict_span()]
    encoder = spanpack.TraceMsgPackEncoder(version)
    for _ in range(2):  # the second time through the noted keys
        assert caught(encoder, "encode_traces", [spans]) == []
    assert payload(encoder, "encode_traces", [spans]) == dict_payload(version, [[dict_span(meta={"a": "b"}), dict_span(), dict_span()]])
