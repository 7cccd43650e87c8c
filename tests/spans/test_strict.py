"""strict=True: a span that carries what the encoder would not write is
refused, naming it, on every version and entry point, and the encoder is left
as it was; a span that carries nothing more is written exactly as without
strict.  What counts as carried: a dict span's keys that are no span field;
an object's slots holding a value and its instance attributes that no field
reads (by their names, or by fields=).  ddtrace's own Span is read whole as
ddtrace writes it, and is not checked.
"""

from __future__ import annotations

import dataclasses

import pytest

import spanpack

from tests.support import feed, good_span

VERSIONS = ("v0.4", "v0.5", "v1.0")
PATHS = ("encode_traces", "put", "encode_trace")


class Slotted:
    __slots__ = ("trace_id", "span_id", "name", "start_ns", "meta", "kind", "spare")

    def __init__(self, **values):
        for name, value in values.items():
            setattr(self, name, value)


class Plain:
    def __init__(self, **values):
        self.__dict__.update(values)


@dataclasses.dataclass
class Data:
    trace_id: int
    span_id: int
    name: str
    start_ns: int
    meta: dict


CORE = {"trace_id": 1, "span_id": 2, "name": "n", "start_ns": 5}


def encode(version, path, spans, **options):
    encoder = spanpack.TraceMsgPackEncoder(version, strict=True, **options)
    fed = feed(encoder, path, [spans])
    if path == "encode_traces":
        return fed
    if path == "put":
        return encoder.encode()[0][0]
    return encoder.join_encoded(fed)


@pytest.mark.filterwarnings("ignore::spanpack.SpanFieldWarning")  # Plain's tags: warned of too
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("span, named", [
    (dict(CORE, tags={"a": "b"}, kind="server"), "dict span has 'tags', 'kind'"),
    (dict(CORE, env="prod"), "dict span has 'env'"),
    (Slotted(kind="server", **CORE), "span of class tests.spans.test_strict.Slotted carries 'kind'"),
    (Plain(tags={}, **CORE), "span of class tests.spans.test_strict.Plain carries 'tags'"),
])
def test_what_is_not_written_is_refused_by_name(span, named, version, path):
    encoder = spanpack.TraceMsgPackEncoder(version, strict=True)
    encoder.put([dict(CORE)])
    size = encoder.size
    with pytest.raises(TypeError) as raised:
        feed(encoder, path, [[span]])
    assert str(raised.value) == "trace 0, span 0, span: %s, which spanpack does not write (strict=True)" % named
    assert (len(encoder), encoder.size) == (1, size)  # put's encoder as it was
    [(payload, count)] = encoder.encode()
    assert (payload, count) == (spanpack.TraceMsgPackEncoder(version).encode_traces([[dict(CORE)]]), 1)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
def test_what_is_all_written_is_written_as_without_strict(version, path):
    spans = [dict(good_span(span_id=3)),
             Slotted(meta={"a": "b"}, **CORE),  # slots without a value are carried by no span
             Plain(meta={"a": "b"}, **CORE),
             Data(meta={"a": "b"}, **CORE)]
    assert encode(version, path, spans) == spanpack.TraceMsgPackEncoder(version).encode_traces([spans])


@pytest.mark.parametrize("version", VERSIONS)
def test_fields_mapping_says_what_is_read(version):
    span = Plain(tags={"a": "b"}, ctx=Plain(origin="o"), **CORE)
    options = {"fields": {"meta": "tags", "origin": "ctx.origin"}}
    assert encode(version, "encode_traces", [span], **options) == spanpack.TraceMsgPackEncoder(
        version, **options).encode_traces([[span]])


def test_ddtrace_span_is_not_checked():
    ddtrace_span = pytest.importorskip("ddtrace._trace.span")
    span = ddtrace_span.Span("op", service="s", resource="r", trace_id=1, span_id=2)
    span.set_tag("k", "v")
    span.finish()
    for version in VERSIONS:
        assert encode(version, "encode_traces", [span]) == spanpack.TraceMsgPackEncoder(version).encode_traces([[span]])


class AllFields:
    """Every object slot a field: no span of it can carry anything unwritten
    (the check is worked out once for the class, then skipped)."""

    __slots__ = ("trace_id", "span_id", "name", "start_ns", "meta")

    def __init__(self, **values):
        for name, value in values.items():
            setattr(self, name, value)


class AllFieldsAndMore(AllFields):
    __slots__ = ("spare",)


class AllFieldsAndDict(AllFields):
    pass  # an instance __dict__: checked span by span


class Renamed:
    __slots__ = ("trace_id", "span_id", "name", "start_ns", "tags", "meta")

    def __init__(self, **values):
        for name, value in values.items():
            setattr(self, name, value)


class NotAscii:
    __slots__ = ("trace_id", "span_id", "name", "start_ns", "métrica")

    def __init__(self, **values):
        for name, value in values.items():
            setattr(self, name, value)


@pytest.mark.filterwarnings("ignore::spanpack.SpanFieldWarning")  # Renamed's tags
@pytest.mark.parametrize("version", VERSIONS)
def test_a_class_whose_every_slot_is_a_field_is_written_and_its_kin_still_checked(version):
    """The verdict worked out for one class holds for it alone: a subclass
    with a slot more, or with an instance dict, and a class whose slot is
    read under fields= (or not read for it) are checked span by span."""
    encoder = spanpack.TraceMsgPackEncoder(version, strict=True)
    plain = spanpack.TraceMsgPackEncoder(version)
    spans = [AllFields(meta={"a": "b"}, **CORE) for _ in range(3)]
    assert encoder.encode_traces([spans]) == plain.encode_traces([spans])
    refused = [
        (AllFieldsAndMore(spare=1, **CORE), "AllFieldsAndMore carries 'spare'"),
        (AllFieldsAndDict(**CORE), None),
        (NotAscii(**CORE, **{"métrica": 1}), "NotAscii carries 'métrica'"),
    ]
    with_dict = refused[1][0]
    with_dict.extra = 1
    refused[1] = (with_dict, "AllFieldsAndDict carries 'extra'")
    for span, named in refused:
        with pytest.raises(TypeError, match="class tests.spans.test_strict.%s" % named):
            encoder.encode_traces([[span]])
    assert encoder.encode_traces([[AllFieldsAndMore(**CORE)]]) == plain.encode_traces([[AllFieldsAndMore(**CORE)]])
    renamed = spanpack.TraceMsgPackEncoder(version, strict=True, fields={"meta": "tags"})
    assert renamed.encode_traces([[Renamed(tags={"a": "b"}, **CORE)]]) == spanpack.TraceMsgPackEncoder(
        version, fields={"meta": "tags"}).encode_traces([[Renamed(tags={"a": "b"}, **CORE)]])
    with pytest.raises(TypeError, match="Renamed carries 'meta'"):
        renamed.encode_traces([[Renamed(meta={"a": "b"}, **CORE)]])
    with pytest.raises(TypeError, match="Renamed carries 'tags'"):
        encoder.encode_traces([[Renamed(tags={"a": "b"}, **CORE)]])
