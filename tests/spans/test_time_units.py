"""Times kept in other units: fields= maps start_ns and duration_ns to an
(attribute, unit) pair, unit "s", "ms", "us" (or "µs") or "ns", and the
encoder converts as it reads each object span (an int is multiplied, a float
rounded to the nearest nanosecond, half to even).  The reference for each
case is the same span as a dict with the nanoseconds computed here in
Python; dict spans keep the protocol's nanoseconds whatever fields= says.
"""

from __future__ import annotations

import time

import pytest

import spanpack

from tests.support import good_span, one_payload

VERSIONS = ("v0.4", "v0.5", "v1.0")
PATHS = ("encode_traces", "put", "encode_trace")
SCALE = {"s": 10**9, "ms": 10**6, "us": 10**3, "\u00b5s": 10**3, "ns": 1}


class TimedSpan:
    """A tracer author's span: times under names and units of its own."""

    __slots__ = ("trace_id", "span_id", "name", "service", "resource", "begin", "took")

    def __init__(self, begin, took, **fields):
        for name, value in good_span(**fields).items():
            if name in self.__slots__:
                setattr(self, name, value)
        self.begin = begin
        self.took = took


def nanoseconds(value, unit):
    if isinstance(value, float):
        return round(value * SCALE[unit])  # the same double product, rounded half to even
    return value * SCALE[unit]


def as_dict(span):
    return {name: getattr(span, name) for name in ("trace_id", "span_id", "name", "service", "resource")}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("start_unit, duration_unit", [("s", "ms"), ("s", "us"), ("ms", "ms"),
                                                       ("\u00b5s", "ns"), ("ns", "s")])
def test_times_in_other_units_are_written_in_nanoseconds(start_unit, duration_unit, version, path):
    now = time.time()  # a float, in seconds
    starts = {"s": now, "ms": int(now * 1000), "\u00b5s": int(now * 1e6), "ns": time.time_ns()}
    durations = {"ms": 12, "us": 12.5, "ns": 1200, "s": 0.25}
    span = TimedSpan(starts[start_unit], durations[duration_unit], span_id=7)
    fields = {"start_ns": ("begin", start_unit), "duration_ns": ("took", duration_unit)}
    encoder = spanpack.TraceMsgPackEncoder(version, fields)
    expected = dict(as_dict(span),
                    start_ns=nanoseconds(span.begin, start_unit),
                    duration_ns=nanoseconds(span.took, duration_unit))
    assert one_payload(encoder, path, [[span]]) == spanpack.TraceMsgPackEncoder(version).encode_traces([[expected]])


@pytest.mark.parametrize("version", VERSIONS)
def test_dict_spans_keep_nanoseconds(version):
    span = good_span(start_ns=1_700_000_000_000_000_000, duration_ns=5)
    encoder = spanpack.TraceMsgPackEncoder(version, {"start_ns": ("start_ns", "s"), "duration_ns": ("duration_ns", "ms")})
    assert encoder.encode_traces([[span]]) == spanpack.TraceMsgPackEncoder(version).encode_traces([[span]])


@pytest.mark.parametrize("mapping", [
    {"start_ns": ("begin", "h")}, {"start_ns": ("begin",)}, {"start_ns": ("begin", "s", "x")},
    {"name": ("name", "s")}, {"duration_ns": ("took", 1000)},
])
def test_a_unit_only_for_times_and_known(mapping):
    with pytest.raises(ValueError, match="only start_ns and duration_ns take an"):
        spanpack.TraceMsgPackEncoder("v0.4", mapping)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("bad, error, message", [
    ("soon", TypeError, "trace 0, span 0, start_ns: expected int or float, not str"),
    (float("nan"), ValueError, "trace 0, span 0, start_ns: expected a finite time, not nan"),
    (float("inf"), ValueError, "trace 0, span 0, start_ns: expected a finite time, not inf"),
])
def test_a_bad_time_is_refused_and_the_encoder_left_as_it_was(bad, error, message, version):
    fields = {"start_ns": ("begin", "s"), "duration_ns": ("took", "ms")}
    encoder = spanpack.TraceMsgPackEncoder(version, fields)
    good = TimedSpan(1.5, 2, span_id=1)
    encoder.put([good])
    size = encoder.size
    with pytest.raises(error) as raised:
        encoder.put([TimedSpan(bad, 2, span_id=2)])
    assert str(raised.value) == message
    assert (len(encoder), encoder.size) == (1, size)
    [(payload, count)] = encoder.encode()
    assert count == 1
    assert payload == spanpack.TraceMsgPackEncoder(version, fields).encode_traces([[good]])


@pytest.mark.parametrize("version", VERSIONS)
def test_times_beyond_64_bits_after_conversion_are_refused_as_any_time(version):
    fields = {"start_ns": ("begin", "s")}
    encoder = spanpack.TraceMsgPackEncoder(version, fields)
    with pytest.raises((TypeError, ValueError)) as raised:
        encoder.encode_traces([[TimedSpan(2**62, 1, span_id=3)]])  # 2**62 s is beyond 2**64 ns
    assert "start_ns" in str(raised.value)
