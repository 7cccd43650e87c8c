"""Links and events made in C (ext/otel_map.c: link_make, event_make,
items_converted) against spanpack.otel's _links and _events: the same dicts,
key order, value types and exceptions, for the SDK's forms and for inputs
built to tell them apart (contexts that are tuples but not SpanContext,
subclasses whose properties run code, attribute dicts changed while they are
converted, trace states that are not the SDK's, lists mutated while they are
iterated).  Each case builds its span twice, once for each side, so that
code run by one side cannot change what the other sees."""

from __future__ import annotations

import abc
import enum
from collections import namedtuple
from types import MappingProxyType
from typing import Any, Callable, List

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.attributes import BoundedAttributes  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import Event, EventBase, ReadableSpan  # noqa: E402
from opentelemetry.sdk.util import BoundedList  # noqa: E402
from opentelemetry.trace import Link, SpanContext, TraceFlags, TraceState  # noqa: E402

from spanpack import otel  # noqa: E402

pytestmark = pytest.mark.skipif(otel._C_PLAN_PARTS is None, reason="SPANPACK_OTEL_PYTHON is set")


def ctx(trace_id: int = 1, span_id: int = 2, state: Any = None, flags: Any = None) -> SpanContext:
    return SpanContext(trace_id, span_id, False, TraceFlags(0) if flags is None else flags,
                       TraceState() if state is None else state)


def span(links: Any = (), events: Any = ()) -> ReadableSpan:
    return ReadableSpan(name="n", context=ctx(), resource=Resource({}), links=links, events=events)


def outcome(which: str, make: Callable[[], Any]) -> Any:
    made = make()
    try:
        if which == "c":
            dd_span = otel._map_in_c([made], otel._BatchCache())[0]
        else:
            dd_span = otel._span_dict(made, otel._BatchCache())
    except Exception as error:  # noqa: BLE001 - compared below
        return ("raised", type(error), str(error))
    assert dd_span is not None
    # repr: NaN equal to itself, and the types of values (str / int / bool) told apart
    return repr([(key, dd_span.get(key)) for key in ("links", "events")]), [
        [[(key, type(value)) for key, value in item.items()] for item in dd_span.get(key) or ()]
        for key in ("links", "events")
    ]


def assert_same(make: Callable[[], Any]) -> None:
    assert outcome("c", make) == outcome("python", make)


class Color(enum.IntEnum):
    RED = 1


class Text(str):
    pass


class Digits(int):
    pass


class LoudFloat(float):
    def __repr__(self) -> str:
        return "loud"


VALUES = {
    "true": True, "false": False, "int": 5, "enum": Color.RED, "digits": Digits(7), "text": Text("t"),
    "float": 1.5, "whole": 2.0, "huge": 1e300, "nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"),
    "big": 2**70, "neg": -3, "nested": (1, (2, 3), [4]), "list": [True, None, 1.0, "q"], "none": None,
    "loud": LoudFloat(2.5), "empty": (), "bytes": b"x",
}  # fmt: skip


def test_every_value_form_of_a_link_attribute():
    assert_same(lambda: span(links=[Link(ctx(), dict(VALUES))]))


def test_every_value_form_of_an_event_attribute():
    assert_same(lambda: span(events=[Event("e", dict(VALUES), 5)]))


@pytest.mark.parametrize("flags", [TraceFlags(1), TraceFlags(0), True, Color.RED, Digits(3), 255])
def test_link_flags_of_every_int_class(flags):
    assert_same(lambda: span(links=[Link(ctx(flags=flags), {})]))


@pytest.mark.parametrize("state", ["none", "empty", "one", "two"])
def test_link_trace_states(state):
    def make():
        states = {"none": None, "empty": TraceState(), "one": TraceState([("a", "1")]),
                  "two": TraceState([("a", "1"), ("b", "2")])}
        shared = states[state]
        return span(links=[Link(SpanContext(1, 2, False, TraceFlags(0), shared), {}),
                           Link(SpanContext(1, 3, False, TraceFlags(0), shared), {}),
                           Link(SpanContext(1, 4, False, TraceFlags(0), TraceState([("c", "3")])), {})])

    assert_same(make)


@pytest.mark.parametrize("timestamp", [-1, 0, 1, 2**63, 2**70, -(2**70), True, False, 1.5, Digits(-4)])
def test_event_times(timestamp):
    assert_same(lambda: span(events=[Event("e", {"k": (1, 2)}, timestamp)]))


def test_none_and_empty_attributes():
    assert_same(lambda: span(links=[Link(ctx(), None), Link(ctx(), {})],
                             events=[Event("a", None, 1), Event("b", {}, 1)]))


def test_bounded_attributes_and_bounded_lists():
    def make():
        bounded = BoundedAttributes(maxlen=2, attributes={"a": 1, "b": (1, 2)}, immutable=False)
        bounded["c"] = "three"
        links, events = BoundedList(2), BoundedList(2)
        for i in range(3):
            links.append(Link(ctx(span_id=i + 1), bounded))
            events.append(Event("e%d" % i, bounded, i))
        return span(links=links, events=events)

    assert_same(make)


def test_odd_ids_in_a_link_context():
    assert_same(lambda: span(links=[Link(SpanContext(-1, 2**64, False, TraceFlags(0), None), {}),
                                    Link(SpanContext(2**128, Digits(3), False, TraceFlags(0), None), {})]))


CtxOtherOrder = namedtuple("CtxOtherOrder", "span_id trace_id is_remote trace_flags trace_state is_valid")


class ContextOverridingTraceId(SpanContext):
    @property
    def trace_id(self) -> int:
        return 99


class ContextOverridingGetItem(SpanContext):
    def __getitem__(self, index: Any) -> Any:
        return 77 if index == 0 else tuple.__getitem__(self, index)


class TupleWithClassFields(tuple):
    trace_id, span_id, trace_flags, trace_state = 1, 2, 0, None


@pytest.mark.parametrize("make_context", [
    lambda: CtxOtherOrder(2, 1, False, 0, None, True),
    lambda: ContextOverridingTraceId(1, 2, False),
    lambda: ContextOverridingGetItem(1, 2, False),
    lambda: TupleWithClassFields((5, 6, False, 0, None, True)),
])  # fmt: skip
def test_link_contexts_that_are_six_tuples_but_not_span_contexts(make_context):
    assert_same(lambda: span(links=[Link(make_context(), {"k": 1})]))


def test_a_link_attribute_dict_grown_by_a_values_str():
    def make():
        attributes = {}

        class Grows:
            def __str__(self) -> str:
                attributes["added"] = 1
                return "grows"

        attributes.update({"a": Grows(), "b": 1})
        return span(links=[Link(ctx(), attributes)])

    assert_same(make)


def test_a_link_attribute_dict_changed_at_the_same_size():
    def make():
        attributes = {}

        class Swaps:
            def __init__(self, old: str, new: str) -> None:
                self.old, self.new = old, new

            def __str__(self) -> str:
                if self.old in attributes:
                    del attributes[self.old]
                    attributes[self.new] = Swaps("a", "d")
                return "swaps"

        attributes.update({"a": Swaps("b", "c"), "b": 1})
        return span(links=[Link(ctx(), attributes)])

    assert_same(make)


class CountingState:
    """A trace state of another class: its truth and header asked for each link."""

    def __init__(self) -> None:
        self.truths = self.headers = 0

    def __bool__(self) -> bool:
        self.truths += 1
        return self.truths > 1

    def to_header(self) -> Any:
        self.headers += 1
        return "h%d" % self.headers


def test_a_trace_state_of_another_class_is_asked_for_each_link():
    def make():
        state = CountingState()
        return span(links=[Link(SpanContext(1, i, False, TraceFlags(0), state), {}) for i in range(1, 4)])

    assert_same(make)


class StateRaising:
    def __bool__(self) -> bool:
        raise ValueError("truth")


class StateNonStrHeader:
    def __bool__(self) -> bool:
        return True

    def to_header(self) -> Any:
        return 5


class FlagsRaising(int):
    def __int__(self) -> int:
        raise ValueError("int()")


@pytest.mark.parametrize("context", [
    lambda: SpanContext(1, 2, False, TraceFlags(0), StateRaising()),
    lambda: SpanContext(1, 2, False, TraceFlags(0), StateNonStrHeader()),
    lambda: SpanContext(1, 2, False, FlagsRaising(1), None),
])  # fmt: skip
def test_trace_states_and_flags_that_raise_or_are_odd(context):
    assert_same(lambda: span(links=[Link(context(), {})]))


def test_subclass_properties_run_once_when_a_later_item_is_of_another_form():
    """An event of a subclass whose name counts its reads, then an event with a
    float time (converted by spanpack.otel): C must not read the first event
    before handing the list over, nor hand earlier items over again."""

    def make():
        reads: List[int] = []

        class Counting(Event):
            @property
            def name(self) -> str:
                reads.append(1)
                return "n%d" % len(reads)

        class CountingLink(Link):
            @property
            def attributes(self) -> Any:
                reads.append(1)
                return {"reads": len(reads)}

        return span(links=[CountingLink(ctx(), {}), Link(ctx(), MappingProxyType({"m": 2}))],
                    events=[Counting("e", {}, 1), Event("f", {}, 1.5)])

    assert_same(make)


def test_items_that_raise():
    class LinkRaising(Link):
        @property
        def attributes(self) -> Any:
            raise KeyError("attributes")

    class EventRaising(Event):
        @property
        def timestamp(self) -> Any:
            raise KeyError("timestamp")

    assert_same(lambda: span(links=[Link(ctx(), {}), LinkRaising(ctx(), {})]))
    assert_same(lambda: span(events=[Event("e", {}, 1), EventRaising("e", {}, 1)]))


def test_lists_mutated_while_iterated():
    def growing():
        links: List[Any] = []

        class Grows(Link):
            @property
            def attributes(self) -> Any:
                if len(links) < 5:
                    links.append(Link(ctx(), {"added": len(links)}))
                return {}

        links.extend([Grows(ctx(), {}), Link(ctx(), MappingProxyType({"m": 1}))])
        return span(links=links)

    def cleared():
        links: List[Any] = []

        class Clears(Link):
            @property
            def attributes(self) -> Any:
                links.clear()
                return {}

        links.extend([Clears(ctx(), {}), Link(ctx(), {})])
        return span(links=links)

    def deque_mutated():
        bounded = BoundedList(5)

        class Appends(Event):
            @property
            def attributes(self) -> Any:
                bounded.append(Event("late", {}, 1))
                return {}

        bounded.append(Appends("e", {}, 1))
        bounded.append(Event("f", {}, 2))
        return span(events=bounded)

    for make in (growing, cleared, deque_mutated):
        assert_same(make)


def test_other_forms_mixed_with_the_sdks():
    assert_same(lambda: span(
        links=[Link(ctx(), {"a": 1}), Link(ctx(), MappingProxyType({"m": 2})), Link(ctx(), {"b": True})],
        events=[Event("a", {"t": (1,)}, 1), Event("b", MappingProxyType({"t": (2,)}), 2), Event("c", {}, -5)],
    ))  # fmt: skip


def sdk_property_calls(run: Callable[[], Any]) -> int:
    """How many times run() calls the properties of the SDK's Link and Event
    (Python functions: sys.setprofile sees each call)."""
    import sys

    watched = {prop.fget.__code__ for prop in (Link.context, Link.attributes, Event.name, Event.timestamp,
                                               Event.attributes)}  # fmt: skip
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call" and frame.f_code in watched:
            calls += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def test_sdk_links_and_events_are_read_from_their_fields_in_c():
    def make() -> Any:
        return span(links=[Link(ctx(), {"a": 1})], events=[Event("exception", {"exception.type": "E"}, 5)])

    assert sdk_property_calls(lambda: otel._span_dict(make(), otel._BatchCache())) > 0
    assert sdk_property_calls(lambda: otel._map_in_c([make()], otel._BatchCache())) == 0
    assert_same(make)


def test_replaced_sdk_properties_are_read_through(monkeypatch):
    monkeypatch.setattr(Event, "name", property(lambda self: self._name.upper()))
    monkeypatch.setattr(Link, "attributes", property(lambda self: {"replaced": True}))

    def make() -> Any:
        return span(links=[Link(ctx(), {"a": 1})], events=[Event("e", {}, 5)])

    # (the replacements are watched now: read through them, and through the others)
    assert sdk_property_calls(lambda: otel._map_in_c([make()], otel._BatchCache())) > 0
    dd_span = otel._map_in_c([make()], otel._BatchCache())[0]
    assert dd_span["events"][0]["name"] == "E"
    assert dd_span["links"][0]["attributes"] == {"replaced": "true"}
    assert_same(make)


@pytest.mark.parametrize("field", ["_name", "_timestamp", "_attributes"])
def test_an_sdk_event_without_one_of_its_fields(field):
    def make() -> Any:
        event = Event("e", {"k": 1}, 5)
        delattr(event, field)
        return span(events=[Event("first", {}, 1), event])

    outcome_c = outcome("c", make)
    assert outcome_c[0] == "raised" and outcome_c[1] is AttributeError
    assert_same(make)


class ItemsRaising:
    """Link attributes whose conversion raises (after the exception check)."""

    def items(self) -> Any:
        raise ValueError("items")


@pytest.mark.parametrize("field", ["_timestamp", "_attributes"])
def test_each_event_field_is_read_when_its_property_would_be(field):
    # the exception check reads the name only: the missing field is found
    # later, after the link's error, on both sides
    def make() -> Any:
        event = Event("e", {}, 5)
        delattr(event, field)
        return span(links=[Link(ctx(), ItemsRaising())], events=[event])

    assert outcome("c", make)[1] is ValueError
    assert_same(make)


def test_a_field_kept_by_a_class_descriptor_is_read_once_per_property_read(monkeypatch):
    reads: List[int] = []

    def make() -> Any:
        monkeypatch.delattr(Event, "_timestamp", raising=False)
        made = span(events=[Event("e", {}, 5)])
        monkeypatch.setattr(Event, "_timestamp", property(lambda self: reads.append(1) or 42), raising=False)
        return made

    counts = []
    for which in ("c", "python"):
        reads.clear()
        outcome(which, make)
        counts.append(len(reads))
    assert counts[0] == counts[1] == 1
    assert_same(make)


def test_getattribute_and_getattr_on_the_sdk_classes(monkeypatch):
    def event_getattribute(self: Any, name: str) -> Any:
        return "renamed" if name == "name" else object.__getattribute__(self, name)

    def link_getattribute(self: Any, name: str) -> Any:
        return {"x": "y"} if name == "attributes" else object.__getattribute__(self, name)

    monkeypatch.setattr(Event, "__getattribute__", event_getattribute, raising=False)
    monkeypatch.setattr(Link, "__getattribute__", link_getattribute, raising=False)
    made = otel._map_in_c([span(links=[Link(ctx(), {"a": 1})], events=[Event("e", {}, 5)])], otel._BatchCache())
    assert made[0]["events"][0]["name"] == "renamed" and made[0]["links"][0]["attributes"] == {"x": "y"}
    assert_same(lambda: span(links=[Link(ctx(), {"a": 1})], events=[Event("e", {}, 5)]))
    monkeypatch.undo()

    monkeypatch.setattr(Event, "__getattr__", lambda self, name: "from-getattr:" + name, raising=False)

    def missing_name() -> Any:
        event = Event("e", {}, 5)
        del event._name
        return span(events=[event])

    assert_same(missing_name)


class PatchesEventName:
    """An attribute value whose str() replaces Event's name property: code
    the mapping runs in the middle of a batch."""

    saved: Any = None

    def __str__(self) -> str:
        if PatchesEventName.saved is None:
            PatchesEventName.saved = EventBase.__dict__["name"]
            EventBase.name = property(lambda self: self._name.upper())
        return "p"


def test_a_property_replaced_in_the_middle_of_a_batch():
    def make() -> List[Any]:
        first = ReadableSpan(name="a", context=ctx(), resource=Resource({}), events=[Event("e", {}, 5)],
                             attributes={"k": PatchesEventName()})
        return [first, ReadableSpan(name="b", context=ctx(), resource=Resource({}), events=[Event("f", {}, 5)])]

    outcomes = []
    for which in ("c", "python"):
        PatchesEventName.saved = None
        spans = make()
        try:
            if which == "c":
                made = otel._map_in_c(spans, otel._BatchCache())
            else:
                made = [otel._span_dict(one, otel._BatchCache()) for one in spans]
        finally:
            if PatchesEventName.saved is not None:
                EventBase.name = PatchesEventName.saved
        outcomes.append([dd_span["events"] for dd_span in made])
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][1][0]["name"] == "F"  # the second span's event, read through the new property


class Bare(abc.ABC):  # (the SDK's classes are ABCs: the same layout)
    pass


def test_instances_whose_dict_or_class_was_replaced():
    def replaced_dicts() -> Any:
        event = Event("e", {"a": 1}, 5)
        event.__dict__ = {"_timestamp": 9, "_attributes": None, "_name": "exception"}
        link = Link(ctx(), {"a": 1})
        link.__dict__ = {"_attributes": {"b": 2}, "_context": ctx(3, 4)}
        return span(links=[link], events=[event])

    def switched_classes() -> Any:
        event, link = Bare(), Bare()
        event.extra, event._attributes, event._timestamp, event._name = 1, {"a": 1}, 7, "x"
        event.__class__ = Event
        link._attributes = {"a": 1}  # no _context
        link.__class__ = Link
        return span(links=[link], events=[event])

    assert_same(replaced_dicts)
    assert_same(switched_classes)


def test_event_names_that_are_not_str():
    class RaisesOnEq:
        def __eq__(self, other: Any) -> bool:
            raise ValueError("eq")

        __hash__ = None  # type: ignore[assignment]

    class EqualToAll(str):
        def __eq__(self, other: Any) -> bool:
            return True

        __hash__ = str.__hash__

    for name in (RaisesOnEq(), EqualToAll("other"), 7):
        def make(name: Any = name) -> Any:
            event = Event("e", {}, 5)
            event._name = name
            return span(events=[event])

        assert_same(make)


def test_no_reference_kept_or_lost_by_field_reads():
    import sys

    event = Event("exception", {"exception.type": "E"}, 5)
    link = Link(ctx(), {"a": 1})
    made = span(links=[link], events=[event])
    fields = [event._name, event._timestamp, event._attributes, link._context, link._attributes]
    before = [sys.getrefcount(field) for field in fields]
    for _ in range(100):
        otel._map_in_c([made], otel._BatchCache())
    assert [sys.getrefcount(field) for field in fields] == before
