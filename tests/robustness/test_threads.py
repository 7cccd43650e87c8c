"""put() from many threads while another thread keeps calling encode().

Every trace carries its own trace_id, so after decoding every payload the
multiset of traces must be exactly the multiset that was put (no loss, no
duplicate, no trace torn across payloads or mixed with another), each trace
byte-identical in meaning to its one-shot encoding.
"""

from __future__ import annotations

import collections
import sys
import threading
import time

import msgpack
import pytest

from spanpack import BufferFull, TraceMsgPackEncoder

from tests.support import resolved_traces as resolved

VERSIONS = ["v0.4", "v0.5"]
THREADS = 16
PUTS = 1000
EMPTY_SIZE = {"v0.4": 1, "v0.5": 15}


def span_fields(t, i, s):
    trace_id = (t << 32) | (i + 1)
    return {
        "trace_id": trace_id,
        "span_id": (trace_id << 2 | s) & 0xFFFFFFFFFFFFFFFF or 1,
        "parent_id": None if s == 0 else (trace_id << 2) & 0xFFFFFFFFFFFFFFFF,
        "service": "svc-%d" % t,
        "name": "op-%d" % (s % 2),
        "resource": "res-%d-%d-%d" % (t, i, s),
        "span_type": "web" if s == 0 else None,
        "start_ns": 1_700_000_000_000_000_000 + i,
        "duration_ns": 10 * i + s,
        "error": (i + s) % 7 == 0,
        "meta": {"thread": str(t), "put": str(i), "shared": "x" * (i % 40)},
        "metrics": {"i": i, "t": t / 7.0},
    }


def dict_trace(t, i):
    return [span_fields(t, i, s) for s in range(1 + i % 3)]


class SlowSpan:
    """A span whose every field is a property that lets other threads run
    (time.sleep(0) releases the GIL) in the middle of put()."""

    __slots__ = ("_f",)

    def __init__(self, fields):
        self._f = fields


def _slow_property(name):
    def get(self):
        time.sleep(0)
        return self._f[name]

    return property(get)


def _plain_property(name):
    return property(lambda self: self._f[name])


# Early, middle and last fields read per span release the GIL.
_SLOW_FIELDS = {"trace_id", "resource", "metrics"}
for _name in (
    "trace_id span_id parent_id service name resource span_type start_ns duration_ns "
    "error meta metrics"
).split():
    setattr(SlowSpan, _name, (_slow_property if _name in _SLOW_FIELDS else _plain_property)(_name))


def slow_trace(t, i):
    return [SlowSpan(span_fields(t, i, s)) for s in range(1 + i % 3)]


def canonical(version, encoder_kwargs, trace):
    one = TraceMsgPackEncoder(version, **encoder_kwargs).encode_traces([trace])
    [decoded] = resolved(version, one)
    return repr(decoded)


@pytest.fixture
def fast_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def run_concurrently(encoder, make_trace, *, bad_every=0, puts=PUTS):
    """THREADS writers x `puts` put() calls while a flusher calls encode().

    Returns (accepted traces, payloads).  With bad_every, every bad_every-th
    put of a thread is a trace whose last span has a bad meta value.
    """
    accepted = [[] for _ in range(THREADS)]
    errors = []
    payloads = []
    start = threading.Barrier(THREADS + 1)
    writers_done = threading.Event()
    # Set once encode() has returned a payload: each writer waits for it
    # half-way, so that encode() runs between puts however the threads are
    # scheduled (a loaded machine once ran every put before the flusher's
    # first encode()).
    flushed = threading.Event()

    def writer(t):
        try:
            start.wait()
            for i in range(puts):
                if i == puts // 2 and i > 0:
                    flushed.wait(30)
                trace = make_trace(t, i)
                bad = bad_every and i % bad_every == bad_every - 1
                if bad:
                    last = trace[-1]
                    fields = dict(last._f if isinstance(last, SlowSpan) else last)
                    fields["meta"] = dict(fields["meta"], bad=i)
                    trace[-1] = fields
                    try:
                        encoder.put(trace)
                    except TypeError:
                        continue
                    raise AssertionError("a bad trace was accepted")
                try:
                    encoder.put(trace)
                except BufferFull:
                    continue
                accepted[t].append(trace)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def flusher():
        try:
            start.wait()
            while not writers_done.is_set():
                got = encoder.encode()
                payloads.extend(got)
                if got:
                    flushed.set()
                time.sleep(0.0005)
            payloads.extend(encoder.encode())
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(THREADS)]
    flush_thread = threading.Thread(target=flusher)
    flush_thread.start()
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    writers_done.set()
    flush_thread.join(60)
    assert not errors, errors
    assert not any(th.is_alive() for th in threads + [flush_thread])
    return [tr for per_thread in accepted for tr in per_thread], payloads


def check_payloads(version, encoder_kwargs, accepted, payloads, min_payloads=2):
    assert len(payloads) >= min_payloads  # encode() really ran concurrently with put()
    got = collections.Counter()
    seen_ids = collections.Counter()
    limit = encoder_kwargs.get("max_payload_size")
    for payload, count in payloads:
        assert count > 0
        if limit:
            assert len(payload) <= limit
        traces = resolved(version, payload)
        assert len(traces) == count
        for trace in traces:
            got[repr(trace)] += 1
            # every span of a trace carries the trace's id
            ids = {span["trace_id"] if version == "v0.4" else span[3] for span in trace}
            assert len(ids) == 1
            seen_ids[ids.pop()] += 1
    assert sum(seen_ids.values()) == len(accepted)
    assert max(seen_ids.values()) == 1  # no trace twice
    expected = collections.Counter(canonical(version, encoder_kwargs, t) for t in accepted)
    assert got == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_many_writers_one_flusher(version, fast_switching):
    e = TraceMsgPackEncoder(version)
    accepted, payloads = run_concurrently(e, dict_trace)
    assert len(accepted) == THREADS * PUTS
    check_payloads(version, {}, accepted, payloads)
    assert len(e) == 0 and e.size == EMPTY_SIZE[version]
    assert e.encode() == []


@pytest.mark.parametrize("version", VERSIONS)
def test_writers_whose_spans_release_the_gil(version, fast_switching):
    e = TraceMsgPackEncoder(version)
    accepted, payloads = run_concurrently(e, slow_trace, puts=150)
    assert len(accepted) == THREADS * 150
    check_payloads(version, {}, accepted, payloads)
    assert len(e) == 0 and e.size == EMPTY_SIZE[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_concurrent_failures_limits_and_splitting(version, fast_switching):
    """Bad traces, BufferFull and payload splitting, all under concurrency:
    what was accepted arrives exactly once and nothing else does."""
    kwargs = {"max_size": 48 * 1024, "max_payload_size": 6000}
    e = TraceMsgPackEncoder(version, **kwargs)
    accepted, payloads = run_concurrently(e, dict_trace, bad_every=10, puts=600)
    assert 0 < len(accepted) <= THREADS * 540
    check_payloads(version, kwargs, accepted, payloads)
    assert len(e) == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_slow_spans_with_failures(version, fast_switching):
    e = TraceMsgPackEncoder(version)
    accepted, payloads = run_concurrently(e, slow_trace, bad_every=7, puts=100)
    assert len(accepted) == THREADS * (100 - 100 // 7)
    check_payloads(version, {}, accepted, payloads, min_payloads=1)


@pytest.mark.parametrize("version", VERSIONS)
def test_reentrant_put_and_encode_from_a_span_property(version):
    """A span property may itself call put() or encode() on the same encoder
    (e.g. a tracer flushing from inside a callback)."""
    e = TraceMsgPackEncoder(version)
    inner = dict_trace(1, 1)
    flushed = []

    class Reentrant(SlowSpan):
        __slots__ = ("action",)

        @property
        def resource(self):
            if self.action == "put":
                e.put(inner)
            elif self.action == "encode":
                flushed.extend(e.encode())
            return self._f["resource"]

    def outer(t, action):
        trace = dict_trace(t, 0)
        span = Reentrant(trace[0])
        span.action = action
        return [span] + trace[1:]

    kw = {}
    e.put(dict_trace(0, 5))
    outer_put = outer(2, "put")
    e.put(outer_put)
    # the inner trace finished first, then the outer one
    [(payload, count)] = e.encode()
    assert count == 3
    assert [repr(t) for t in resolved(version, payload)] == [
        canonical(version, kw, dict_trace(0, 5)),
        canonical(version, kw, inner),
        canonical(version, kw, dict_trace(2, 0)),
    ]

    e.put(dict_trace(3, 3))
    e.put(outer(4, "encode"))
    assert [c for _, c in flushed] == [1]
    assert [repr(t) for t in resolved(version, flushed[0][0])] == [
        canonical(version, kw, dict_trace(3, 3))
    ]
    [(payload, count)] = e.encode()
    assert count == 1
    assert [repr(t) for t in resolved(version, payload)] == [canonical(version, kw, dict_trace(4, 0))]
