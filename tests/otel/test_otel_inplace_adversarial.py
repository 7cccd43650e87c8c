"""Adversarial cases for ext/otel_map.c's in-place field reads
(InPlaceFields: inplace_find / inplace_values / inplace_read): whatever the
C mapper reads must be what PyObject_GetAttr would give at that moment, and
nothing it does may leak, crash or leave an error set."""

from __future__ import annotations

import gc
import sys
from typing import Any, List

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, Status, StatusCode  # noqa: E402

from spanpack import otel  # noqa: E402
from tests.otel.spans import make_span  # noqa: E402

pytestmark = pytest.mark.skipif(otel._C_PLAN_PARTS is None, reason="SPANPACK_OTEL_PYTHON is set")

CONTEXT = make_span(trace_id=1, span_id=2, name="n").context
HOOKED_EVENT = ("e", 1.5, [])  # a float time: converted by spanpack.otel, not in C


def _new(cls: type, name: str, **kw: Any) -> Any:
    kw.setdefault("resource", Resource({}))
    kw.setdefault("attributes", {})
    return cls(name=name, context=CONTEXT, **kw)


def _map(spans: List[Any]) -> List[Any]:
    return otel._map_in_c(spans, otel._BatchCache())


def _with_events_hook(monkeypatch: Any, hook: Any) -> None:
    """Run `hook(events)` whenever spanpack.otel's converter makes a span's
    events (mid-batch): C hands it the events of forms it does not make itself,
    such as a float time (HOOKED_EVENT)."""

    def events(evts: Any) -> Any:
        hook(evts)
        return otel._events(evts)

    monkeypatch.setattr(otel, "_C_PLAN_PARTS", otel._C_PLAN_PARTS[:-1] + (events,))


def _sdk_spans(n: int = 3, system: Any = "PostgreSQL") -> List[Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("lib", "2")
    for i in range(n):
        with tracer.start_as_current_span("q%d" % i, kind=SpanKind.CLIENT,
                                          attributes={"db.system": system, "n": i}) as span:
            span.add_event("e%d" % i, {"k": i})
            span.set_status(Status(StatusCode.ERROR, "d%d" % i))
    provider.shutdown()
    return list(memory.get_finished_spans())


# -- the class cache must notice every change that alters what the lookup answers


def test_a_descriptor_class_that_gains_set_mid_batch(monkeypatch):
    """A non-data descriptor on the class (the instance wins) whose own class
    gains __set__ mid-batch becomes a data descriptor (it wins over the
    instance) without the span class's version tag changing."""

    class Desc:
        def __get__(self, obj, owner=None):
            return "descriptor"

    class Sub(ReadableSpan):
        _name = Desc()

    def hook(_events):
        Desc.__set__ = lambda self, obj, value: None

    _with_events_hook(monkeypatch, hook)
    spans = [_new(Sub, "span-0", events=[]), _new(Sub, "span-1")]
    spans[0]._events = (make_span(trace_id=1, span_id=3, name="n", events=[HOOKED_EVENT]).events)
    mapped = _map(spans)
    assert mapped[0]["resource"] == "span-0"
    assert spans[1]._name == "descriptor"  # what PyObject_GetAttr answers now
    assert mapped[1]["resource"] == "descriptor"


def test_a_class_attribute_whose_class_becomes_a_data_descriptor(monkeypatch):
    """The same with a plain class attribute (no __get__ at first)."""

    class Plain:
        pass

    class Sub(ReadableSpan):
        _name = Plain()

    def hook(_events):
        Plain.__get__ = lambda self, obj, owner=None: "descriptor"
        Plain.__set__ = lambda self, obj, value: None

    _with_events_hook(monkeypatch, hook)
    spans = [_new(Sub, "span-0"), _new(Sub, "span-1")]
    spans[0]._events = make_span(trace_id=1, span_id=3, name="n", events=[HOOKED_EVENT]).events
    mapped = _map(spans)
    assert spans[1]._name == "descriptor"
    assert mapped[1]["resource"] == "descriptor"


def test_a_class_changed_while_its_fields_are_looked_up():
    """A key in the class __dict__ whose __eq__ runs while inplace_find looks
    a later name up (same hash) and there makes an earlier one a property:
    the class's tag, read after every lookup, is then the changed class's,
    and the earlier name's stale position is taken as current for the next
    span."""
    armed = []

    class Key:
        def __hash__(self):
            return hash("_end_time")

        def __eq__(self, other):
            if armed and armed.pop():
                Sub._name = property(lambda self: "descriptor")
            return False

    with pytest.warns(RuntimeWarning) if sys.version_info >= (3, 13) else _nothing():
        Sub = type("Sub", (ReadableSpan,), {Key(): None})
    spans = [_new(Sub, "own-0"), _new(Sub, "own-1")]
    Sub.unrelated = 1  # a new tag: the lookups below miss the type cache
    armed.append(True)
    mapped = _map(spans)
    # (the first span's _name may be read before the change, as GetAttr would)
    assert spans[1]._name == "descriptor"
    assert mapped[1]["resource"] == "descriptor"


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# -- code run by a generic read changes the instance under the reader


def _shadowed(field: str, action: Any) -> type:
    """A ReadableSpan subclass with a data descriptor on `field` (read
    generically) whose getter first runs `action(self)`."""

    def get(self):
        action(self)
        return self.__dict__.get("_shadow_" + field)

    def set_(self, value):
        self.__dict__["_shadow_" + field] = value

    return type("Shadowed", (ReadableSpan,), {field: property(get, set_)})


@pytest.mark.parametrize("field", ["_context", "_attributes", "_resource", "_kind"])
def test_a_getter_that_replaces_the_instance_dict(field):
    def swap(self):
        if self.__dict__.get("_swapped"):
            return
        new = dict(vars(self))
        new["_name"] = "swapped"
        new["_swapped"] = True
        self.__dict__ = new  # the old values array freed
        gc.collect()

    cls = _shadowed(field, swap)
    spans = [_new(cls, "own-%d" % i) for i in range(3)]
    mapped = _map(spans)
    assert [s["resource"] for s in mapped] == ["swapped"] * 3


@pytest.mark.parametrize("field", ["_context", "_attributes"])
def test_a_getter_that_deletes_a_later_field(field):
    def drop(self):
        self.__dict__.pop("_events", None)

    cls = _shadowed(field, drop)
    mapped = _map([_new(cls, "own")])
    assert mapped == [None]  # AttributeError on _events: Python maps it


@pytest.mark.parametrize("field", ["_context", "_attributes"])
def test_a_getter_that_switches_the_class(field):
    class Other(ReadableSpan):
        @property
        def _name(self):
            return "other-class"

        @_name.setter
        def _name(self, value):
            pass

    def switch(self):
        if type(self) is not Other:
            self.__class__ = Other

    cls = _shadowed(field, switch)
    # Other's _name property is a data descriptor: it wins from now on.
    spans = [_new(cls, "own-0"), _new(cls, "own-1")]
    mapped = _map(spans)
    assert [s["resource"] for s in mapped] == ["other-class", "other-class"]


def test_a_getter_that_raises_something_else():
    def boom(self):
        raise ValueError("boom")

    cls = _shadowed("_resource", boom)
    with pytest.raises(ValueError):
        _map([_new(cls, "own")])
    # nothing left set
    assert _map([make_span(trace_id=1, span_id=2, name="after")])[0]["resource"] == "after"


def test_a_getter_that_raises_attribute_error():
    def missing(self):
        raise AttributeError("gone")

    cls = _shadowed("_status", missing)
    assert _map([_new(cls, "own")]) == [None]
    assert _map([make_span(trace_id=1, span_id=2, name="after")])[0]["resource"] == "after"


# -- class and instance shapes


def test_slots_getattr_and_getattribute():
    class Slotted(ReadableSpan):
        __slots__ = ("_name",)

    class Fallback(ReadableSpan):
        def __getattr__(self, name):
            return "fallback" if name == "_name" else super().__getattribute__(name)

    class Intercepting(ReadableSpan):
        def __getattribute__(self, name):
            if name == "_name":
                return "intercepted"
            return super().__getattribute__(name)

    fallback = _new(Fallback, "own")
    del fallback._name
    spans = [_new(Slotted, "slotted"), fallback, _new(Intercepting, "own")]
    # a class that looks attributes up its own way is handed back to the
    # rules in Python, which read it through its properties
    assert [dd_span is None for dd_span in _map(spans)] == [False, True, True]
    mapped = [dd_span for trace in otel.map_spans(spans) for dd_span in trace]
    assert [s["resource"] for s in mapped] == ["slotted", "fallback", "intercepted"]


def test_class_attribute_and_non_data_descriptor_under_deleted_fields():
    class Defaults(ReadableSpan):
        _name = "class-default"

    class Method(ReadableSpan):
        def _name(self):  # a non-data descriptor: the instance wins while it has one
            return "method"

    a, b, c = _new(Defaults, "own"), _new(Defaults, "own"), _new(Method, "own")
    del b._name
    mapped = _map([a, b, c])
    assert [s["resource"] for s in mapped[:2]] == ["own", "class-default"]
    assert mapped[2]["resource"] == "own"


def test_dict_shapes():
    spans = [_new(ReadableSpan, "s%d" % i) for i in range(6)]
    vars(spans[0])
    spans[1].__dict__ = dict(vars(spans[1]))  # combined
    spans[2].__dict__ = spans[3].__dict__  # shared split dict
    spans[4].__dict__ = vars(spans[4]).copy()  # a split copy
    for i in range(40):
        setattr(spans[5], "x%d" % i, i)  # beyond the shared keys
    mapped = _map(spans)
    assert [s["resource"] for s in mapped] == ["s0", "s1", "s3", "s3", "s4", "s5"]


def test_status_and_lists_of_other_shapes():
    spans = _sdk_spans(4)
    spans[0]._status = Status(StatusCode.OK)
    del spans[1]._status._description
    vars(spans[2]._events)
    spans[3]._attributes.__dict__ = dict(vars(spans[3]._attributes))
    mapped = _map(spans)
    assert mapped[0]["error"] == 0
    assert mapped[1] is None  # AttributeError on _description: Python maps it
    assert mapped[2]["name"] == mapped[3]["name"] == "postgresql.query"


# -- no references kept or lost


def test_no_reference_leaks():
    spans = _sdk_spans(5, system="MySQL")

    class Sub(ReadableSpan):
        pass

    spans.append(_new(Sub, "own", attributes={"db.system": "Redis"}, kind=SpanKind.CLIENT))
    watched = [spans[0]._name, spans[0]._attributes, spans[0]._attributes._dict, spans[0]._events._dq,
               spans[0]._status, spans[0]._status._status_code, spans[0]._status._description,
               spans[0]._attributes["db.system"], Sub, type(spans[0]), type(spans[0]._status),
               type(spans[0]._attributes), type(spans[0]._events)]
    _map(spans)
    gc.collect()
    before = [sys.getrefcount(o) for o in watched]
    for _ in range(200):
        _map(spans)
    gc.collect()
    assert [sys.getrefcount(o) for o in watched] == before


def test_lowered_cache_per_format():
    """The same str object lowered for two formats (client and server rpc)."""
    text = "GRPC"
    client = _new(ReadableSpan, "a", kind=SpanKind.CLIENT, attributes={"rpc.system": text})
    server = _new(ReadableSpan, "b", kind=SpanKind.SERVER, attributes={"rpc.system": text})
    mapped = _map([client, server, client])
    assert [s["name"] for s in mapped] == ["grpc.client.request", "grpc.server.request", "grpc.client.request"]


@pytest.mark.parametrize("change", ["clear", "append", "replace"])
def test_the_batch_list_changed_by_code_run_mid_batch(monkeypatch, change):
    """Code run while a span is mapped (here spanpack.otel's events converter)
    may change the list of spans being mapped: a changed length is refused
    with RuntimeError, never read past; an item replaced in place is mapped
    as it is then."""
    spans = [_new(ReadableSpan, "span-%d" % i) for i in range(40)]
    spans[0]._events = make_span(trace_id=1, span_id=3, name="n", events=[HOOKED_EVENT]).events
    replacement = _new(ReadableSpan, "replacement")

    def hook(_events):
        if change == "clear":
            spans.clear()
        elif change == "append":
            spans.append(replacement)
        else:
            spans[1] = replacement

    _with_events_hook(monkeypatch, hook)
    if change == "replace":
        mapped = _map(spans)
        assert mapped[1]["resource"] == "replacement"
        assert [m["resource"] for m in mapped[2:]] == ["span-%d" % i for i in range(2, 40)]
    else:
        with pytest.raises(RuntimeError, match="changed size"):
            _map(spans)
