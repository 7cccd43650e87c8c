"""The buffered side of TraceMsgPackEncoder: put() / encode() / size and the limits.

The reference for every byte is the one-shot ``encode_traces``: putting
traces T1..Tn and calling encode() must give exactly ``encode_traces([T1..Tn])``
when nothing is split, and the size a put() adds (the value BufferFull and
BufferItemTooLarge carry in ``args[0]``) is the growth of that one-shot payload.
"""

from __future__ import annotations

import gc
import os
import threading
import tracemalloc

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spanpack
from spanpack import BufferFull, BufferItemTooLarge, TraceMsgPackEncoder

from tests.support import CORE_FIELDS, good_span, memory_grown, resolved_traces

VERSIONS = ["v0.4", "v0.5"]
EMPTY_SIZE = {"v0.4": 1, "v0.5": 15}


# ---------------------------------------------------------------------------
# Helpers


def make_span(trace_id, span_id, **fields):
    """good_span with these ids, times from the span id and plain names."""
    defaults = {"service": "svc", "name": "op", "resource": "res",
                "start_ns": 1_700_000_000_000_000_000 + span_id, "duration_ns": 1000 + span_id}
    return good_span(trace_id=trace_id, span_id=span_id, **dict(defaults, **fields))


def make_trace(i, spans=1, pad=0, tag=""):
    """Trace number i: its own trace id and some strings only it uses (new
    v0.5 table entries), some shared with every other trace."""
    trace = []
    for s in range(spans):
        trace.append(
            make_span(
                1000 + i,
                (i << 8) + s + 1,
                parent_id=None if s == 0 else (i << 8) + 1,
                service="svc-%d" % (i % 3),
                resource="res-%d-%d%s" % (i, s, tag) + "x" * pad,
                meta={"shared": "v", "own.%d" % i: "value-%d-%d" % (i, s)},
                metrics={"m": i, "f": i / 3.0},
            )
        )
    return trace


def enc(version, **kwargs):
    return TraceMsgPackEncoder(version, **kwargs)


def one_shot(version, traces):
    return enc(version).encode_traces(traces)


def growth(version, accepted, trace):
    """Bytes `trace` adds to a buffer holding `accepted` (no splitting)."""
    return len(one_shot(version, accepted + [trace])) - len(one_shot(version, accepted))


def unpack(payload):
    return msgpack.unpackb(payload, strict_map_key=False)


def total_len(payloads):
    return sum(len(p) for p, _ in payloads)


class Span:
    """A span object whose field access can be made to fail."""

    FIELDS = CORE_FIELDS

    def __init__(self, fail_on=None, exc=RuntimeError, **fields):
        self._fields = make_span(fields.pop("trace_id"), fields.pop("span_id"), **fields)
        self._fail_on = fail_on
        self._exc = exc

    def _get(self, name):
        if name == self._fail_on:
            raise self._exc("span property failed")  # a new exception each time
        return self._fields[name]


for _name in Span.FIELDS:
    setattr(Span, _name, property(lambda self, _n=_name: self._get(_n)))


def same_state(a, b):
    """a and b buffer the same payloads (encode() empties both)."""
    assert a.size == b.size
    assert len(a) == len(b)
    out_a, out_b = a.encode(), b.encode()
    assert out_a == out_b
    return out_a


# ---------------------------------------------------------------------------
# Empty encoder, attributes


@pytest.mark.parametrize("version", VERSIONS)
def test_empty_encoder(version):
    e = enc(version)
    assert len(e) == 0
    assert e.size == EMPTY_SIZE[version] == len(one_shot(version, []))
    assert e.encode() == []
    assert e.encode() == []
    assert e.size == EMPTY_SIZE[version]
    e.put(make_trace(1))
    assert e.encode() != []
    assert e.encode() == []
    assert len(e) == 0 and e.size == EMPTY_SIZE[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_attributes_and_headers(version):
    e = enc(version)
    assert e.content_type == "application/msgpack"
    assert e.endpoint == "/%s/traces" % version
    assert e.max_size == 20 * 1024 * 1024
    assert e.max_item_size == e.max_size
    assert e.max_payload_size is None  # no splitting, as max_payload_size=None asks
    assert enc(version, max_payload_size=None).max_payload_size is None
    assert enc(version, max_size=100, max_item_size=1000).max_item_size == 100
    assert enc(version, max_size=1000, max_item_size=100).max_item_size == 100
    assert enc(version, max_payload_size=500).max_payload_size == 500
    # What the limits read back, the constructor takes, for the same encoder.
    copy = enc(version, max_size=e.max_size, max_item_size=e.max_item_size, max_payload_size=e.max_payload_size)
    assert (copy.max_size, copy.max_item_size, copy.max_payload_size) == (e.max_size, e.max_item_size, None)
    for name in ("max_size", "max_item_size", "max_payload_size"):
        with pytest.raises(ValueError, match="%s must be positive, not 0" % name):
            enc(version, **{name: 0})
        with pytest.raises(AttributeError):
            setattr(e, name, 1000)
    h = e.headers(7)
    assert h["Content-Type"] == "application/msgpack"
    assert h["X-Datadog-Trace-Count"] == "7"
    for key in (
        "Datadog-Meta-Lang",
        "Datadog-Meta-Lang-Version",
        "Datadog-Meta-Lang-Interpreter",
        "Datadog-Meta-Tracer-Version",
    ):
        assert h[key]
    assert h == spanpack.payload_headers(7)


# ---------------------------------------------------------------------------
# put + encode == encode_traces; size is exact at every step


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("count", [0, 1, 15, 16, 17])
def test_put_encode_matches_one_shot(version, count):
    traces = [make_trace(i, spans=1 + i % 3) for i in range(count)]
    e = enc(version)
    assert e.size == len(one_shot(version, []))
    for k, trace in enumerate(traces, 1):
        e.put(trace)
        assert len(e) == k
        assert e.size == len(one_shot(version, traces[:k]))
    out = e.encode()
    if count == 0:
        assert out == []
        return
    assert out == [(one_shot(version, traces), count)]
    assert type(out) is list and type(out[0]) is tuple
    assert type(out[0][0]) is bytes and type(out[0][1]) is int
    assert e.size == EMPTY_SIZE[version]
    assert len(resolved_traces(version, out[0][0])) == count


@pytest.mark.parametrize("version", VERSIONS)
def test_first_trace_of_every_payload_cycle_matches_one_shot(version):
    """v0.5 put() of the first trace into an empty buffer makes that trace's
    own string table and body the payload's (no copy); the table and body it
    gives the encoder back serve the next traces.  Cycles of put() and
    encode() with first traces of every size (a failed one before, traces
    after it, a payload split after it) give the one-shot bytes each time,
    and the strings of earlier cycles stay out of later payloads."""
    firsts = [make_trace(100 + cycle, spans=spans, tag="c%d" % cycle)
              for cycle, spans in enumerate([40, 1, 25, 3, 40, 2])]
    e = enc(version, max_payload_size=max(len(one_shot(version, [t])) for t in firsts) + 64)
    splits = 0
    for cycle, first in enumerate(firsts):
        with pytest.raises(TypeError):
            e.put([make_span(5, 1, meta={"k": 1})])  # refused before anything is joined
        e.put(first)
        assert e.size == len(one_shot(version, [first]))
        after = [make_trace(200 + 10 * cycle + k, spans=2) for k in range(cycle % 3)]
        for trace in after:
            e.put(trace)
        payloads = e.encode()
        joined = [first] + after
        if len(payloads) == 1:
            assert payloads == [(one_shot(version, joined), len(joined))]
        else:  # the first trace filled a payload of its own
            assert payloads == [(one_shot(version, [first]), 1), (one_shot(version, after), len(after))]
            splits += 1
        if version == "v0.5":
            table = unpack(payloads[0][0])[0]
            assert not any(text.endswith("c%d" % (cycle - 1)) for text in table if cycle)
    assert splits >= 1


@pytest.mark.parametrize("version", VERSIONS)
def test_size_is_len_of_encode_at_every_step(version):
    """One encoder, many put/encode cycles: before each encode() the size is
    the real length of what it returns."""
    e = enc(version)
    n = 0
    for cycle, batch in enumerate([0, 1, 15, 16, 17, 2, 0, 31, 32, 33]):
        traces = [make_trace(n + i, spans=1 + (n + i) % 2) for i in range(batch)]
        n += batch
        for trace in traces:
            e.put(trace)
        size = e.size
        out = e.encode()
        assert size == (total_len(out) if out else EMPTY_SIZE[version]), cycle
        if batch:
            assert out == [(one_shot(version, traces), batch)]


@pytest.mark.parametrize("version", VERSIONS)
def test_trace_count_header_sizes_at_65536(version):
    """The outer array header goes from array16 to array32 at 65,536 traces
    (the reference tracer's size computation got this wrong)."""
    span = make_span(1, 2)
    traces = [[span]] * 65537
    e = enc(version)
    for k, trace in enumerate(traces, 1):
        e.put(trace)
        if k in (15, 16, 65535, 65536, 65537):
            assert e.size == len(one_shot(version, traces[:k])), k
    size = e.size
    [(payload, count)] = e.encode()
    assert count == 65537 and len(payload) == size
    assert payload == one_shot(version, traces)
    decoded = unpack(payload)
    assert len(decoded if version == "v0.4" else decoded[1]) == 65537


@pytest.mark.parametrize("entries", [15, 16, 17, 65535, 65536, 65537])
def test_v05_string_table_header_sizes(entries):
    # seeds "" and "_dd.origin", then "n", then one new string per meta key
    meta = {"k%d" % i: "" for i in range(entries - 3)}
    trace = [make_span(1, 2, service="", name="n", resource="", meta=meta)]
    e = enc("v0.5")
    e.put(trace)
    size = e.size
    [(payload, count)] = e.encode()
    assert len(payload) == size == len(one_shot("v0.5", [trace]))
    table, traces = unpack(payload)
    assert len(table) == entries
    assert traces[0][0][9] == {i + 3: 0 for i in range(entries - 3)}


# ---------------------------------------------------------------------------
# BufferFull


@pytest.mark.parametrize("version", VERSIONS)
def test_buffer_full_repeatedly_and_accepted_traces_survive(version):
    traces = [make_trace(i, spans=2) for i in range(40)]
    max_size = len(one_shot(version, traces[:10])) + 40
    e = enc(version, max_size=max_size)
    accepted = []
    for t in traces[:10]:
        e.put(t)
        accepted.append(t)
    rejected = 0
    # (a big trace still within max_size, so BufferFull and not BufferItemTooLarge)
    for t in traces[10:] + [make_trace(99, pad=max_size // 2)] * 3:
        expected = growth(version, accepted, t)
        if len(one_shot(version, accepted + [t])) <= max_size:
            e.put(t)
            accepted.append(t)
            continue
        before = e.size
        with pytest.raises(BufferFull) as info:
            e.put(t)
        assert type(info.value) is BufferFull
        assert info.value.args == (expected,)
        assert e.size == before and len(e) == len(accepted)
        rejected += 1
    assert rejected >= 30
    assert e.size <= max_size
    assert e.encode() == [(one_shot(version, accepted), len(accepted))]
    # usable again after encode()
    e.put(traces[0])
    assert e.encode() == [(one_shot(version, traces[:1]), 1)]


@pytest.mark.parametrize("version", VERSIONS)
def test_exact_max_size_fits(version):
    traces = [make_trace(i) for i in range(5)]
    limit = len(one_shot(version, traces))
    e = enc(version, max_size=limit)
    for t in traces:
        e.put(t)
    assert e.size == limit == e.max_size
    with pytest.raises(BufferFull) as info:
        e.put([])  # even an empty trace adds a byte
    assert info.value.args == (1,)
    assert e.encode() == [(one_shot(version, traces), 5)]

    e = enc(version, max_size=limit - 1)
    for t in traces[:-1]:
        e.put(t)
    with pytest.raises(BufferFull) as info:
        e.put(traces[-1])
    assert info.value.args == (growth(version, traces[:-1], traces[-1]),)
    assert e.encode() == [(one_shot(version, traces[:-1]), 4)]


def test_v05_buffer_full_size_counts_new_string_table_entries():
    prefix = [make_trace(i) for i in range(3)]
    known = [make_span(1000, 77, service="svc-0", name="op", resource="res-0-0",
                       meta={"shared": "v"}, metrics={"m": 0})]
    fresh = [make_span(1000, 77, service="brand-new-service", name="op", resource="res-0-0",
                       meta={"shared": "v"}, metrics={"m": 0})]
    g_known = growth("v0.5", prefix, known)
    g_fresh = growth("v0.5", prefix, fresh)
    # same span bytes except one index, plus a new table entry of 18 bytes
    assert g_fresh == g_known + 18
    for trace, expected in ((known, g_known), (fresh, g_fresh)):
        e = enc("v0.5", max_size=len(one_shot("v0.5", prefix)))
        for t in prefix:
            e.put(t)
        with pytest.raises(BufferFull) as info:
            e.put(trace)
        assert info.value.args == (expected,)
        assert e.encode() == [(one_shot("v0.5", prefix), 3)]


# ---------------------------------------------------------------------------
# BufferItemTooLarge


@pytest.mark.parametrize("version", VERSIONS)
def test_buffer_item_too_large(version):
    prefix = [make_trace(i) for i in range(3)]
    big = make_trace(50, spans=3, pad=200)
    g = growth(version, prefix, big)
    # exactly max_item_size fits
    e = enc(version, max_item_size=g)
    for t in prefix:
        e.put(t)
    e.put(big)
    assert e.encode() == [(one_shot(version, prefix + [big]), 4)]
    # one byte less does not, and it can be retried any number of times
    e = enc(version, max_item_size=g - 1)
    for t in prefix:
        e.put(t)
    for _ in range(3):
        with pytest.raises(BufferItemTooLarge) as info:
            e.put(big)
        assert type(info.value) is BufferItemTooLarge
        assert info.value.args == (g,)
        assert (info.value.limit_name, info.value.limit) == ("max_item_size", g - 1)
        assert str(info.value) == "trace of %d bytes is over max_item_size=%d" % (g, g - 1)
        assert e.size == len(one_shot(version, prefix)) and len(e) == 3
    e.put(prefix[0])
    assert e.encode() == [(one_shot(version, prefix + prefix[:1]), 4)]


@pytest.mark.parametrize("version", VERSIONS)
def test_item_too_large_wins_over_buffer_full(version):
    big = make_trace(1, pad=500)
    g = growth(version, [], big)
    e = enc(version, max_size=g // 2, max_item_size=g // 4)
    with pytest.raises(BufferItemTooLarge) as info:
        e.put(big)
    assert info.value.args == (g,)
    # larger than the whole buffer: max_item_size defaults to (and is capped
    # at) max_size, so this is an item too large, not a full buffer
    e = enc(version, max_size=g - 1)
    with pytest.raises(BufferItemTooLarge):
        e.put(big)
    # an item within max_item_size that does not fit next to what is buffered
    e = enc(version, max_size=g + 10, max_item_size=g)
    e.put(make_trace(2))
    buffered = e.size
    with pytest.raises(BufferFull) as info:
        e.put(big)
    g2 = growth(version, [make_trace(2)], big)
    assert info.value.args == (g2,)
    assert (info.value.limit_name, info.value.limit) == ("max_size", g + 10)
    assert str(info.value) == "trace of %d bytes does not fit: %d bytes buffered, max_size=%d" % (
        g2, buffered, g + 10)


def test_limit_errors_made_by_hand_print_like_plain_exceptions():
    """Raised by the encoder, str() names the limit; made elsewhere (a test
    double, a re-raise), they print their args like any exception."""
    assert str(BufferFull(205)) == "205"
    assert str(BufferItemTooLarge()) == ""
    assert str(BufferFull(1, "two")) == "(1, 'two')"
    error = BufferFull(7)
    error._message = None  # not a str: ignored
    assert str(error) == "7"
    assert issubclass(BufferFull, Exception) and issubclass(BufferItemTooLarge, Exception)


@pytest.mark.parametrize("version", VERSIONS)
def test_trace_larger_than_max_payload_size_alone(version):
    big = make_trace(1, spans=4, pad=300)
    alone = len(one_shot(version, [big]))
    e = enc(version, max_payload_size=alone - 1)
    with pytest.raises(BufferItemTooLarge) as info:
        e.put(big)
    assert info.value.args[0] >= alone - EMPTY_SIZE[version]
    assert (info.value.limit_name, info.value.limit) == ("max_payload_size", alone - 1)
    assert str(info.value) == "trace of %d bytes makes a payload of %d bytes on its own, over max_payload_size=%d" % (
        info.value.args[0], alone, alone - 1)
    assert e.size == EMPTY_SIZE[version] and len(e) == 0
    assert e.encode() == []
    # exactly max_payload_size fits
    e = enc(version, max_payload_size=alone)
    e.put(big)
    assert e.size == alone
    assert e.encode() == [(one_shot(version, [big]), 1)]


# ---------------------------------------------------------------------------
# Splitting into several payloads


def check_split(version, payloads, traces, limit):
    assert len(payloads) > 1
    everything = []
    for i, (payload, count) in enumerate(payloads):
        assert len(payload) <= limit
        resolved = resolved_traces(version, payload)
        assert len(resolved) == count > 0
        everything.extend(resolved)
    # every trace exactly once, in put order
    assert everything == resolved_traces(version, one_shot(version, traces))
    # each payload stands alone (v0.5: with its own string table)
    n = 0
    for i, (payload, count) in enumerate(payloads):
        group = traces[n : n + count]
        assert payload == one_shot(version, group)
        n += count
        if i + 1 < len(payloads):
            # a payload is only closed when the next trace does not fit
            assert len(one_shot(version, group + [traces[n]])) > limit
    assert n == len(traces)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("limit", [900, 1500, 4096])
def test_split_payloads(version, limit):
    traces = [make_trace(i, spans=1 + i % 3, pad=(i * 37) % 120) for i in range(150)]
    assert max(len(one_shot(version, [t])) for t in traces) <= limit
    e = enc(version, max_payload_size=limit)
    for t in traces:
        e.put(t)
    assert len(e) == len(traces)
    size = e.size
    payloads = e.encode()
    assert size == total_len(payloads)
    check_split(version, payloads, traces, limit)
    assert e.encode() == [] and e.size == EMPTY_SIZE[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_split_size_exact_after_every_put(version):
    traces = [make_trace(i, spans=1 + i % 2, pad=i % 50) for i in range(60)]
    limit = 700
    for k in range(len(traces) + 1):
        e = enc(version, max_payload_size=limit)
        for t in traces[:k]:
            e.put(t)
        size = e.size
        out = e.encode()
        assert size == (total_len(out) if out else EMPTY_SIZE[version]), k
        assert sum(c for _, c in out) == k


@pytest.mark.parametrize("version", VERSIONS)
def test_split_payload_boundary_is_inclusive(version):
    traces = [make_trace(i) for i in range(12)]
    limit = len(one_shot(version, traces[:5]))
    e = enc(version, max_payload_size=limit)
    for t in traces:
        e.put(t)
    payloads = e.encode()
    assert payloads[0] == (one_shot(version, traces[:5]), 5)
    assert len(payloads[0][0]) == limit
    check_split(version, payloads, traces, limit)


@pytest.mark.parametrize("version", VERSIONS)
def test_split_with_buffer_full(version):
    traces = [make_trace(i, spans=2) for i in range(100)]
    limit = 800
    e = enc(version, max_payload_size=limit, max_size=5000)
    accepted = []
    full = 0
    for t in traces:
        size_before_failure = e.size
        try:
            e.put(t)
        except BufferFull:
            full += 1
            break
        accepted.append(t)
        assert e.size <= 5000
    assert full == 1
    payloads = e.encode()
    # (the size after the rejected put is covered by the rollback tests)
    assert total_len(payloads) == size_before_failure <= 5000
    check_split(version, payloads, accepted, limit)


# ---------------------------------------------------------------------------
# A failed put leaves the encoder exactly as it was


def _limits_for(version, prefix, suffix, kind):
    if kind == "buffer_full":
        return {"max_size": len(one_shot(version, prefix + suffix))}
    if kind == "item_too_large":
        biggest = max(growth(version, prefix[:i], t) for i, t in enumerate(prefix))
        acc = list(prefix)
        for t in suffix:
            biggest = max(biggest, growth(version, acc, t))
            acc.append(t)
        return {"max_item_size": biggest}
    return {}


def _failing_trace(kind, i):
    """A trace whose LAST span fails after earlier spans added new strings."""
    spans = [
        make_span(
            5000 + i,
            s + 1,
            service="failing-svc-%d" % s,
            resource="failing-resource-%d" % s,
            meta={"failing-key-%d" % s: "failing-value-%d" % s},
            metrics={"failing-metric-%d" % s: s},
        )
        for s in range(3)
    ]
    last = dict(spans[-1])
    if kind == "buffer_full":
        last["resource"] = "R" * 200  # more than the room left, less than max_size
    elif kind == "item_too_large":
        last["resource"] = "R" * 6000
    elif kind == "type_error":
        last["meta"] = {"failing-key-x": "ok", "bad": 12}
    elif kind == "value_error":
        last["meta"] = {"failing-key-x": "lone surrogate \ud800"}
    elif kind == "runtime_error":
        fields = {k: v for k, v in last.items()}
        last = Span(fail_on="metrics", **fields)
    elif kind == "trace_mutated":
        # a property of the next-to-last span grows the trace while it is
        # being encoded
        middle = Span(**dict(spans[-2]))
        middle._get = lambda name, _s=middle, _spans=spans: (
            _spans.append(_spans[0]) if name == "metrics" else None) or _s._fields[name]
        spans[-2] = middle
    spans[-1] = last
    return spans


FAILURES = {
    "buffer_full": BufferFull,
    "item_too_large": BufferItemTooLarge,
    "type_error": TypeError,
    "value_error": ValueError,
    "runtime_error": RuntimeError,
    "trace_mutated": RuntimeError,
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_failed_put_rolls_back_exactly(version, kind):
    prefix = [make_trace(i, spans=3) for i in range(6)]
    # the suffix reuses strings the failed trace introduced, and adds new ones
    suffix = [
        [make_span(7000, 1, service="failing-svc-0", resource="failing-resource-1",
                   meta={"failing-key-0": "failing-value-2", "after": "new"})],
        make_trace(8),
    ]
    kwargs = _limits_for(version, prefix, suffix, kind)
    if kind == "buffer_full":
        assert growth(version, prefix, _failing_trace(kind, 0)) <= kwargs["max_size"]
    a, b = enc(version, **kwargs), enc(version, **kwargs)
    for t in prefix:
        a.put(t)
        b.put(t)
    state = (a.size, len(a))
    for attempt in range(3):
        with pytest.raises(FAILURES[kind]) as info:
            a.put(_failing_trace(kind, attempt))
        if kind == "runtime_error":
            assert "span property failed" in str(info.value)
        if kind in ("buffer_full", "item_too_large"):
            assert info.value.args[0] == growth(version, prefix, _failing_trace(kind, attempt))
        assert (a.size, len(a)) == state
    for t in suffix:
        a.put(t)
        b.put(t)
    out = same_state(a, b)
    assert out == [(one_shot(version, prefix + suffix), len(prefix) + len(suffix))]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", ["type_error", "value_error", "runtime_error"])
def test_failure_on_last_span_of_long_trace(version, kind):
    """Hundreds of spans, each adding new strings, then the last one fails."""
    prefix = [make_trace(i) for i in range(2)]
    long_trace = [
        make_span(9000, s + 1, service="long-svc-%d" % s, resource="long-res-%d" % s,
                  meta={"long-k-%d" % s: "long-v-%d" % s, "shared": "v"},
                  metrics={"long-m-%d" % s: s})
        for s in range(500)
    ]
    bad = dict(long_trace[-1])
    if kind == "type_error":
        bad["meta"] = dict(bad["meta"], zzz=object())
    elif kind == "value_error":
        bad["resource"] = "x\udfff"
    else:
        bad = Span(fail_on="span_type", **bad)
    failing = long_trace[:-1] + [bad]
    after = [long_trace[:3], make_trace(3), [make_span(9001, 1, service="long-svc-499")]]
    a, b = enc(version), enc(version)
    for t in prefix:
        a.put(t)
        b.put(t)
    before = a.size
    with pytest.raises(FAILURES[kind]):
        a.put(failing)
    assert a.size == before and len(a) == 2
    for t in after:
        a.put(t)
        b.put(t)
    out = same_state(a, b)
    assert out == [(one_shot(version, prefix + after), 5)]
    if version == "v0.5":
        table = unpack(out[0][0])[0]
        assert "long-k-100" not in table  # the failed trace's strings are gone
        assert len(table) == len(set(table))


@pytest.mark.parametrize("version", VERSIONS)
def test_failure_in_first_span_trace_level_fields(version):
    a, b = enc(version), enc(version)
    a.put(make_trace(1))
    b.put(make_trace(1))
    bad_traces = [
        [Span(fail_on="trace_id", trace_id=1, span_id=2)],
        [make_span("not-an-int", 2)],
        [make_span(1 << 128, 2)],
        [make_span(1, -5)],
        [make_span(1, 2, origin=b"bytes-origin")],
        [make_span(1, 2), "not a span"],
        ("not", "spans"),
        None,
    ]
    for bad in bad_traces:
        with pytest.raises((TypeError, ValueError, RuntimeError)):
            a.put(bad)
    a.put(make_trace(2))
    b.put(make_trace(2))
    same_state(a, b)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", ["buffer_full", "item_too_large"])
def test_failed_put_after_split_rolls_back_exactly(version, kind):
    small = [make_trace(i) for i in range(2)]
    big = make_trace(99, pad=400)
    if kind == "buffer_full":
        # big fits a payload of its own, but not next to small[0] (so the
        # encoder starts a new payload) and not in the buffer
        alone = len(one_shot(version, [big]))
        kwargs = {"max_payload_size": alone, "max_size": alone}
    else:
        # big fits no payload at all; the two small traces share one
        kwargs = {"max_payload_size": len(one_shot(version, small))}
    a, b = enc(version, **kwargs), enc(version, **kwargs)
    a.put(small[0])
    b.put(small[0])
    size = a.size
    with pytest.raises(BufferFull if kind == "buffer_full" else BufferItemTooLarge):
        a.put(big)
    assert a.size == size
    a.put(small[1])
    b.put(small[1])
    assert same_state(a, b) == [(one_shot(version, small[:2]), 2)]


# ---------------------------------------------------------------------------
# A model of the limits, driven by hypothesis


# A few fixed strings (reused: v0.5 table hits) and many generated ones (the
# v0.5 table crosses 16 entries and 127/255 indexes).
_strings = st.one_of(
    st.sampled_from(["", "a", "svc", "op", "é", "☃", "k1", "k2", "v" * 40, "w" * 300]),
    st.text(alphabet="abcdé☃🚀", max_size=6),
)


@st.composite
def _traces(draw):
    n = draw(st.integers(0, 3))
    spans = []
    for s in range(n):
        spans.append(
            make_span(
                draw(st.integers(1, (1 << 64) - 1)),
                s + 1,
                service=draw(_strings),
                name=draw(_strings),
                resource=draw(_strings),
                meta=draw(st.dictionaries(_strings, _strings, max_size=3)),
                metrics=draw(st.dictionaries(_strings, st.integers(-5, 1 << 40), max_size=2)),
            )
        )
    bad = draw(st.sampled_from([None, None, None, "meta", "raise"]))
    if bad and spans:
        if bad == "meta":
            spans[-1]["meta"] = dict(spans[-1]["meta"], bad=3)
        else:
            fields = dict(spans[-1])
            spans[-1] = Span(fail_on="resource", **fields)
    return spans, bad if spans else None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.sampled_from(VERSIONS),
    max_size=st.integers(20, 6000),
    max_item_size=st.one_of(st.none(), st.integers(10, 4000)),
    ops=st.lists(st.one_of(_traces(), st.just("encode")), max_size=40),
)
def test_limits_model(version, max_size, max_item_size, ops):
    e = enc(version, max_size=max_size, max_item_size=max_item_size)
    item_limit = min(max_item_size or max_size, max_size)
    accepted = []
    for op in ops:
        if op == "encode":
            out = e.encode()
            assert out == ([(one_shot(version, accepted), len(accepted))] if accepted else [])
            accepted = []
            continue
        trace, bad = op
        before = e.size
        if bad:
            with pytest.raises(TypeError if bad == "meta" else RuntimeError):
                e.put(trace)
        else:
            g = growth(version, accepted, trace)
            new_size = len(one_shot(version, accepted + [trace]))
            if g > item_limit:
                with pytest.raises(BufferItemTooLarge) as info:
                    e.put(trace)
                assert info.value.args == (g,)
                assert str(info.value) == "trace of %d bytes is over max_item_size=%d" % (g, item_limit)
            elif new_size > max_size:
                with pytest.raises(BufferFull) as info:
                    e.put(trace)
                assert info.value.args == (g,)
                assert str(info.value) == "trace of %d bytes does not fit: %d bytes buffered, max_size=%d" % (
                    g, before, max_size)
            else:
                e.put(trace)
                accepted.append(trace)
                assert e.size == new_size == before + g
                continue
        assert e.size == before
        assert len(e) == len(accepted)
    out = e.encode()
    assert out == ([(one_shot(version, accepted), len(accepted))] if accepted else [])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.sampled_from(VERSIONS),
    limit=st.integers(60, 3000),
    traces=st.lists(_traces(), min_size=1, max_size=40),
    encode_at=st.sets(st.integers(0, 40)),
)
def test_split_model(version, limit, traces, encode_at):
    """Splitting against a greedy model: each payload is the one-shot encoding
    of its traces, within the limit, and only closed when the next trace does
    not fit; size is exact before every encode()."""
    traces = [t for t, bad in traces if not bad]
    traces = [t for t in traces if len(one_shot(version, [t])) <= limit]
    e = enc(version, max_payload_size=limit)
    groups = []

    def flush():
        size = e.size
        out = e.encode()
        assert out == [(one_shot(version, g), len(g)) for g in groups]
        assert size == (total_len(out) if out else EMPTY_SIZE[version])
        assert all(len(p) <= limit for p, _ in out)
        groups.clear()

    for i, t in enumerate(traces):
        if i in encode_at:
            flush()
        if groups and len(one_shot(version, groups[-1] + [t])) <= limit:
            groups[-1].append(t)
        else:
            groups.append([t])
        e.put(t)
        assert len(e) == sum(len(g) for g in groups)
    flush()


# ---------------------------------------------------------------------------
# v0.5 put() forecasts each string's payload index while the trace is encoded
# and copies the body whole when the payload is unchanged at the join; when
# span code changed the payload meanwhile (or a lenient entry was dropped after
# its strings were forecast) the join rewrites every reference instead.  Both
# must give the one-shot bytes.


class HookSpan(Span):
    """A Span whose `resource` runs `hook` (once) before it is read."""

    def __init__(self, hook=None, **fields):
        super().__init__(**fields)
        self._hook = hook

    @property
    def resource(self):
        hook, self._hook = self._hook, None
        if hook is not None:
            hook()
        return self._get("resource")


def hooked_trace(i, spans, at, hook):
    """make_trace(i, spans) as HookSpans, `hook` run when span `at` is read."""
    return [HookSpan(hook=hook if s == at else None, **fields)
            for s, fields in enumerate(make_trace(i, spans=spans))]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("at", [0, 1, 4])
def test_put_from_span_code_changes_the_payload_mid_trace(version, at):
    before = [make_trace(i, spans=2) for i in range(3)]
    # shares strings with the outer trace (new and already buffered ones)
    inner = make_trace(5, spans=2) + [make_span(1005, 9, resource="res-6-3", meta={"own.6": "x"})]
    e = enc(version)
    for t in before:
        e.put(t)
    e.put(hooked_trace(6, 5, at, lambda: e.put(inner)))
    assert e.encode() == [(one_shot(version, before + [inner, make_trace(6, spans=5)]), 5)]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("at", [0, 2])
def test_encode_from_span_code_starts_a_new_payload_mid_trace(version, at):
    before = [make_trace(i, spans=2) for i in range(3)]
    flushed = []

    def flush_and_refill():
        flushed.extend(e.encode())
        # the new payload holds as many strings as the old one did
        for t in before:
            e.put(t)

    e = enc(version)
    for t in before:
        e.put(t)
    e.put(hooked_trace(6, 4, at, flush_and_refill))
    assert flushed == [(one_shot(version, before), 3)]
    assert e.encode() == [(one_shot(version, before + [make_trace(6, spans=4)]), 4)]


@pytest.mark.parametrize("at", [1, 3])
def test_v05_join_reads_strings_of_the_payload_finished_mid_trace(at):
    """A string the payload already has is written as its index there (it
    never enters the trace's own table).  When span code finishes that
    payload before the join, the join reads those strings from the finished
    payload's table, kept until the put() ends, though nothing else holds
    them any more: the new payload gets them in one-shot order."""
    e = enc("v0.5")
    for i in range(3):
        e.put(make_trace(i, spans=2))  # texts made at run time: the table keeps the only objects
    flushed = []
    hooked = hooked_trace(1, 4, at, lambda: flushed.extend(e.encode()))
    e.put(hooked)
    del hooked
    gc.collect()
    assert flushed == [(one_shot("v0.5", [make_trace(i, spans=2) for i in range(3)]), 3)]
    assert e.encode() == [(one_shot("v0.5", [make_trace(1, spans=4)]), 1)]


def test_v05_finished_payload_tables_kept_only_while_a_put_needs_them():
    """Tables kept for put()s under way are freed when the last of them
    ends: a payload finished from span code in every put() keeps nothing."""
    e = enc("v0.5")
    for round in range(20):
        e.put(make_trace(round, spans=2))
        e.put(hooked_trace(round, 3, 1, e.encode))
        e.put(hooked_trace(round, 3, 2, lambda: e.put(hooked_trace(round + 100, 2, 1, e.encode))))
    e.encode()
    gc.collect()
    with memory_grown() as grown:
        for round in range(200):
            e.put(make_trace(round, spans=2))
            e.put(hooked_trace(round, 3, 1, e.encode))
        e.encode()
        gc.collect()
        assert grown() < 64 * 1024, grown()


class CallOnCollect:
    """Garbage (a cycle) whose collection calls `action`."""

    def __init__(self, action):
        self.action = action
        self.cycle = self

    def __del__(self):
        self.action()


@pytest.mark.parametrize("version", VERSIONS)
def test_encode_finished_by_a_finalizer_during_encode_lists_no_empty_payload(version):
    """encode() allocates before it reads the payload: a collection there may
    run a finalizer that puts and encodes itself.  The traces go out once,
    with that inner encode(), and the outer one lists no empty payload.
    (CPython up to 3.11 collects inside the allocation, unless a free list
    gives the object without one; from 3.12 at the next bytecode boundary,
    once the outer encode() has returned.  A collection after the call runs
    the finalizer at the latest; then each encode() takes one trace.)"""
    e = enc(version)
    e.put(make_trace(1))
    inner = []
    gc.collect()
    gc.disable()
    CallOnCollect(lambda: (e.put(make_trace(2)), inner.extend(e.encode())))
    gc.enable()
    old = gc.get_threshold()
    gc.set_threshold(1)
    try:
        outer = e.encode()
    finally:
        gc.set_threshold(*old)
    gc.collect()
    together = [(one_shot(version, [make_trace(1), make_trace(2)]), 2)]
    first, second = [(one_shot(version, [make_trace(i)]), 1) for i in (1, 2)]
    assert (inner, outer) in [(together, []), ([second], [first])]
    e.put(make_trace(3))
    assert e.encode() == [(one_shot(version, [make_trace(3)]), 1)]


@pytest.mark.parametrize("version", VERSIONS)
def test_init_refused_when_a_put_started_while_it_ran_python_code(version):
    """__init__ runs Python code (default_meta's items()) before it swaps the
    encoder's parts: a put() another thread started meanwhile, still under
    way, makes it refuse, and that trace is kept whole."""
    e = enc(version)
    in_getter, resume = threading.Event(), threading.Event()

    def wait_in_getter():
        in_getter.set()
        assert resume.wait(10)

    hooked = hooked_trace(7, 3, 1, wait_in_getter)
    worker = threading.Thread(target=e.put, args=(hooked,))

    class StartsAPut:
        def items(self):
            worker.start()
            assert in_getter.wait(10)
            return []

    try:
        with pytest.raises(RuntimeError, match="while the encoder is encoding"):
            e.__init__(version, default_meta=StartsAPut())
    finally:
        resume.set()
        worker.join(10)
    assert e.encode() == [(one_shot(version, [make_trace(7, spans=3)]), 1)]


@pytest.mark.parametrize("version", VERSIONS)
def test_lenient_drop_after_new_strings(version):
    """A dropped entry's new key had taken a forecast index: the later new
    strings' indexes are then rewritten at the join."""
    before = [make_trace(i) for i in range(2)]
    trace = [make_span(77, 1, meta={"new-a": "v-a", "new-bad": object(), "new-b": "v-b"},
                       metrics={"new-m": 1, "new-bad-m": "x", "new-n": 2.5}),
             make_span(77, 2, meta={"new-c": "v-c"})]
    e = enc(version, lenient=True)
    for t in before + [trace]:
        e.put(t)
    assert e.dropped_tags == 2
    expected = enc(version, lenient=True).encode_traces(before + [trace])
    assert e.encode() == [(expected, 3)]


# ---------------------------------------------------------------------------
# Memory is given back


@pytest.mark.parametrize("version", VERSIONS)
def test_memory_released_after_encode(version):
    value = "m" * 10_000
    traces = [
        [make_span(i + 1, 1, resource="r-%d" % i, meta={"big": value, "own-%d" % i: value + str(i)})]
        for i in range(1500)
    ]
    huge = [make_span(1, 2, meta={"k%d" % i: value for i in range(2000)})]  # ~20 MB alone
    e = enc(version, max_size=200 * 1024 * 1024)
    e.put(traces[0])
    e.encode()
    gc.collect()
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        for t in traces:
            e.put(t)
        filled = tracemalloc.get_traced_memory()[0]
        assert filled - baseline > 15_000_000  # v0.4 ~30 MB, v0.5 ~20 MB buffered
        payloads = e.encode()
        assert total_len(payloads) > 15_000_000
        del payloads
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        assert after - baseline < 2_000_000, (baseline, filled, after)

        # one huge trace: its encoding buffer is not kept either
        e.put(huge)
        out = e.encode()
        assert total_len(out) > (15_000_000 if version == "v0.4" else 0)
        del out
        gc.collect()
        after_huge = tracemalloc.get_traced_memory()[0]
        assert after_huge - baseline < 2_000_000, (baseline, after_huge)

        # a fresh put afterwards costs what it cost at the start
        e.put(traces[0])
        assert e.size == len(one_shot(version, traces[:1]))
        assert e.encode() == [(one_shot(version, traces[:1]), 1)]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("version", VERSIONS)
def test_failed_puts_do_not_leak(version):
    kinds = ["type_error", "value_error", "runtime_error", "trace_mutated"]
    # Without the v0.4 string cache, which by design keeps up to
    # STRCACHE_SLOTS strings alive (bounded; see test_string_cache_is_bounded).
    e = enc(version, max_item_size=2000, intern=False)
    big = _failing_trace("item_too_large", 0)
    failing = {kind: _failing_trace(kind, 0) for kind in kinds}

    def fail_all(rounds):
        for _ in range(rounds):
            for kind in kinds:
                trace = failing[kind]
                if kind == "trace_mutated":
                    trace = _failing_trace(kind, 0)
                with pytest.raises(FAILURES[kind]):
                    e.put(trace)
            with pytest.raises(BufferItemTooLarge):
                e.put(big)

    fail_all(50)  # warm up caches
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        fail_all(1000)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    # Only what this thread's puts allocated: a tracemalloc frame is the
    # Python line running when the block was allocated, so threads left by
    # other tests (a writer's, the agent's) are not counted.
    own = [tracemalloc.Filter(True, __file__), tracemalloc.Filter(True, os.path.join(os.path.dirname(spanpack.__file__), "*"))]
    grown = sum(stat.size_diff for stat in after.filter_traces(own).compare_to(before.filter_traces(own), "filename"))
    assert grown < 100_000, grown
    assert e.encode() == [] and e.size == EMPTY_SIZE[version]


def test_string_cache_is_bounded():
    """The v0.4 cache keeps at most 4,096 strings, however many it sees."""
    e = enc("v0.4", intern=True)
    for round_ in range(3):
        trace = [make_span(1, i + 1, service="svc-%d-%d" % (round_, i)) for i in range(6000)]
        e.encode_traces([trace, trace])  # each string twice: admitted
    stats = e._intern_stats()
    assert 0 < stats["entries"] <= 4096, stats


def test_v04_keeps_a_payload_buffer_of_up_to_4_mib_after_encode():
    """After encode() a v0.4 encoder keeps the buffer its last payload was
    built in for the next one, when it is no larger than 4 MiB, besides its
    put() scratch space (about 1 MiB); a larger one is given back (see
    test_memory_released_after_encode).  The next payloads are the same."""
    value = "p" * 1_000
    traces = [[make_span(i + 1, s + 1, resource="r-%d-%d" % (i, s), meta={"v": value})
               for s in range(300)] for i in range(10)]  # ~3 MB a payload
    e = enc("v0.4", max_size=200 * 1024 * 1024)
    e.put(traces[0][:1])
    e.encode()
    gc.collect()
    with memory_grown() as kept:
        for _ in range(3):
            for t in traces:
                e.put(t)
            payloads = e.encode()
            assert payloads == [(one_shot("v0.4", traces), len(traces))]
            del payloads
            gc.collect()
            assert kept() < 2_000_000 + (4 << 20), kept()
