"""put() hands the payload the trace table's own reference to each string new
to the payload (v0.5, v1.0) instead of taking a second one.  Whatever happens
to the join (accepted, split off into a payload of its own, refused for a
limit), every string must end with exactly the references it started with,
and every payload must be what an encoder that never saw the refused trace
writes."""

import itertools
import sys

import pytest

import spanpack

VERSIONS = ["v0.5", "v1.0"]


_serial = itertools.count()


def fresh(text):
    """A str made at run time, unlike any other: not interned, not immortal,
    so its reference count tells who holds it."""
    return "".join([text, "-", str(next(_serial))])


def make_trace(tag, spans=2):
    trace = []
    for index in range(spans):
        trace.append({
            "trace_id": 7,
            "span_id": index + 1,
            "parent_id": index,
            "name": fresh("%s-name-%d" % (tag, index)),
            "service": fresh("%s-service" % tag),
            "resource": fresh("%s-resource-%d" % (tag, index)),
            "start_ns": 1_000 + index,
            "duration_ns": 10,
            "meta": {fresh("%s-key-%d" % (tag, index)): fresh("%s-value-%d" % (tag, index))},
            "metrics": {fresh("%s-metric" % tag): 1.5},
        })
    return trace


def strings_of(trace):
    out = []
    for span in trace:
        out += [span["name"], span["service"], span["resource"]]
        out += list(span["meta"].keys()) + list(span["meta"].values()) + list(span["metrics"].keys())
    return out


def refcounts(traces):
    return [sys.getrefcount(s) for trace in traces for s in strings_of(trace)]


def drain(encoder):
    """The payloads; put()'s scratch table has let go of every string by
    now (it is emptied as each put() ends), so the counts can be compared."""
    return [payload for payload, _ in encoder.encode()]


def expected_payloads(version, traces, **limits):
    encoder = spanpack.TraceMsgPackEncoder(version, **limits)
    for trace in traces:
        encoder.put(trace)
    return [payload for payload, _ in encoder.encode()]


@pytest.mark.parametrize("version", VERSIONS)
def test_accepted_traces_leave_each_string_as_it_was(version):
    traces = [make_trace("a"), make_trace("b"), make_trace("c")]
    before = refcounts(traces)
    encoder = spanpack.TraceMsgPackEncoder(version)
    for trace in traces:
        encoder.put(trace)
    # While buffered, the payload holds each string: every count went up.
    assert all(now > then for now, then in zip(refcounts(traces), before))
    assert drain(encoder) == expected_payloads(version, traces)
    assert refcounts(traces) == before


@pytest.mark.parametrize("version", VERSIONS)
def test_a_trace_split_off_into_the_next_payload(version):
    first, second = make_trace("first"), make_trace("second")
    # Room for one trace per payload: the second one is joined to the first
    # payload, rolled back, and joined again to a payload of its own.
    one = len(expected_payloads(version, [first])[0])
    limits = {"max_payload_size": one + 40}
    before = refcounts([first, second])
    encoder = spanpack.TraceMsgPackEncoder(version, **limits)
    encoder.put(first)
    encoder.put(second)
    payloads = drain(encoder)
    assert len(payloads) == 2
    assert payloads == expected_payloads(version, [first, second], **limits)
    assert refcounts([first, second]) == before


@pytest.mark.parametrize("version", VERSIONS)
def test_a_trace_refused_after_a_split(version):
    small, big = make_trace("small", spans=1), make_trace("big", spans=30)
    one = len(expected_payloads(version, [small])[0])
    limits = {"max_payload_size": one + 100}
    before = refcounts([small, big])
    encoder = spanpack.TraceMsgPackEncoder(version, **limits)
    encoder.put(small)
    with pytest.raises(spanpack.BufferItemTooLarge):
        encoder.put(big)  # too large even for a payload of its own
    assert drain(encoder) == expected_payloads(version, [small], **limits)
    assert refcounts([small, big]) == before


@pytest.mark.parametrize("version", VERSIONS)
def test_a_trace_refused_for_a_full_buffer(version):
    first, second = make_trace("first"), make_trace("second")
    one = len(expected_payloads(version, [first])[0])
    limits = {"max_size": one + one // 2}
    before = refcounts([first, second])
    encoder = spanpack.TraceMsgPackEncoder(version, **limits)
    encoder.put(first)
    with pytest.raises(spanpack.BufferFull):
        encoder.put(second)
    assert drain(encoder) == expected_payloads(version, [first], **limits)
    assert refcounts([first, second]) == before


@pytest.mark.parametrize("version", VERSIONS)
def test_a_trace_put_again_after_its_payload_was_taken(version):
    """The scratch table's entries lent to a payload that encode() then
    handed out and freed: the next put() must not release them again."""
    trace = make_trace("again")
    before = refcounts([trace])
    encoder = spanpack.TraceMsgPackEncoder(version)
    for _ in range(3):
        encoder.put(trace)
        assert [p for p, _ in encoder.encode()] == expected_payloads(version, [trace])
    assert refcounts([trace]) == before


@pytest.mark.parametrize("version", VERSIONS)
def test_small_traces_after_a_large_one_reuse_its_kept_table(version):
    """A trace of thousands of strings leaves put()'s scratch table that
    large; the small traces after it take their strings out of it one by one
    (not by rebuilding its index), and each payload is still exactly what a
    fresh encoder writes, with every reference back where it started as soon
    as encode() has returned."""
    large = make_trace("large", spans=800)  # 4,800 distinct strings, above the old 4,096-entry bound
    smalls = [make_trace("small-%d" % i) for i in range(5)]
    traces = [large] + smalls + [large] + smalls
    before = {id(trace): refcounts([trace]) for trace in traces}
    encoder = spanpack.TraceMsgPackEncoder(version)
    for trace in traces:
        encoder.put(trace)
        [(payload, count)] = encoder.encode()
        assert count == 1
        assert payload == spanpack.TraceMsgPackEncoder(version).encode_traces([trace])
        # Released as each put() ends: an encoder left idle keeps no strings.
        assert refcounts([trace]) == before[id(trace)]
