"""An encoder's payload starts on the string table its last payload left
(emptied back to its seed: v0.5's fixed entries, v1.0's "" and payload
fields).  Every payload must still be exactly what a new encoder writes, and
no string of an earlier payload may stay referenced."""

import sys

import pytest

import spanpack

VERSIONS = ["v0.4", "v0.5", "v1.0"]
PAYLOAD_FIELDS = {"v1.0": {"env": "prod", "hostname": "host-1"}}


def make_span(index, name):
    return {
        "trace_id": (1 << 70) | index,
        "span_id": index + 1,
        "name": name,
        "service": "svc-%d" % index,
        "resource": "GET /%d" % (index % 3),
        "start_ns": 1_700_000_000_000_000_000 + index,
        "duration_ns": 1000 + index,
        "meta": {"key-%d" % index: "value-%d" % index, "env": "staging"},
        "metrics": {"m-%d" % (index % 2): float(index)},
    }


def make_traces(round_number, count, spans_per_trace=3):
    return [
        [make_span(round_number * 1000 + t * 10 + s, "op-%d" % (s % 2)) for s in range(spans_per_trace)]
        for t in range(count)
    ]


def new_encoder(version, **kwargs):
    return spanpack.TraceMsgPackEncoder(version, **PAYLOAD_FIELDS.get(version, {}), **kwargs)


def buffered(encoder, traces):
    for trace in traces:
        encoder.put(trace)
    return encoder.encode()


@pytest.mark.parametrize("version", VERSIONS)
def test_every_payload_is_what_a_new_encoder_writes(version):
    reused = new_encoder(version)
    for round_number in range(5):
        traces = make_traces(round_number, round_number + 1)
        assert reused.encode_traces(traces) == new_encoder(version).encode_traces(traces)
        assert buffered(reused, traces) == buffered(new_encoder(version), traces)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_failed_call_leaves_nothing_for_the_next_payload(version):
    reused = new_encoder(version)
    bad = make_span(5, "bad")
    bad["name"] = 5  # not text
    with pytest.raises(TypeError):
        reused.encode_traces(make_traces(1, 2) + [[make_span(7, "fresh-name"), bad]])
    traces = make_traces(2, 2) + [[make_span(7, "fresh-name")]]
    assert reused.encode_traces(traces) == new_encoder(version).encode_traces(traces)


@pytest.mark.parametrize("version", VERSIONS)
def test_after_a_payload_too_big_to_keep_its_table(version):
    # Over 4,096 distinct strings: that table is freed, the next one new.
    reused = new_encoder(version)
    big = make_traces(1, 200, spans_per_trace=10)
    assert reused.encode_traces(big) == new_encoder(version).encode_traces(big)
    small = make_traces(2, 1)
    assert reused.encode_traces(small) == new_encoder(version).encode_traces(small)
    assert buffered(reused, big) == buffered(new_encoder(version), big)
    assert buffered(reused, small) == buffered(new_encoder(version), small)


def test_init_between_payloads_changes_the_seed():
    reused = spanpack.TraceMsgPackEncoder("v1.0", env="first")
    traces = make_traces(1, 2)
    reused.encode_traces(traces)
    buffered(reused, traces)
    for version, fields in [("v1.0", {"env": "second"}), ("v0.5", {}), ("v1.0", {}), ("v0.4", {})]:
        reused.__init__(version, **fields)
        expected = spanpack.TraceMsgPackEncoder(version, **fields)
        assert reused.encode_traces(traces) == expected.encode_traces(traces)
        assert buffered(reused, traces) == buffered(spanpack.TraceMsgPackEncoder(version, **fields), traces)


@pytest.mark.parametrize("version", ["v0.5", "v1.0"])
@pytest.mark.parametrize("entry", ["encode_traces", "put"])
def test_no_string_stays_referenced(version, entry):
    """Only the encoder's own strings (the v0.5 seed, the v1.0 payload
    fields) stay in the table kept for the next payload."""
    encoder = new_encoder(version)
    span = make_span(3, "".join(["a-name-", "made-at-run-time"]))
    values = [span["name"], span["service"], *span["meta"].keys(), *span["meta"].values()]
    before = [sys.getrefcount(value) for value in values]
    if entry == "encode_traces":
        encoder.encode_traces([[span]])
    else:
        buffered(encoder, [[span]])
        # put()'s scratch trace keeps the last trace's strings until the next put().
        buffered(encoder, [[{"trace_id": 1, "span_id": 2, "name": "filler", "start_ns": 0}]])
    assert [sys.getrefcount(value) for value in values] == before


def test_a_span_encoding_with_the_same_encoder_inside_a_call():
    """Span code that encodes with the same encoder while its payload is
    being built: each call's payload is still a new encoder's."""
    encoder = new_encoder("v1.0")
    inner_traces = make_traces(9, 2)
    inner_payloads = []

    class Reentrant:
        __slots__ = ("trace_id", "span_id", "start_ns", "_name")

        def __init__(self):
            self.trace_id, self.span_id, self.start_ns = 1, 2, 0

        @property
        def name(self):
            inner_payloads.append(encoder.encode_traces(inner_traces))
            return "outer-name"

    outer = [[Reentrant()], [make_span(1, "op")]]
    payload = encoder.encode_traces(outer)
    expected = new_encoder("v1.0").encode_traces(outer)  # its span code uses `encoder` again
    assert payload == expected
    assert inner_payloads == [new_encoder("v1.0").encode_traces(inner_traces)] * 2
    assert encoder.encode_traces(outer[1:]) == new_encoder("v1.0").encode_traces(outer[1:])
