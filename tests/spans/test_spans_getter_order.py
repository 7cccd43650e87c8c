"""Spans whose fields are read by getters (Python code, which may raise,
change the trace or call the encoder), in traces long enough that any
batching of reads and writes would show: the bytes are those of the same
trace as dict spans, an error names the span and field it belongs to (the
first bad span's in trace order when several are bad, whether the bad value
is found when the span is read or when it is written), changes span code
makes to the trace are seen as they are made, an encoder keeps nothing of a
trace that failed, and nothing read is leaked.  (Pinned while trying a read
of spans ahead of their writing, docs/ddtrace.md.)"""

from __future__ import annotations

import gc
import sys
from typing import Any, Callable, Dict, List, Optional

import pytest

import spanpack

from tests.support import good_span, one_payload

VERSIONS = ("v0.4", "v0.5", "v1.0")
PATHS = ("encode_traces", "put", "encode_trace")
FIELDS = tuple(good_span())


class PropertySpan:
    """Every field a property reading a dict of values: read by calls, as
    ddtrace's native spans are.  `raise_at` names a field whose getter
    raises; `hook` runs when `name` is read."""

    __slots__ = ("values", "raise_at", "hook")

    def __init__(self, raise_at: Optional[str] = None, hook: Optional[Callable[[], Any]] = None,
                 **values: Any) -> None:
        self.values = dict(good_span(), **values)
        self.raise_at = raise_at
        self.hook = hook


def _getter(field: str) -> property:
    def get(self: PropertySpan) -> Any:
        if self.raise_at == field:
            raise ValueError("no %s here" % field)
        if field == "name" and self.hook is not None:
            self.hook()
        return self.values[field]

    return property(get)


for _field in FIELDS:
    setattr(PropertySpan, _field, _getter(_field))


def trace_of(count: int) -> List[PropertySpan]:
    return [PropertySpan(span_id=i + 1, resource="r-%d" % i, meta={"k-%d" % i: "v", "shared": "s"},
                         metrics={"m": i}) for i in range(count)]


def as_dicts(trace: List[PropertySpan]) -> List[Dict[str, Any]]:
    return [dict(span.values) for span in trace]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
def test_bytes_are_those_of_dict_spans_at_every_batch_boundary(version, path):
    for count in (1, 2, 3, 4, 5, 7, 8, 9, 12, 13):
        trace = trace_of(count)
        expected = spanpack.TraceMsgPackEncoder(version).encode_traces([as_dicts(trace), as_dicts(trace)])
        assert one_payload(spanpack.TraceMsgPackEncoder(version), path, [trace, trace]) == expected, count


def _failed(version: str, path: str, trace: List[Any]) -> BaseException:
    """The error of `trace` through `path`, after a good trace: an encoder
    left as the good trace alone leaves it."""
    good = trace_of(3)
    encoder = spanpack.TraceMsgPackEncoder(version)
    encoder.put(good)
    size = encoder.size
    with pytest.raises(Exception) as info:
        one_payload(encoder, path, [trace])
    assert (len(encoder), encoder.size) == (1, size)
    [(payload, count)] = encoder.encode()
    assert (payload, count) == (spanpack.TraceMsgPackEncoder(version).encode_traces([as_dicts(good)]), 1)
    return info.value


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
def test_a_getter_raising_is_named_by_its_span_and_field(version, path):
    for index in range(10):
        field = FIELDS[index % len(FIELDS)]
        trace = trace_of(10)
        trace[index].raise_at = field
        error = _failed(version, path, trace)
        assert type(error) is ValueError
        assert str(error) == "trace 0, span %d, %s: no %s here" % (index, field, field)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
def test_the_first_bad_span_in_trace_order_is_the_one_named(version, path):
    """A span whose value is refused when it is written, before a span whose
    getter raises when it is read (in the first four spans, or not)."""
    for bad, raising in ((0, 1), (2, 3), (3, 4), (4, 6), (1, 9)):
        trace = trace_of(10)
        trace[bad].values["meta"] = 5
        trace[raising].raise_at = "service"
        error = _failed(version, path, trace)
        assert type(error) is TypeError
        assert str(error) == "trace 0, span %d, meta: expected a dict, not int" % bad


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
def test_span_code_changing_the_trace(version, path):
    for index in (0, 3, 4, 8):  # (a change while the last span is read is not seen: it is written)
        trace = trace_of(10)
        trace[index].hook = lambda: trace.append(PropertySpan())
        error = _failed(version, path, trace)
        assert (type(error), str(error)) == (RuntimeError, "trace 0 changed size during encoding")
    # An item replaced by span code before it is read is the one written.
    trace = trace_of(10)
    swapped = PropertySpan(span_id=99, service="swapped")
    trace[1].hook = lambda: trace.__setitem__(2, swapped)
    expected = as_dicts(trace)
    expected[2] = dict(swapped.values)
    assert one_payload(spanpack.TraceMsgPackEncoder(version), path, [trace]) == (
        spanpack.TraceMsgPackEncoder(version).encode_traces([expected]))


@pytest.mark.parametrize("version", VERSIONS)
def test_a_trace_emptied_while_its_first_span_is_read_for_the_trace(version):
    """The first span's trace-level fields (trace_id) are read before the
    others: a getter that empties the trace there is seen, not read past
    (a trial read ahead that looked at trace[0] after it crashed: found in
    review)."""
    trace = trace_of(2)

    class EmptyingSpan(PropertySpan):
        __slots__ = ()

        @property
        def trace_id(self):
            trace.clear()
            return 1

    trace[0] = EmptyingSpan()
    with pytest.raises(RuntimeError, match="trace 0 changed size during encoding"):
        spanpack.TraceMsgPackEncoder(version).encode_traces([trace])


def test_values_read_before_a_failed_span_are_released():
    """The values of spans read before a span whose getter raises, or one
    whose value is refused, are given back: the references to their values
    and to the spans are where they were, after many failed traces."""
    value = "held-%d" % 7  # made at run time: its references are counted
    trace = [PropertySpan(span_id=i + 1, resource=value) for i in range(10)]
    trace[5].raise_at = "error"
    other = [PropertySpan(span_id=i + 1, resource=value) for i in range(10)]
    other[1].values["meta"] = 5
    encoders = [spanpack.TraceMsgPackEncoder(version) for version in VERSIONS]
    for encoder in encoders:  # first use: layouts resolved
        for bad in (trace, other):
            with pytest.raises((ValueError, TypeError)):
                encoder.encode_traces([bad])
    gc.collect()
    before = sys.getrefcount(value), [sys.getrefcount(span) for span in trace + other]
    for _ in range(50):
        for encoder in encoders:
            for bad in (trace, other):
                with pytest.raises((ValueError, TypeError)):
                    encoder.encode_traces([bad])
                with pytest.raises((ValueError, TypeError)):
                    encoder.put(bad)
    gc.collect()
    assert (sys.getrefcount(value), [sys.getrefcount(span) for span in trace + other]) == before
