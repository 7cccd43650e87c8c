"""Every error says where: an exception of another type than TypeError,
ValueError or AttributeError raised by span code (a property, an int
subclass's __bool__, a links converter's input) keeps its type and its
identity and gets the location as a PEP 678 note, "trace T, span S, field F"
(in __notes__: BaseException.add_note from CPython 3.11, the same list set
directly before), through every entry point and version; the encoder is
left as it was."""

from __future__ import annotations

import pytest

import spanpack

from tests.support import CORE_FIELDS, feed, good_span, raising_property_span

VERSIONS = ("v0.4", "v0.5", "v1.0")
PATHS = ("encode_traces", "put", "encode_trace")

GOOD_BEFORE = [good_span(span_id=11, service="before")]
GOOD_AFTER = [good_span(span_id=12, service="after", meta={"k": "v"})]


class NotFoundError(LookupError):
    """A LookupError subclass of a user's own."""


class TracerError(Exception):
    """A user's exception class."""


EXCEPTION_TYPES = [KeyError, RuntimeError, NotFoundError, TracerError, IndexError,
                   ZeroDivisionError, OSError]


def fresh(version, traces):
    return spanpack.TraceMsgPackEncoder(version).encode_traces(traces)


def check_located(version, path, bad_trace, exception, note):
    """`bad_trace` (as the second trace) raises `exception` itself, with
    exactly one note, `note` with the trace index filled in; the encoder
    then works as a fresh one."""
    encoder = spanpack.TraceMsgPackEncoder(version)
    if path == "put":
        encoder.put(GOOD_BEFORE)
    traces = [GOOD_BEFORE, bad_trace] if path == "encode_traces" else [bad_trace]
    with pytest.raises(type(exception)) as info:
        feed(encoder, path, traces)
    assert info.value is exception
    assert info.value.__notes__ == [note % (1 if path == "encode_traces" else 0)]
    if path == "put":
        encoder.put(GOOD_AFTER)
        assert encoder.encode() == [(fresh(version, [GOOD_BEFORE, GOOD_AFTER]), 2)]
    elif path == "encode_traces":
        assert encoder.encode_traces([GOOD_BEFORE, GOOD_AFTER]) == fresh(
            version, [GOOD_BEFORE, GOOD_AFTER])
    else:
        parts = [encoder.encode_trace(GOOD_BEFORE), encoder.encode_trace(GOOD_AFTER)]
        assert encoder.join_encoded(parts) == fresh(version, [GOOD_BEFORE, GOOD_AFTER])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("exception_type", EXCEPTION_TYPES)
@pytest.mark.parametrize("span_index", [0, 2])
@pytest.mark.parametrize("field", CORE_FIELDS)
def test_property_exception_gets_the_location_as_a_note(field, span_index, exception_type,
                                                        version, path):
    exception = exception_type("from the %s property" % field)
    trace = [good_span(span_id=20 + i) for i in range(3)]
    trace[span_index] = raising_property_span(trace[span_index], field, exception)
    check_located(version, path, trace, exception,
                  "trace %%d, span %d, field %s" % (span_index, field))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("exception_type", EXCEPTION_TYPES)
def test_origin_property_exception_is_located(exception_type, version):
    exception = exception_type("origin")
    values = dict(good_span(), origin="synthetics")
    trace = [raising_property_span(values, "origin", exception)]
    check_located(version, "encode_traces", trace, exception, "trace %d, span 0, field origin")


class BadFlag(int):
    def __bool__(self):
        raise TracerError("error flag")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("version", ["v0.4", "v1.0"])  # v0.5 writes the int itself
def test_error_flag_exception_is_located(version, path):
    trace = [good_span(), good_span(span_id=3, error=BadFlag(1))]
    encoder = spanpack.TraceMsgPackEncoder(version)
    with pytest.raises(TracerError) as info:
        feed(encoder, path, [trace])
    assert info.value.__notes__ == ["trace 0, span 1, field error"]


class FailingLink:
    """A link whose to_dict() (what the links converter calls) fails."""

    def to_dict(self):
        raise NotFoundError("link")


@pytest.mark.parametrize("version", VERSIONS)
def test_links_exception_is_located(version):
    trace = [good_span(), good_span(span_id=3, links=[FailingLink()])]
    with pytest.raises(NotFoundError) as info:
        spanpack.TraceMsgPackEncoder(version).encode_traces([trace])
    assert info.value.__notes__ == ["trace 0, span 1, field links"]


def test_an_exception_raised_again_is_located_once():
    """The same exception object through two encodes keeps one note per
    location (a note is not repeated)."""
    exception = RuntimeError("shared")
    trace = [raising_property_span(good_span(), "service", exception)]
    encoder = spanpack.TraceMsgPackEncoder("v0.4")
    for _ in range(2):
        with pytest.raises(RuntimeError):
            encoder.encode_traces([trace])
    assert exception.__notes__ == ["trace 0, span 0, field service"]


def test_keyboard_interrupt_is_left_alone():
    """Only Exception subclasses are annotated: an interrupt passes as it is."""
    exception = KeyboardInterrupt()
    trace = [raising_property_span(good_span(), "service", exception)]
    with pytest.raises(KeyboardInterrupt) as info:
        spanpack.TraceMsgPackEncoder("v0.4").encode_traces([trace])
    assert info.value is exception
    assert not hasattr(exception, "__notes__")
