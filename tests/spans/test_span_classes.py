"""Span classes as tracer authors write them: every form is read as Python's
own attribute lookup reads it.

The reference for each span object is the dict of the fields it has
(``getattr`` of each field ``hasattr`` finds), encoded by the same encoder:
the bytes must be identical, for v0.4 and v0.5, whatever the class keeps
where (slots, instance ``__dict__``, class defaults, properties, descriptors,
``__getattr__``), and after instances or classes change between encodes.
"""

import dataclasses

import pytest

import spanpack

attrs = pytest.importorskip("attrs")
msgspec = pytest.importorskip("msgspec")

VERSIONS = ["v0.4", "v0.5"]
CORE = ("trace_id", "span_id", "parent_id", "service", "name", "resource", "span_type",
        "start_ns", "duration_ns", "error", "meta", "metrics")
ALL = CORE + ("meta_struct", "links", "events", "origin")


def values(i=0, **overrides):
    out = {
        "trace_id": 0xABC, "span_id": 100 + i, "parent_id": 99 + i if i else None,
        "service": "svc", "name": "op.%d" % (i % 2), "resource": "GET /r/%d" % i,
        "span_type": "web", "start_ns": 1_000_000 + i, "duration_ns": 500 + i, "error": i % 3 == 2,
        "meta": {"k": "v%d" % i, "component": "c"}, "metrics": {"m": i, "f": 0.5 * i},
    }
    out.update(overrides)
    return out


def reference(span):
    """The dict of the protocol fields the object has, as Python sees them."""
    if isinstance(span, dict):
        return span
    return {field: getattr(span, field) for field in ALL if hasattr(span, field)}


def _outcome(encode):
    try:
        return encode()
    except (TypeError, ValueError) as error:
        return type(error), str(error)


def assert_read_like_python(trace, **options):
    """Same bytes as the reference dicts, or the same error."""
    for version in VERSIONS:
        got = _outcome(lambda: spanpack.TraceMsgPackEncoder(version, **options).encode_traces([trace]))
        want = _outcome(lambda: spanpack.TraceMsgPackEncoder(version, **options).encode_traces(
            [[reference(s) for s in trace]]))
        assert got == want, version


def fill(cls, i=0, skip=(), **overrides):
    span = cls.__new__(cls)
    for name, value in values(i, **overrides).items():
        if name not in skip:
            object.__setattr__(span, name, value)
    return span


# ---------------------------------------------------------------------------
# Class forms


class SlotsCore:
    __slots__ = CORE


class SlotsSome:
    __slots__ = ("trace_id", "span_id", "name", "start_ns", "meta")


class SlotsAll:
    __slots__ = ALL


class Plain:
    pass


class SlotsThenDict(SlotsSome):
    """A subclass without __slots__: the rest lands in its __dict__."""


class DictThenSlots(Plain):
    __slots__ = ("span_id", "meta")


class WithDefaults:
    service = "default-service"
    error = 0
    meta = None


class SlotsWithClassDefault(SlotsSome):
    __slots__ = ()
    service = "class-level"


@dataclasses.dataclass
class DataSpan:
    trace_id: int
    span_id: int
    name: str
    start_ns: int
    service: str = "dc-default"
    duration_ns: int = 0
    meta: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True) if hasattr(dataclasses, "KW_ONLY") else dataclasses.dataclass
class SlotDataSpan:
    trace_id: int
    span_id: int
    name: str
    start_ns: int
    meta: dict = dataclasses.field(default_factory=dict)


@attrs.define
class AttrsSlots:
    trace_id: int
    span_id: int
    name: str
    start_ns: int
    metrics: dict = attrs.field(factory=dict)


@attrs.define(slots=False)
class AttrsDict:
    trace_id: int
    span_id: int
    name: str
    start_ns: int
    metrics: dict = attrs.field(factory=dict)


class StructSpan(msgspec.Struct):
    trace_id: int
    span_id: int
    name: str
    start_ns: int
    resource: str = "struct-default"
    meta: dict = {}


class ComputedDuration:
    """duration_ns from an end time; error from the meta."""

    @property
    def duration_ns(self):
        return self.end_ns - self.start_ns

    @property
    def error(self):
        return 1 if "error.message" in self.meta else 0


class WithGetattr:
    def __getattr__(self, name):
        if name == "service":
            return "from-getattr"
        raise AttributeError(name)


class WithGetattribute:
    def __getattribute__(self, name):
        if name == "resource":
            return "from-getattribute"
        return object.__getattribute__(self, name)


class Meta(type):
    def __getattr__(cls, name):  # class-level hook: instances do not use it
        return "from-metaclass"


class WithMetaclass(metaclass=Meta):
    pass


class Method:
    """A field name that is a method on the class: a non-data descriptor the
    instance __dict__ shadows."""

    def parent_id(self):
        return 1


def _make(cls, i):
    if cls is DataSpan:
        return DataSpan(0xABC, 100 + i, "n", 5, meta={"a": str(i)})
    if cls is SlotDataSpan:
        return SlotDataSpan(0xABC, 100 + i, "n", 5)
    if cls in (AttrsSlots, AttrsDict):
        return cls(0xABC, 100 + i, "n", 5, metrics={"x": i})
    if cls is StructSpan:
        return StructSpan(0xABC, 100 + i, "n", 5, meta={"s": "t"})
    if cls is ComputedDuration:
        span = fill(cls, i, skip=("duration_ns", "error"))
        span.end_ns = span.start_ns + 42 + i
        return span
    if cls is Method:
        span = fill(cls, i, skip=("parent_id",))
        if i != 3:
            span.parent_id = 7  # shadows the method (span 3 gives the bound method: an error)
        return span
    if cls in (SlotsSome, SlotsWithClassDefault):
        return fill(cls, i, skip=set(CORE) - set(SlotsSome.__slots__))
    if cls is DictThenSlots:
        return fill(cls, i)
    if cls is WithDefaults:
        return fill(cls, i, skip=("service", "error", "meta") if i % 2 else ())
    return fill(cls, i)


CLASSES = [SlotsCore, SlotsSome, SlotsAll, Plain, SlotsThenDict, DictThenSlots, WithDefaults,
           SlotsWithClassDefault, DataSpan, SlotDataSpan, AttrsSlots, AttrsDict, StructSpan,
           ComputedDuration, WithGetattr, WithGetattribute, WithMetaclass, Method]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_class_form_reads_as_python_does(cls):
    trace = [_make(cls, i) for i in range(6)]
    assert_read_like_python(trace)


def test_mixed_classes_in_one_trace():
    trace = [_make(cls, i) for i, cls in enumerate(CLASSES)]
    trace[0] = _make(SlotsCore, 0)
    assert_read_like_python(trace)


def test_core_fields_only_lack_the_optional_ones():
    """A class with only the 12 core fields: the other four are absent."""
    span = _make(SlotsCore, 1)
    assert not hasattr(span, "origin")
    assert_read_like_python([span])


# ---------------------------------------------------------------------------
# Instances and classes that change after the class was first seen


def test_instances_gain_and_lose_attributes():
    encoder = spanpack.TraceMsgPackEncoder("v0.4")
    spans = [_make(Plain, i) for i in range(4)]
    encoder.encode_traces([spans])
    spans[1].origin = "synthetics"           # a name the class had never seen
    del spans[2].meta                         # one that every other instance has
    spans[3].meta_struct = {"appsec": {"a": 1}}
    assert_read_like_python(spans)
    for span in spans:
        span.links = None
    assert_read_like_python(spans)


@pytest.mark.parametrize("how", ["vars", "dict access", "dict replaced", "dict cleared", "dict with int key"])
def test_instance_dict_asked_for_or_replaced(how):
    spans = [_make(Plain, i) for i in range(3)]
    assert_read_like_python(spans)
    target = spans[1]
    if how == "vars":
        vars(target)["service"] = "via-vars"
    elif how == "dict access":
        target.__dict__["name"] = "via-dict"
    elif how == "dict replaced":
        target.__dict__ = dict(values(9, service="replaced"))
    elif how == "dict cleared":
        target.__dict__.clear()
        target.__dict__.update(values(8))
    else:
        target.__dict__[5] = "int key"
    assert_read_like_python(spans)


def test_many_attributes_fill_the_shared_keys():
    """More attribute names than an instance values array holds: the later
    ones live in a dict of the instance's own."""
    spans = []
    for i in range(4):
        span = _make(Plain, i)
        for n in range(60):
            setattr(span, "extra_%d" % n, n)
        spans.append(span)
    late = _make(Plain, 9)
    spans.append(late)
    assert_read_like_python(spans)


def test_class_changed_between_encodes():
    class Changing:
        pass

    spans = [fill(Changing, i) for i in range(3)]
    assert_read_like_python(spans)
    Changing.resource = property(lambda self: "now a property")
    assert_read_like_python(spans)
    del Changing.resource
    Changing.service = "class default"
    for span in spans:
        del span.service
    assert_read_like_python(spans)


def test_class_switched_between_spans():
    class First:
        __slots__ = CORE

    class Second:
        __slots__ = CORE

    spans = [fill(First, i) for i in range(4)]
    spans[2].__class__ = Second
    assert_read_like_python(spans)


def test_dotted_path_fields_through_different_classes():
    class Context:
        def __init__(self, origin):
            self.origin = origin

    class SlotContext:
        __slots__ = ("origin",)

    spans = [_make(Plain, i) for i in range(3)]
    spans[0].ctx = Context("synthetics")
    fields = {"origin": "ctx.origin", "meta": "tags"}
    for span in spans:
        span.tags = span.meta
    expected_origin = "synthetics"
    for version in VERSIONS:
        got = spanpack.TraceMsgPackEncoder(version, fields=fields).encode_traces([spans])
        ref = [dict(reference(s), meta=s.tags) for s in spans]
        ref[0]["origin"] = expected_origin
        want = spanpack.TraceMsgPackEncoder(version).encode_traces([ref])
        assert got == want
    empty = SlotContext()  # an empty slot part-way along the path: absent
    spans[0].ctx = empty
    for version in VERSIONS:
        got = spanpack.TraceMsgPackEncoder(version, fields=fields).encode_traces([spans])
        want = spanpack.TraceMsgPackEncoder(version).encode_traces([[dict(reference(s), meta=s.tags) for s in spans]])
        assert got == want


def test_a_property_raising_attribute_error_on_a_plain_class_propagates():
    class Broken:
        @property
        def meta(self):
            return self.missing_helper

    span = fill(Broken, 0, skip=("meta",))
    for version in VERSIONS:
        with pytest.raises(AttributeError, match=r"^trace 0, span 0, meta: .*missing_helper"):
            spanpack.TraceMsgPackEncoder(version).encode_traces([[span]])


def test_a_method_getter_raising_is_not_taken_for_absent():
    class Cached:
        def __init__(self):
            self.__dict__.update(values(0))
            del self.__dict__["span_type"]

        @property
        def span_type(self):
            raise RuntimeError("no type")

    for version in VERSIONS:
        with pytest.raises(RuntimeError, match="no type"):
            spanpack.TraceMsgPackEncoder(version).encode_traces([[Cached()]])
