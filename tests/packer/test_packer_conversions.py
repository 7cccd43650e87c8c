"""How the Packer reads values and arguments that are not plain ints, str or
bytes, checked against msgpack-python 1.2.4 directly.

msgpack-python's compiled Packer reads an int subclass through its own `> 0`
comparison, reads integer arguments (buf_size, header sizes, ext codes) through
`__int__` (so a float counts, an object with only `__index__` does not), and
reads unicode_errors and ext data as C strings (ASCII str, bytes, bytearray).
Each case here compares spanpack's outcome (bytes, or exception type) with
msgpack's.  The last section pins where spanpack deliberately differs (docs/packer.md,
"The Packer").
"""

import array
import warnings

import msgpack
import pytest

import spanpack
from tests.packer import ext_codes, outcome
from tests.packer.subclasses import IntSub, StrSub, BytesSub, BytearraySub


# --------------------------------------------------------------------------
# int subclasses whose comparison or conversion hooks lie
# --------------------------------------------------------------------------


class SaysNotPositive(int):
    def __gt__(self, other):
        return False


class SaysPositive(int):
    def __gt__(self, other):
        return True


class ConversionHooksLie(int):
    """msgpack never calls these for an int subclass: the value is read directly."""

    def __gt__(self, other):
        return False

    def __index__(self):
        return 7

    def __int__(self):
        return 7


class ComparisonOverflows(int):
    def __gt__(self, other):
        raise OverflowError("from __gt__")


class ComparisonFails(int):
    def __gt__(self, other):
        raise ZeroDivisionError("from __gt__")


class TruthOverflows:
    def __bool__(self):
        raise OverflowError("from __bool__")


class ComparisonAnswerFails(int):
    def __gt__(self, other):
        return TruthOverflows()


class ComparisonNotImplemented(int):
    def __gt__(self, other):
        return NotImplemented


LYING_INTS = [
    SaysNotPositive,
    SaysPositive,
    ConversionHooksLie,
    ComparisonOverflows,
    ComparisonFails,
    ComparisonAnswerFails,
    ComparisonNotImplemented,
]
INT_VALUES = [
    0, 1, 127, 128, 255, 256, 2**32, 2**63 - 1, 2**63, 2**63 + 5, 2**64 - 1, 2**64,
    -1, -32, -33, -(2**31), -(2**63), -(2**63) - 1,
]  # fmt: skip


def _to_text(obj):
    return "converted %d" % int.__index__(obj)


@pytest.mark.parametrize("value", INT_VALUES)
@pytest.mark.parametrize("cls", LYING_INTS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("options", [{}, {"default": _to_text}], ids=["no-default", "default"])
def test_int_subclass_with_lying_hooks_matches_msgpack(cls, value, options):
    obj = cls(value)
    expected = outcome(msgpack.packb, obj, **options)
    assert outcome(spanpack.packb, obj, **options) == expected
    assert outcome(spanpack.Packer(**options).pack, [obj]) == outcome(msgpack.Packer(**options).pack, [obj])


def test_int_subclass_reported_case():
    """The review's case: 2**63 + 5 whose `>` says no is out of int64 range."""
    obj = ConversionHooksLie(2**63 + 5)
    with pytest.raises(OverflowError):
        msgpack.packb(obj)
    with pytest.raises(OverflowError):
        spanpack.packb(obj)


# --------------------------------------------------------------------------
# integer arguments: buf_size, header sizes, ext codes
# --------------------------------------------------------------------------


class OnlyInt:
    def __int__(self):
        return 3


class OnlyIndex:
    def __index__(self):
        return 3


class IntReturnsSubclass:
    def __int__(self):
        return IntSub(2)


class IntReturnsFloat:
    def __int__(self):
        return 3.0


class IntRaises:
    def __int__(self):
        raise ZeroDivisionError("from __int__")


INT_ARGUMENTS = [
    1.5, -0.5, 2.9, float("nan"), float("inf"), -1.5,
    OnlyInt(), OnlyIndex(), IntReturnsSubclass(), IntReturnsFloat(), IntRaises(),
    ConversionHooksLie(4), True, "3", b"1", None,
]  # fmt: skip


def _quietly(fn, *args, **kwargs):
    # an __int__ returning an int subclass warns (DeprecationWarning) in both
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return outcome(fn, *args, **kwargs)


@pytest.mark.parametrize("method", ["pack_array_header", "pack_map_header"])
@pytest.mark.parametrize("size", INT_ARGUMENTS, ids=repr)
def test_header_size_conversion_matches_msgpack(method, size):
    expected = _quietly(getattr(msgpack.Packer(), method), size)
    assert _quietly(getattr(spanpack.Packer(), method), size) == expected


@pytest.mark.parametrize("code", INT_ARGUMENTS + [-128.9, 127.9, 128.0, -129.0], ids=repr)
def test_ext_code_conversion_matches_msgpack(code):
    if ext_codes.msgpack_is_reference(code):
        expected = _quietly(msgpack.Packer().pack_ext_type, code, b"ab")
    else:  # msgpack-python's code is a plain char, unsigned here (tests/packer/ext_codes.py)
        expected = ext_codes.spec_outcome(code, b"ab")
    assert _quietly(spanpack.Packer().pack_ext_type, code, b"ab") == expected


@pytest.mark.parametrize("buf_size", [arg for arg in INT_ARGUMENTS if arg is not None] + [-1, 2**64], ids=repr)
def test_buf_size_conversion_matches_msgpack(buf_size):
    obj = {"a": [1, 2.5, "x" * 40]}
    expected = _quietly(lambda: msgpack.Packer(buf_size=buf_size).pack(obj))
    assert _quietly(lambda: spanpack.Packer(buf_size=buf_size).pack(obj)) == expected
    assert _quietly(lambda: spanpack.packb(obj, buf_size=buf_size)) == expected


class CountsConversions:
    def __init__(self):
        self.count = 0

    def __int__(self):
        self.count += 1
        return 600

    __index__ = __int__


def test_buf_size_is_converted_once_like_msgpack():
    counts = []
    for lib in (msgpack, spanpack):
        buf_size = CountsConversions()
        assert lib.Packer(buf_size=buf_size).pack([1]) == msgpack.packb([1])
        counts.append(buf_size.count)
    assert counts[1] == counts[0] == 1


def test_timestamp_fields_replaced_after_construction_match_msgpack():
    for seconds, nanoseconds in [(1.5, 0), (OnlyInt(), 2.7), (OnlyIndex(), 0), (1, OnlyIndex()), ("1", 0)]:
        results = []
        for lib in (msgpack, spanpack):
            stamp = lib.Timestamp(1, 0)
            stamp.seconds = seconds
            stamp.nanoseconds = nanoseconds
            results.append(outcome(lib.packb, stamp))
        assert results[1] == results[0], (seconds, nanoseconds)


# --------------------------------------------------------------------------
# C string arguments: unicode_errors and ext data
# --------------------------------------------------------------------------


UNICODE_ERRORS = [
    "replace", b"replace", bytearray(b"replace"), BytesSub(b"surrogatepass"),
    StrSub("ignore"), b"strict", "\u00e9", b"\xff", b"no-such-handler",
    b"repl\x00ace", "repl\x00ace", memoryview(b"replace"), 5, [],
]  # fmt: skip


@pytest.mark.parametrize("errors", UNICODE_ERRORS, ids=repr)
@pytest.mark.parametrize("text", ["plain", "lone \udc80 surrogate"])
def test_unicode_errors_argument_matches_msgpack(errors, text):
    expected = outcome(msgpack.packb, text, unicode_errors=errors)
    assert outcome(spanpack.packb, text, unicode_errors=errors) == expected
    assert outcome(lambda: spanpack.Packer(unicode_errors=errors).pack(text)) == expected


def test_unicode_errors_bytearray_is_read_when_the_packer_is_made():
    errors = bytearray(b"replace")
    packer = spanpack.Packer(unicode_errors=errors)
    errors[:] = b"strict"
    assert packer.pack("\udc80") == msgpack.packb("\udc80", unicode_errors="replace")


EXT_DATA = [
    b"ab", "ab", "", "\u00e9", StrSub("ab"), StrSub("\u00e9"), "\udc80",
    BytesSub(b"ab"), bytearray(b"ab"), BytearraySub(b"ab"),
    memoryview(b"ab"), array.array("b", [1, 2]), None, 5, [1, 2],
]  # fmt: skip


@pytest.mark.parametrize("data", EXT_DATA, ids=repr)
def test_pack_ext_type_data_matches_msgpack(data):
    expected = outcome(msgpack.Packer().pack_ext_type, 1, data)
    packer = spanpack.Packer()
    assert outcome(packer.pack_ext_type, 1, data) == expected
    assert packer.pack("after") == msgpack.packb("after")


def _ext_subclass(lib):
    """An ExtType subclass that skips the constructor's checks."""

    class Unchecked(lib.ExtType):
        def __new__(cls, code, data):
            return tuple.__new__(cls, (code, data))

    return Unchecked


@pytest.mark.parametrize(
    "code, data",
    [
        (1.5, b"x"), (300, b"x"), (-200, b"x"), (OnlyInt(), b"x"), (OnlyIndex(), b"x"), ("1", b"x"),
        (1, "ab"), (1, "\u00e9"), (1, memoryview(b"x")), (1, bytearray(b"xy")), (1, None),
        (2**64, "\u00e9"),
    ],
    ids=repr,
)
def test_ext_type_subclass_without_checks_matches_msgpack(code, data):
    expected = outcome(msgpack.packb, _ext_subclass(msgpack)(code, data))
    assert outcome(spanpack.packb, _ext_subclass(spanpack)(code, data)) == expected


# --------------------------------------------------------------------------
# deliberate differences (docs/packer.md)
# --------------------------------------------------------------------------


FAILING_AFTER_A_HEADER = [
    ("pack_map_pairs", ([("a", 1), ("b", object())],)),
    ("pack_map_pairs", ([(1, 2, 3)],)),
    ("pack_ext_type", (1, "\u00e9")),
    ("pack_ext_type", (1, memoryview(b"ab"))),
]


@pytest.mark.parametrize("method, args", FAILING_AFTER_A_HEADER, ids=repr)
def test_failed_call_leaves_no_partial_header(method, args):
    """msgpack keeps the header it wrote before failing; spanpack keeps nothing."""
    buffers = []
    for lib in (msgpack, spanpack):
        packer = lib.Packer(autoreset=False)
        packer.pack("before")
        failed = outcome(getattr(packer, method), *args)
        assert failed[0] == "raised"
        buffers.append(packer.bytes())
    ref_buffer, our_buffer = buffers
    before = msgpack.packb("before")
    assert our_buffer == before
    assert ref_buffer.startswith(before) and len(ref_buffer) > len(before)


class ItemsDisagreeWithLen(dict):
    def items(self):
        return [("x", 1), ("y", 2)]


class IterDisagreesWithLen(tuple):
    def __iter__(self):
        return iter([1])


class PairsLenLies(list):
    def __len__(self):
        return 5


@pytest.mark.parametrize(
    "make, call",
    [
        (lambda: ItemsDisagreeWithLen(a=1), "pack"),
        (lambda: IterDisagreesWithLen((1, 2, 3)), "pack"),
        (lambda: [IterDisagreesWithLen((1, 2))], "pack"),
        (lambda: PairsLenLies([("k", "v")]), "pack_map_pairs"),
    ],
    ids=["dict-items", "tuple-iter", "nested", "pairs-len"],
)
def test_count_that_disagrees_with_items_raises(make, call):
    """msgpack writes a header count that does not match what follows (its
    output does not decode); spanpack raises RuntimeError and keeps nothing."""
    ref = getattr(msgpack.Packer(), call)(make())
    with pytest.raises(ValueError):  # msgpack's ExtraData, or incomplete input
        msgpack.unpackb(ref)
    packer = spanpack.Packer(autoreset=False)
    packer.pack("kept")
    with pytest.raises(RuntimeError):
        getattr(packer, call)(make())
    assert packer.bytes() == msgpack.packb("kept")


class LenLies(bytes):
    def __len__(self):
        return 99


def test_ext_data_with_lying_len_is_written_by_its_real_bytes():
    """msgpack takes len(data) as the size and reads past the object's end
    (so it is not called here); spanpack writes the bytes the object holds."""
    data = LenLies(b"abc")
    assert spanpack.Packer().pack_ext_type(5, data) == msgpack.Packer().pack_ext_type(5, b"abc")


def test_buf_size_none_is_the_default_where_msgpack_refuses_it():
    with pytest.raises(TypeError):
        msgpack.Packer(buf_size=None)
    assert spanpack.Packer(buf_size=None).pack([1, "a"]) == msgpack.packb([1, "a"])
