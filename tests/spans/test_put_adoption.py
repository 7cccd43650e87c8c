"""Adversarial tests of v0.5 put() adopting the first trace of an empty payload."""

from __future__ import annotations

import gc
import sys
import threading
import time

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spanpack import BufferFull, BufferItemTooLarge, TraceMsgPackEncoder

from tests.support import memory_grown

from .test_buffered import HookSpan, Span, make_span, one_shot

VERSIONS = ["v0.4", "v0.5"]


def fresh(text):
    """A str object no one else holds (not interned, not a constant)."""
    return "".join(["u-", text])


def unique_trace(tid, spans=3):
    out = []
    for s in range(spans):
        out.append(make_span(tid, s + 1, service=fresh("svc%d_%d" % (tid, s)),
                             resource=fresh("res%d_%d" % (tid, s)),
                             meta={fresh("k%d_%d" % (tid, s)): fresh("v%d_%d" % (tid, s)),
                                   "shared": fresh("sv%d_%d" % (tid, s))},
                             metrics={fresh("m%d_%d" % (tid, s)): s}))
    return out


def strs_of(trace):
    out = []
    for span in trace:
        fields = span._fields if isinstance(span, Span) else span
        out += [fields["service"], fields["resource"]]
        for k, v in fields["meta"].items():
            out += [k, v]
        out += list(fields["metrics"])
    return out


def counts(objs):
    return [sys.getrefcount(o) for o in objs]


def trace_ids(version, payload):
    data = msgpack.unpackb(payload, strict_map_key=False)
    traces = data if version == "v0.4" else data[1]
    return [t[0]["trace_id"] if version == "v0.4" else t[0][3] for t in traces]


@pytest.mark.parametrize("version", VERSIONS)
def test_refcounts_exact_over_adoption_paths(version):
    traces = [unique_trace(100 + i) for i in range(8)]
    objs = [o for t in traces for o in strs_of(t)]
    gc.collect()
    base = counts(objs)

    for _ in range(3):
        # adopted then encoded
        e = TraceMsgPackEncoder(version, intern=False)
        e.put(traces[0])
        e.put(traces[1])
        assert e.encode() == [(one_shot(version, traces[:2]), 2)]
        assert counts(objs) == base
        # adopted then refused (item too large after the join: rolled back)
        size0 = len(one_shot(version, [traces[0]]))
        e2 = TraceMsgPackEncoder(version, intern=False, max_item_size=size0 - len(one_shot(version, [])) - 1, max_size=10**6)
        with pytest.raises(BufferItemTooLarge):
            e2.put(traces[0])
        assert counts(objs) == base
        e2.put(traces[3][:1])  # a small first trace is adopted after the refusal
        with pytest.raises(BufferItemTooLarge):
            e2.put(traces[0] + traces[7])
        assert e2.encode() == [(one_shot(version, [traces[3][:1]]), 1)]
        assert counts(objs) == base
        # adopted then BufferFull on the next, then freed with traces buffered
        e3 = TraceMsgPackEncoder(version, intern=False, max_size=size0 + 10)
        e3.put(traces[0])
        with pytest.raises(BufferFull):
            e3.put(traces[1])
        del e3
        assert counts(objs) == base
        # adopted, then __init__ drops the buffer
        e4 = TraceMsgPackEncoder(version, intern=False)
        e4.put(traces[2])
        e4.__init__(version)
        assert counts(objs) == base
        # adopted, then split payloads, max_payload_size
        e5 = TraceMsgPackEncoder(version, intern=False, max_payload_size=size0 + 40)
        for t in traces:
            e5.put(t)
        out = e5.encode()
        for payload, n in out:
            ids = trace_ids(version, payload)
            assert payload == one_shot(version, [traces[i - 100] for i in ids])
        assert sum(n for _, n in out) == len(traces)
        assert counts(objs) == base
        # re-entrant: span code puts (own part adopts) and encodes mid-trace
        e6 = TraceMsgPackEncoder(version, intern=False)
        flushed = []
        outer = [HookSpan(hook=lambda: e6.put(traces[4]), **dict(traces[5][0]))] + traces[5][1:]
        e6.put(outer)
        outer2 = [HookSpan(hook=lambda: flushed.extend(e6.encode()), **dict(traces[6][0]))] + traces[6][1:]
        e6.put(outer2)
        flushed.extend(e6.encode())
        assert flushed == [(one_shot(version, [traces[4], traces[5]]), 2),
                           (one_shot(version, [traces[6]]), 1)]
        del outer, outer2
        assert counts(objs) == base
        # intake: taken, refused as too large after adoption
        e7 = TraceMsgPackEncoder(version, intern=False, max_item_size=size0 - len(one_shot(version, [])) - 1, max_size=10**6)
        e7._start_intake(0)
        assert e7._put_counted(traces[0]) == 3
        assert e7._put_counted(traces[3][:1]) == 0
        out = e7.encode()
        assert [(p, n) for p, n, _ in out] == [(one_shot(version, [traces[3][:1]]), 1)]
        del out, e7
        gc.collect()
        assert counts(objs) == base


class Sleepy(Span):
    """A span whose getters give the GIL away."""

    def _get(self, name):
        if name in ("resource", "meta"):
            time.sleep(0)
        return super()._get(name)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("counted", [False, True])
def test_threads_put_while_another_encodes(version, counted):
    per_thread, nthreads = 150, 4
    traces = {}
    for t in range(nthreads):
        for i in range(per_thread):
            tid = 1 + t * 1000 + i
            traces[tid] = [make_span(tid, s + 1, service="s%d" % (tid % 7), resource="r%d-%d" % (tid, s),
                                     meta={"k%d" % (i % 5): "v%d" % tid, "t": "x%d" % t})
                           for s in range(1 + i % 3)]
    e = TraceMsgPackEncoder(version, max_payload_size=3000)
    if counted:
        e._start_intake(0)
    payloads = []
    stop = threading.Event()

    def putter(t):
        for i in range(per_thread):
            tid = 1 + t * 1000 + i
            # half the traces give the GIL away mid-trace, half are joined
            # in the step that forecast them (adopted when the payload is empty)
            trace = [Sleepy(**dict(s)) for s in traces[tid]] if i % 2 else traces[tid]
            if counted:
                assert e._put_counted(trace) in (0, 1)
            else:
                e.put(trace)
            if i % 4 == 0:  # an empty payload for the next trace to be adopted into
                payloads.extend(e.encode())

    def flusher():
        while not stop.is_set():
            payloads.extend(e.encode())
            time.sleep(0)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        f = threading.Thread(target=flusher)
        f.start()
        workers = [threading.Thread(target=putter, args=(t,)) for t in range(nthreads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        stop.set()
        f.join()
    finally:
        sys.setswitchinterval(old)
    payloads.extend(e.encode())
    seen = []
    for entry in payloads:
        payload, n = entry[0], entry[1]
        ids = trace_ids(version, payload)
        assert len(ids) == n
        assert payload == one_shot(version, [traces[i] for i in ids])
        if counted:
            assert [t[0]["trace_id"] if isinstance(t[0], dict) else t[0].trace_id for t in entry[2]] == ids
        seen += ids
    assert sorted(seen) == sorted(traces)


# ---- model: puts whose span code puts, encodes or fails, vs. decoding ----

_ops = st.lists(st.tuples(st.sampled_from(["plain", "inner_put", "inner_encode", "inner_fail",
                                           "fail", "encode", "too_large", "inner_init_fail",
                                           "inner_too_large", "inner_put_encode"]),
                          st.integers(1, 4), st.integers(0, 3)), max_size=30)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(version=st.sampled_from(VERSIONS), ops=_ops, limit=st.sampled_from([None, 900, 2500]))
def test_reentrant_model(version, ops, limit):
    by_id = {}
    counter = [0]

    def new_trace(spans, shared):
        counter[0] += 1
        tid = counter[0]
        trace = [make_span(tid, s + 1, service="svc-%d" % (s % 2), resource="r-%d-%d" % (tid, s),
                           meta={"sh-%d" % shared: "v", "own-%d" % tid: "v-%d-%d" % (tid, s)},
                           metrics={"m-%d" % (tid % 3): s})
                 for s in range(spans)]
        by_id[tid] = trace
        return trace

    e = TraceMsgPackEncoder(version, max_payload_size=limit, max_item_size=5000)
    accepted = []
    payloads = []

    def put(trace):
        e.put(trace)
        accepted.append(trace[0]["trace_id"] if isinstance(trace[0], dict) else trace[0]._fields["trace_id"])

    for kind, spans, shared in ops:
        if kind == "encode":
            payloads.extend(e.encode())
            continue
        if kind == "fail":
            bad = new_trace(spans, shared)
            del by_id[bad[0]["trace_id"]]
            bad[-1] = dict(bad[-1], meta={"bad": object()})
            with pytest.raises(TypeError):
                e.put(bad)
            continue
        if kind == "too_large":
            bad = new_trace(spans, shared)
            del by_id[bad[0]["trace_id"]]
            bad[0] = dict(bad[0], resource="R" * 6000)
            with pytest.raises(BufferItemTooLarge):
                e.put(bad)
            continue
        trace = new_trace(spans, shared)
        at = shared % spans
        if kind == "plain":
            put(trace)
            continue
        inner = new_trace(1 + shared % 2, spans)
        if kind == "inner_put":
            hook = lambda inner=inner: put(inner)  # noqa: E731
        elif kind == "inner_encode":
            hook = lambda inner=inner: (payloads.extend(e.encode()), put(inner))  # noqa: E731
        elif kind == "inner_fail":
            del by_id[inner[0]["trace_id"]]
            inner[-1] = dict(inner[-1], meta={"bad": 1.5j})

            def hook(inner=inner):
                with pytest.raises(TypeError):
                    e.put(inner)
        elif kind == "inner_put_encode":
            hook = lambda inner=inner: (put(inner), payloads.extend(e.encode()))  # noqa: E731
        elif kind == "inner_too_large":  # joined (adopted when first), then rolled back
            del by_id[inner[0]["trace_id"]]
            inner[0] = dict(inner[0], resource="R" * 6000)

            def hook(inner=inner):
                with pytest.raises(BufferItemTooLarge):
                    e.put(inner)
        else:  # inner_init_fail: __init__ refused while encoding
            del by_id[inner[0]["trace_id"]]

            def hook():
                with pytest.raises(RuntimeError):
                    e.__init__("v0.4")
        outer = [HookSpan(hook=hook if s == at else None, **fields) for s, fields in enumerate(trace)]
        put(outer)
    payloads.extend(e.encode())
    seen = []
    for payload, n in payloads:
        ids = trace_ids(version, payload)
        assert len(ids) == n
        assert payload == one_shot(version, [by_id[i] for i in ids])
        if limit:
            assert len(payload) <= limit
        seen += ids
    assert sorted(seen) == sorted(accepted)


def test_v05_long_strings_table_not_kept_after_encode():
    """A payload's string table of long strings (few entries, many bytes) is
    not kept once encoded: not as the spare table for the next payload, and
    not in put()'s scratch trace, which adopting the first trace of a payload
    gives that payload's old table (each cycle another: without a bound the
    idle encoder kept three such tables)."""
    def trace(t, n=300):
        return [make_span(t, i + 1, resource="%d-%05d" % (t, i) + "x" * 20_000) for i in range(n)]

    small = trace(1, n=1)
    e = TraceMsgPackEncoder("v0.5", max_size=100 << 20)
    e.put(small)
    e.encode()
    gc.collect()
    with memory_grown() as kept:
        for cycle in range(4):
            big = trace(10 + cycle)
            e.put(big)
            assert e.encode() == [(one_shot("v0.5", [big]), 1)]
            e.put(small)
            assert e.encode() == [(one_shot("v0.5", [small]), 1)]
            del big
            gc.collect()
            assert kept() < 2_000_000, (cycle, kept())


def test_v04_first_trace_taken_whole_and_refused_one_not_kept():
    """v0.4 put() gives an empty payload its first trace's buffer instead of
    a copy.  The payload is the same as encode_traces() makes, and a first
    trace refused as too large does not leave its (large) buffer with the
    payload: the idle encoder stays small."""
    def trace(t, n, pad):
        return [make_span(t, i + 1, resource="%d-%05d" % (t, i) + "x" * pad) for i in range(n)]

    e = TraceMsgPackEncoder("v0.4", max_item_size=1_000_000, max_size=100 << 20)
    first, second = trace(1, 50, 10), trace(2, 3, 10)
    e.put(first)
    e.put(second)
    assert e.encode() == [(one_shot("v0.4", [first, second]), 2)]
    gc.collect()
    with memory_grown() as kept:
        for cycle in range(3):
            big = trace(10 + cycle, 200, 20_000)  # about 4 MB: over max_item_size
            with pytest.raises(BufferItemTooLarge):
                e.put(big)
            del big
            gc.collect()
            assert kept() < 2_500_000, (cycle, kept())
            e.put(second)
            assert e.encode() == [(one_shot("v0.4", [second]), 1)]
