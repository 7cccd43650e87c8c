"""ext/otel_map.c against spanpack.otel's rules in Python (the reference,
itself held to the Rust tracer's cases in test_otel_transform.py): the same
dict span, entry for entry and in the same order, for generated attribute
sets over every key the rules read, every kind and status, resource values
that come before the span's, events (exception ones in any case) and links,
and for spans made by the SDK's tracer.  And what C hands back to Python:
spans of classes that override ReadableSpan's properties."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402
from opentelemetry.trace import Link, SpanKind, Status, StatusCode  # noqa: E402

from spanpack import otel  # noqa: E402
from spanpack._extras import _event_fields, _link_dict  # noqa: E402
from spanpack._spanpack import _otel_group_traces, _otel_map_spans  # noqa: E402
from tests.otel.spans import KINDS, STATUSES, make_span  # noqa: E402
from tests.otel.test_otel_transform import NAMING  # noqa: E402
from tests.otel.transform_cases import CASES, SCOPE, SPAN_ID, TRACE_ID  # noqa: E402

pytestmark = pytest.mark.skipif(otel._C_PLAN_PARTS is None, reason="SPANPACK_OTEL_PYTHON is set")

RULE_KEYS = [
    "datadog.service", "datadog.name", "datadog.resource", "datadog.type", "datadog.error", "datadog.span.kind",
    "datadog.http_status_code", "datadog.env", "datadog.version", "datadog.error.msg", "datadog.error.type",
    "datadog.error.stack", "service.name", "operation.name", "resource.name", "span.type", "http.method",
    "http.request.method", "http.route", "http.response.status_code", "http.status_code", "http.status_text",
    "db.system", "db.system.name", "db.statement", "db.query.text", "messaging.system", "messaging.operation",
    "messaging.operation.type", "messaging.destination", "messaging.destination.name", "rpc.system",
    "rpc.service", "rpc.method", "faas.invoked_provider", "faas.invoked_name", "faas.trigger",
    "graphql.operation.type", "graphql.operation.name", "network.protocol.name", "_dd.measured",
    "sampling.priority", "analytics.event", "env", "version", "error.message", "error.type", "error.stack",
    "client.address", "url.full", "http.request.header.x-id", "deployment.environment", "container.id", "plain",
    "otel.scope.name", "otel.library.version",  # the scope's tags, set again over the attributes
]
TEXTS = st.sampled_from(["", "GET", "_OTHER", "PostgreSQL", "redis", "aws-api", "Kafka", "TRUE", "false", "x y",
                         "ünï", "201", "/r/{id}"])
VALUES = st.one_of(
    TEXTS,
    st.booleans(),
    st.integers(-3, 600),
    st.sampled_from([2**63, -(2**63) - 1, 2**70]),
    st.floats(width=32),
    st.sampled_from([1.0, 200.0, 1.5, 1e21, -1e300, float("inf"), float("-inf"), float("nan"), 2.0**63]),
    st.lists(TEXTS, max_size=2).map(tuple),
    st.lists(st.integers(0, 9), max_size=2).map(tuple),
)
EVENT_KEYS = ["exception.message", "exception.type", "exception.stacktrace", "other"]
RESOURCE_KEYS = ["service.name", "service.version", "deployment.environment.name", "deployment.environment",
                 "datadog.env", "http.request.method", "http.route", "span.type", "db.system", "db.statement",
                 "resource.name", "env", "version", "error.message", "analytics.event", "container.id", "count"]


def _scope(scope, attributes) -> InstrumentationScope:
    try:
        return InstrumentationScope(scope[0], scope[1], None, attributes)
    except TypeError:  # an SDK before scope attributes (1.20)
        return InstrumentationScope(*scope)


def _both(spans: List[Any]) -> None:
    """C's dict spans equal Python's, entries in the same order (compared as
    their repr, so that NaN metrics compare equal); a trace id beyond 128 bits
    or negative is handed back to the Python rules."""
    cache = otel._BatchCache()
    got = otel._map_in_c(spans, cache)
    objects = otel._map_in_c(spans, otel._BatchCache(), True)
    for span, c_span, c_object in zip(spans, got, objects):
        if c_span is None:
            assert not 0 <= span.context.trace_id < 2**128, span.name
            assert c_object is None
            continue
        expected = otel._span_dict(span, otel._BatchCache())
        assert repr(list(c_span.items())) == repr(list(expected.items()))
        assert repr(_object_items(c_object)) == repr(_written_items(list(expected.items())))


def _object_items(mapped: Any) -> List[Any]:
    """An OtelSpan's fields as a dict span's items: the ones it has, in its
    slot order (a dict span's key order), its links and events as written."""
    items = []
    for name in ("trace_id", "span_id", "parent_id", "service", "name", "resource", "span_type", "start_ns",
                 "duration_ns", "error", "meta", "metrics", "links", "events"):
        try:
            items.append((name, getattr(mapped, name)))
        except AttributeError:
            pass
    return _written_items(items)


def _written_items(items: List[Any]) -> List[Any]:
    """Links and events as the encoder reads them: links in their to_dict()
    form (an OtelLink gives its own; a dict link's is made by the rules in
    spanpack._extras), events as the fields spanpack._extras reads of a dict
    or of an OtelEvent's attributes."""
    readers = {"links": _link_dict, "events": _event_fields}
    return [(key, [readers[key](item) for item in value] if key in readers else value) for key, value in items]


@settings(max_examples=400)
@given(
    attributes=st.dictionaries(st.sampled_from(RULE_KEYS), VALUES, max_size=12),
    resource=st.dictionaries(st.sampled_from(RESOURCE_KEYS), st.one_of(TEXTS, st.integers(0, 9)), max_size=5),
    kind=st.sampled_from(list(KINDS)),
    status=st.sampled_from(list(STATUSES)),
    description=st.sampled_from([None, "", "broke"]),
    tracestate=st.sampled_from(["", "a=1", "dd=s:1,b=2"]),
    scope=st.sampled_from([("", None), ("lib", None), ("lib", "1.0")]),
    scope_attributes=st.dictionaries(st.sampled_from(["span.kind", "env", "http.status_code", "error.type", "x"]),
                                     TEXTS, max_size=3),
    parent=st.sampled_from([None, 5]),
    trace_id=st.sampled_from([1, TRACE_ID, 2**128 - 1, 2**128, -1]),
    events=st.lists(st.tuples(st.sampled_from(["exception", "Exception", "boom"]), st.integers(-5, 10**9),
                              st.dictionaries(st.sampled_from(EVENT_KEYS), VALUES, max_size=3)), max_size=3),
    links=st.lists(st.fixed_dictionaries({"trace_id": st.sampled_from([1, TRACE_ID]), "span_id": st.just(9)},
                                         optional={"tracestate": st.just("k=v"), "flags": st.sampled_from([0, 1]),
                                                   "attributes": st.dictionaries(TEXTS, VALUES, max_size=2)}),
                   max_size=2),
)
def test_c_mapping_is_the_python_mapping(attributes, resource, kind, status, description, tracestate, scope,
                                         scope_attributes, parent, trace_id, events, links):
    for link in links:
        link["attributes"] = list(link.get("attributes", {}).items())
    span = make_span(trace_id=trace_id, span_id=SPAN_ID, parent_id=parent, name="span-name", kind=kind,
                     attributes=list(attributes.items()), resource=list(resource.items()),
                     status=(status, description if status == "error" else None), tracestate=tracestate,
                     scope_object=_scope(scope, scope_attributes),
                     events=[(n, t, list(a.items())) for n, t, a in events], links=links)
    try:
        expected: Optional[Dict[str, Any]] = otel._span_dict(span, otel._BatchCache())
    except OverflowError:
        expected = None  # a metric beyond a double: both refuse it
    if expected is None:
        with pytest.raises(OverflowError):
            otel._map_in_c([span], otel._BatchCache())
        return
    _both([span])


@pytest.mark.parametrize("kind, attributes, resource, _", NAMING)
def test_c_naming_cases(kind, attributes, resource, _):
    _both([make_span(trace_id=TRACE_ID, span_id=SPAN_ID, kind=kind, name="n", attributes=attributes,
                     resource=resource)])


def test_c_transform_cases():
    _both([make_span(trace_id=TRACE_ID, span_id=SPAN_ID, scope=SCOPE, resource=case["resource"], **case["span"])
           for case in CASES])


def test_c_maps_spans_made_by_the_sdk():
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc", "env": "prod"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("lib", "2")
    with tracer.start_as_current_span("root", kind=SpanKind.SERVER, attributes={"http.request.method": "GET"}) as root:
        with tracer.start_as_current_span("db", kind=SpanKind.CLIENT, attributes={"db.system": "mysql"},
                                          links=[Link(root.get_span_context(), {"n": 1})]) as db:
            db.record_exception(ValueError("v"))
            db.set_status(Status(StatusCode.ERROR))
    _both(list(memory.get_finished_spans()))


def test_spans_c_hands_back_to_python():
    plain = make_span(trace_id=1, span_id=2, name="n")
    with_event = make_span(trace_id=1, span_id=3, name="n", events=[("e", 1, [])])
    with_link = make_span(trace_id=1, span_id=4, name="n", links=[{"trace_id": 1, "span_id": 9}])

    class OwnSpan(ReadableSpan):
        @property
        def name(self):  # an override: read through the properties
            return "renamed"

    own = OwnSpan(name="n", context=plain.context, resource=Resource({}), attributes={})
    mapped = otel._map_in_c([plain, with_event, with_link, own], otel._BatchCache())
    assert [span is None for span in mapped] == [False, False, False, True]
    traces = otel.map_spans([plain, with_event, with_link, own])
    assert [span["resource"] for span in traces[0]] == ["n", "n", "n", "renamed"]


@pytest.mark.parametrize("overridden", otel._SDK_PROPERTIES)
def test_a_subclass_overriding_any_read_property_is_handed_back(overridden):
    plain = make_span(trace_id=1, span_id=2, name="n")
    own_class = type("Own", (ReadableSpan,), {overridden: property(lambda self: getattr(ReadableSpan, overridden).fget(self))})
    arguments = dict(name="n", context=plain.context, resource=Resource({}), attributes={"k": 1},
                     start_time=5, end_time=9)  # fmt: skip
    own, base = own_class(**arguments), ReadableSpan(**arguments)
    mapped = otel._map_in_c([base, own], otel._BatchCache())
    assert mapped[0] is not None and mapped[1] is None
    # the Python rules read it through the property: the same span
    assert otel.map_spans([own])[0][0] == otel.map_spans([base])[0][0]


def test_a_property_patched_on_readable_span_hands_every_span_back(monkeypatch):
    plain = make_span(trace_id=1, span_id=2, name="n")
    assert otel._map_in_c([plain], otel._BatchCache())[0] is not None
    monkeypatch.setattr(ReadableSpan, "name", property(lambda self: "patched"))
    assert otel._map_in_c([plain], otel._BatchCache())[0] is None
    assert otel.map_spans([plain])[0][0]["resource"] == "patched"


class GetsName:
    """A class-level descriptor that gives another object to each class-level
    lookup (so getattr on the class never finds the same object twice)."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return object() if obj is None else "unstable-" + obj._name


def test_a_descriptor_giving_new_objects_on_readable_span(monkeypatch):
    plain = make_span(trace_id=1, span_id=2, name="n")
    monkeypatch.setattr(ReadableSpan, "name", GetsName())
    assert otel._map_in_c([plain], otel._BatchCache())[0] is None
    assert otel.map_spans([plain])[0][0]["resource"] == "unstable-n"


def test_a_metaclass_descriptor_beside_an_own_getattribute():
    class MetaName(type):
        @property
        def name(cls) -> str:
            return "meta"

    class OwnLookup(ReadableSpan, metaclass=MetaName):
        def __getattribute__(self, name: str) -> Any:
            return "custom-name" if name == "name" else object.__getattribute__(self, name)

    plain = make_span(trace_id=1, span_id=2, name="n")
    span = OwnLookup(name="n", context=plain.context, resource=Resource({}), attributes={})
    assert otel._map_in_c([span], otel._BatchCache())[0] is None
    assert otel.map_spans([span])[0][0]["resource"] == "custom-name"


def test_classes_that_are_no_readable_span_are_handed_back():
    plain = make_span(trace_id=1, span_id=2, name="n")

    class Lookalike:  # the SDK's fields, not its class
        pass

    lookalike = Lookalike()
    lookalike.__dict__.update(plain.__dict__)

    class Meta(type):
        @property
        def name(cls):  # a metaclass property: not what an instance finds
            return "from-metaclass"

    class WithMeta(ReadableSpan, metaclass=type("M", (Meta, type(ReadableSpan)), {})):
        pass

    with_meta = WithMeta(name="n", context=plain.context, resource=Resource({}), attributes={})
    mapped = otel._map_in_c([lookalike, with_meta], otel._BatchCache())
    assert mapped[0] is None
    assert mapped[1] is not None and mapped[1]["resource"] == "n"


def test_a_bad_plan_is_refused():
    with pytest.raises(TypeError):
        _otel_map_spans([], ())
    with pytest.raises(TypeError):
        _otel_map_spans(5, otel._C_PLAN_PARTS)


# -- fields read in place (the SDK objects' values arrays), and where they are not


def _sdk_batch(lowered_system: str = "PostgreSQL") -> List[Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("lib", "2")
    for n in range(3):
        with tracer.start_as_current_span("q%d" % n, kind=SpanKind.CLIENT,
                                          attributes={"db.system": lowered_system, "n": n}) as span:
            span.add_event("e%d" % n, {"k": n})
            span.set_status(Status(StatusCode.ERROR, "d%d" % n))
    provider.shutdown()
    return list(memory.get_finished_spans())


def test_spans_whose_dict_was_asked_for_map_alike():
    """An instance whose __dict__ was materialised (its values no longer in
    the array the class's others use), or grew attributes of its own, maps as
    its untouched siblings do."""
    spans = _sdk_batch()
    vars(spans[0])  # the __dict__ made
    spans[1].extra = "x"  # one attribute more
    vars(spans[2]._status)
    vars(spans[2]._attributes)
    vars(spans[2]._events)
    _both(spans)
    names = [span["name"] for span in otel._map_in_c(spans, otel._BatchCache())]
    assert names == ["postgresql.query"] * 3


def test_a_field_moved_to_a_descriptor_is_read_through_it():
    """A subclass that keeps a field the SDK keeps in the instance behind a
    data descriptor of the same name (which wins over the instance) is read
    through it; one that deleted a field is mapped by the Python rules."""

    class Renaming(ReadableSpan):
        @property
        def _name(self):
            return "from-descriptor"

        @_name.setter
        def _name(self, value):
            self.__dict__["_name"] = value  # shadowed: the descriptor wins

    context = make_span(trace_id=1, span_id=2, name="n").context
    renamed = Renaming(name="n", context=context, resource=Resource({}), attributes={})
    lacking = ReadableSpan(name="gone", context=context, resource=Resource({}), attributes={})
    del lacking._events
    mapped = otel._map_in_c([renamed, lacking], otel._BatchCache())
    assert mapped[0]["resource"] == "from-descriptor"
    assert mapped[1] is None
    _both([renamed])


def test_a_class_changed_during_a_batch_is_found_again():
    """The class's layout is found again when the class changes (its version
    tag) in the middle of a batch, here by an event's name property read for
    the first span: a data descriptor added then wins for the spans after it."""

    class Changing(ReadableSpan):
        pass

    class ChangingEvent(Event):
        @property
        def name(self):
            Changing._name = property(lambda self: "descriptor")
            return "e"

    context = make_span(trace_id=1, span_id=2, name="n").context
    first = Changing(name="span-0", context=context, resource=Resource({}), attributes={},
                     events=[ChangingEvent("e", timestamp=1)])
    second = Changing(name="span-1", context=context, resource=Resource({}), attributes={})
    mapped = otel._map_in_c([first, second], otel._BatchCache())
    assert [span["resource"] for span in mapped] == ["span-0", "descriptor"]
    assert mapped[0]["events"] == [{"name": "e", "time_unix_nano": 1}]


def test_the_lowered_system_is_the_spans_own():
    """The operation name made from a system's lowered text is each span's own
    (the last one kept for the next span is only used for the same exact str;
    a str subclass's own lower() is called for every span)."""
    spans = _sdk_batch("PostgreSQL") + _sdk_batch("MySQL")

    class Loud(str):
        def lower(self):
            return "loud"

    spans += _sdk_batch(Loud("Redis"))
    _both(spans)
    names = [span["name"] for span in otel._map_in_c(spans, otel._BatchCache())]
    assert names == ["postgresql.query"] * 3 + ["mysql.query"] * 3 + ["loud.query"] * 3


def test_links_and_events_of_other_forms_are_converted_as_python_converts_them():
    """Links and events are made in C for the SDK's forms; an item of another
    form (attributes in another mapping, a float time) has the list converted
    by spanpack.otel, with the same result; BoundedAttributes past its limit
    (which some SDK versions keep in an OrderedDict) alike."""
    from types import MappingProxyType

    from opentelemetry.attributes import BoundedAttributes

    bounded = BoundedAttributes(maxlen=2, attributes={"a": 1, "b": (1, 2)}, immutable=False)
    bounded["c"] = "three"  # past maxlen: "a" goes
    context = make_span(trace_id=1, span_id=2, name="n").context
    spans = [
        ReadableSpan(name="proxy", context=context, resource=Resource({}),
                     links=[Link(context, MappingProxyType({"k": 1.5}))]),
        ReadableSpan(name="float-time", context=context, resource=Resource({}),
                     events=[Event("e", {"k": (1, 2)}, 1.5)]),
        ReadableSpan(name="ordered", context=context, resource=Resource({}),
                     events=[Event("e", bounded, 7)], links=[Link(context, bounded)]),
        ReadableSpan(name="plain", context=context, resource=Resource({}),
                     events=[Event("e", {"k": (1, 2), "n": None}, -3)],
                     links=[Link(context, {"t": (True, "x"), "i": 2**70, "b": False})]),
    ]
    _both(spans)
    mapped = otel._map_in_c(spans, otel._BatchCache())
    assert mapped[0]["links"][0]["attributes"] == {"k": "1.5"}
    assert mapped[1]["events"][0]["time_unix_nano"] == 1.5
    assert mapped[3]["events"] == [{"name": "e", "time_unix_nano": 0, "attributes": {"k": [1, 2], "n": None}}]
    assert mapped[3]["links"][0]["attributes"] == {"t": '[true,"x"]', "i": str(2**70), "b": "false"}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6), st.one_of(st.none(), st.integers(0, 6)),
                          st.one_of(st.none(), st.sampled_from([0, 1, 2.0, -1, None]))), max_size=12))
def test_c_grouping_is_the_python_grouping(rows):
    """Traces grouped by trace id in order of first appearance, the last
    sampling.priority of a trace (else the default) on its local root (the
    first span whose parent is not in the trace, else the first): C and the
    rules in Python agree, entry for entry."""

    def dd_spans():
        made = []
        for trace_id, span_id, parent_id, priority in rows:
            metrics = {"m": 1.0}
            if priority is not None:
                metrics[otel.SAMPLING_PRIORITY_KEY] = priority
            made.append({"trace_id": trace_id, "span_id": span_id, "parent_id": parent_id or 0,
                         "metrics": metrics})
        return made

    expected = otel._group_traces(dd_spans())
    got = _otel_group_traces(dd_spans(), otel.SAMPLING_PRIORITY_KEY, otel.DEFAULT_PRIORITY)
    assert repr(got) == repr(expected)


def test_c_grouping_refuses_what_is_no_dict_span():
    with pytest.raises(TypeError):
        _otel_group_traces([1], otel.SAMPLING_PRIORITY_KEY, otel.DEFAULT_PRIORITY)
    with pytest.raises(KeyError):
        _otel_group_traces([{"span_id": 1}], otel.SAMPLING_PRIORITY_KEY, otel.DEFAULT_PRIORITY)
    with pytest.raises(TypeError):
        _otel_group_traces([{"trace_id": 1, "metrics": []}], otel.SAMPLING_PRIORITY_KEY, otel.DEFAULT_PRIORITY)
    with pytest.raises(TypeError):
        _otel_group_traces((), otel.SAMPLING_PRIORITY_KEY, otel.DEFAULT_PRIORITY)


def test_a_span_context_of_another_class_is_mapped_by_python():
    """C reads the SDK's SpanContext by position and caches the SDK's
    TraceState headers; a subclass (whose properties may answer otherwise)
    or a trace state of another class has the span mapped by the rules in
    Python, which read them as properties."""
    from opentelemetry.trace import SpanContext, TraceState

    class OwnContext(SpanContext):
        @property
        def trace_id(self):
            return 99

    class OwnState(TraceState):
        def to_header(self):
            return "own=1"

    plain = make_span(trace_id=1, span_id=2, name="n")
    own_context = ReadableSpan(name="c", context=OwnContext(1, 2, False), resource=Resource({}))
    own_parent = ReadableSpan(name="p", context=plain.context, parent=OwnContext(1, 3, False),
                              resource=Resource({}))
    own_state = ReadableSpan(name="s", context=SpanContext(1, 2, False, trace_state=OwnState([("a", "b")])),
                             resource=Resource({}))
    mapped = otel._map_in_c([plain, own_context, own_parent, own_state], otel._BatchCache())
    assert [span is None for span in mapped] == [False, True, True, True]
    traces = otel.map_spans([own_context, own_state])
    assert [span["trace_id"] for trace in traces for span in trace] == [99, 1]
    assert traces[1][0]["meta"]["w3c.tracestate"] == "own=1"


def test_link_int_attributes_are_written_as_str_writes_them():
    """A link's int attributes become their decimal text: in C up to 64 bits
    of magnitude, by str() past them; the text is str()'s at every edge."""
    edges = [0, 1, -1, 9, 10, -10, 2**31, 2**63 - 1, -2**63, 2**63, 2**64 - 1, -(2**64 - 1), 2**64, -2**64,
             10**19, 10**20, -10**20, 2**200]
    context = make_span(trace_id=1, span_id=2, name="n").context
    attributes = {"i%d" % n: value for n, value in enumerate(edges)}
    span = ReadableSpan(name="ints", context=context, resource=Resource({}), links=[Link(context, attributes)])
    _both([span])
    [mapped] = otel._map_in_c([span], otel._BatchCache())
    assert mapped["links"][0]["attributes"] == {key: str(value) for key, value in attributes.items()}
