"""Every Packer method, option and error path, checked against msgpack 1.2.

Where msgpack defines the behaviour the test compares with msgpack (same bytes,
or an exception of the same type).  Where spanpack deliberately differs (a
`default` callback that mutates the container being packed) the test checks
spanpack's documented behaviour and that nothing crashes.
"""

import collections
import datetime
import enum
import gc
import os
import subprocess
import sys
import tracemalloc
import weakref

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spanpack
from tests.packer import CONTAINER_LEVELS, nest, outcome
from tests.packer import ext_codes
from tests.packer.subclasses import IntSub, FloatSub, StrSub, BytesSub, BytearraySub, ListSub, TupleSub, DictSub, DatetimeSub

UTC = datetime.timezone.utc

# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def to_ref(obj):
    """spanpack ExtType/Timestamp -> msgpack's, through lists/tuples/dicts."""
    t = type(obj)
    if t is spanpack.ExtType:
        return msgpack.ExtType(obj.code, obj.data)
    if t is spanpack.Timestamp:
        return msgpack.Timestamp(obj.seconds, obj.nanoseconds)
    if t in (list, tuple):
        return t(to_ref(x) for x in obj)
    if t is dict:
        return {to_ref(k): to_ref(v) for k, v in obj.items()}
    return obj


def same_as_msgpack(obj, **options):
    """Assert spanpack.packb and msgpack.packb agree on obj; return the outcome."""
    expected = outcome(msgpack.packb, to_ref(obj), **options)
    actual = outcome(spanpack.packb, obj, **options)
    assert actual == expected
    return actual


class Opaque:
    def __init__(self, payload=None):
        self.payload = payload


class DefaultError(Exception):
    pass


SAMPLE = {
    "name": "span",
    "id": 2**40 + 1,
    "neg": -12345,
    "f": 1.25,
    "meta": {"k": "v\u00e4lue", "long": "x" * 40, "b": b"\x00\x01"},
    "list": [None, True, False, (1, 2)],
    "ext": spanpack.ExtType(1, b"x"),
    "ts": spanpack.Timestamp(1, 2),
}


# packable under every option set used here (no tuples for strict_types)
AFTER = {
    "after": [1, -1, 2**40, 1.5, "s\u00e9", b"b", None, True],
    "ext": spanpack.ExtType(1, b"x"),
    "ts": spanpack.Timestamp(1, 2),
}


def ref_packb(obj, **options):
    return msgpack.packb(to_ref(obj), **options)


# --------------------------------------------------------------------------
# constructor and packb arguments
# --------------------------------------------------------------------------


def test_default_options_match_msgpack():
    assert spanpack.Packer().pack(SAMPLE) == msgpack.Packer().pack(to_ref(SAMPLE))
    assert spanpack.packb(SAMPLE) == ref_packb(SAMPLE)


@pytest.mark.parametrize(
    "options",
    [
        {"use_single_float": True},
        {"use_bin_type": False},
        {"strict_types": True, "default": lambda o: list(o) if isinstance(o, tuple) else o},
        {"datetime": True},
        {"unicode_errors": "surrogatepass"},
        {"buf_size": 1},
        {"buf_size": 0},
        {"buf_size": 10**6},
        {"autoreset": True},
    ],
    ids=lambda o: ",".join(o),
)
def test_each_option_matches_msgpack(options):
    obj = dict(SAMPLE, dt=datetime.datetime(2001, 2, 3, 4, 5, 6, 7, tzinfo=UTC), s="\ud800")
    if not options.get("datetime"):
        obj.pop("dt")
    if "unicode_errors" not in options:
        obj.pop("s")
    expected = msgpack.Packer(**options).pack(to_ref(obj))
    assert spanpack.Packer(**options).pack(obj) == expected
    assert spanpack.packb(obj, **options) == expected


@pytest.mark.parametrize(
    "options",
    [
        {"use_single_float": 1},
        {"use_bin_type": 0},
        {"use_bin_type": ""},
        {"strict_types": "yes"},
        {"datetime": []},
        {"autoreset": 0},
        {"unicode_errors": 3},
        {"unicode_errors": None},
        {"buf_size": -1},
        {"buf_size": 2**64},
        {"buf_size": "1"},
        {"default": 1},
        {"default": "str"},
        {"default": None},
    ],
    ids=repr,
)
def test_option_value_handling_matches_msgpack(options):
    expected = outcome(msgpack.Packer, **options)
    actual = outcome(spanpack.Packer, **options)
    assert actual[0] == expected[0]
    if expected[0] == "raised":
        assert actual[1] is expected[1]
        return
    # the options took effect the same way
    obj = [1.5, b"b", "s" * 40, (1,)]
    assert outcome(actual[1].pack, obj) == outcome(expected[1].pack, obj)
    assert actual[1].bytes() == expected[1].bytes()


def test_default_not_callable_raises_type_error():
    with pytest.raises(TypeError):
        spanpack.Packer(default=42)
    with pytest.raises(TypeError):
        spanpack.packb(1, default=42)


@pytest.mark.parametrize("kwargs", [{"foo": 1}, {"use_bin_types": True}, {"encoding": "utf-8"}])
def test_unknown_keyword_raises_type_error(kwargs):
    with pytest.raises(TypeError):
        msgpack.Packer(**kwargs)
    with pytest.raises(TypeError):
        spanpack.Packer(**kwargs)
    with pytest.raises(TypeError):
        spanpack.packb(1, **kwargs)


@pytest.mark.parametrize("args", [(None,), (1,), (lambda o: o,), (None, False)])
def test_positional_arguments_raise_type_error(args):
    with pytest.raises(TypeError):
        msgpack.Packer(*args)
    with pytest.raises(TypeError):
        spanpack.Packer(*args)


def test_packb_arguments():
    with pytest.raises(TypeError):
        spanpack.packb()
    with pytest.raises(TypeError):
        spanpack.packb(1, None)
    with pytest.raises(TypeError):
        spanpack.packb(1, {"use_bin_type": False})


def test_packb_equals_fresh_packer():
    for obj in (SAMPLE, [], "x" * 300, 2**63):
        assert spanpack.packb(obj) == spanpack.Packer().pack(obj) == ref_packb(obj)


def test_packb_with_autoreset_false_matches_msgpack():
    # msgpack.packb is Packer(**kwargs).pack(o): with autoreset=False that is None.
    assert outcome(spanpack.packb, [1, 2], autoreset=False) == outcome(msgpack.packb, [1, 2], autoreset=False)


def test_buf_size_none_is_the_default():
    # spanpack's documented signature has buf_size=None (msgpack 1.2 wants an int).
    packer = spanpack.Packer(buf_size=None)
    assert packer.pack(SAMPLE) == ref_packb(SAMPLE)
    assert spanpack.packb(SAMPLE, buf_size=None) == ref_packb(SAMPLE)


@pytest.mark.parametrize("buf_size", [0, 1, 2, 3, 8, 100])
def test_tiny_buffers_grow(buf_size):
    obj = {"big": b"\x01" * 100_000, "s": "\u20ac" * 70_000, "l": list(range(5000))}
    packer = spanpack.Packer(buf_size=buf_size)
    expected = msgpack.packb(obj)
    assert packer.pack(obj) == expected
    assert packer.pack(obj) == expected
    streaming = spanpack.Packer(buf_size=buf_size, autoreset=False)
    for _ in range(3):
        streaming.pack(obj)
    assert streaming.bytes() == expected * 3


def test_reinit_changes_options_like_msgpack():
    ours, ref = spanpack.Packer(), msgpack.Packer()
    ours.__init__(use_bin_type=False, use_single_float=True)
    ref.__init__(use_bin_type=False, use_single_float=True)
    obj = [b"bytes", 0.1, "s" * 40]
    assert ours.pack(obj) == ref.pack(obj)


def test_uninitialised_packer_does_not_crash():
    packer = spanpack.Packer.__new__(spanpack.Packer)
    for call in (
        lambda: packer.pack([1, "a", b"b"]),
        packer.bytes,
        packer.reset,
        lambda: packer.pack_array_header(3),
        lambda: bytes(packer.getbuffer()),
    ):
        try:
            call()
        except Exception:  # noqa: BLE001 - raising is fine, crashing is not
            pass


# --------------------------------------------------------------------------
# autoreset=False streaming, bytes(), reset()
# --------------------------------------------------------------------------


def test_autoreset_false_streaming():
    objs = [SAMPLE, 1, "two", [3.0], {"four": None}]
    ours = spanpack.Packer(autoreset=False)
    ref = msgpack.Packer(autoreset=False)
    assert ours.bytes() == b""
    for obj in objs:
        assert ours.pack(obj) is None
        ref.pack(to_ref(obj))
        assert ours.bytes() == ref.bytes()
    assert ours.bytes() == b"".join(ref_packb(o) for o in objs)
    assert type(ours.bytes()) is bytes
    assert ours.bytes() == ours.bytes()  # bytes() does not consume
    assert ours.reset() is None
    assert ours.bytes() == b""
    assert ours.pack("again") is None
    assert ours.bytes() == msgpack.packb("again")


def test_autoreset_false_all_methods_return_none():
    ours = spanpack.Packer(autoreset=False)
    ref = msgpack.Packer(autoreset=False)
    calls = [
        ("pack", ([1],)),
        ("pack_array_header", (2,)),
        ("pack_map_header", (1,)),
        ("pack_map_pairs", ([("a", 1)],)),
        ("pack_ext_type", (7, b"abc")),
    ]
    for name, args in calls:
        assert getattr(ours, name)(*args) is None
        getattr(ref, name)(*args)
    assert ours.bytes() == ref.bytes()


def test_autoreset_true_returns_bytes_and_keeps_buffer_empty():
    ours = spanpack.Packer()
    calls = [
        ("pack", ([1],), b"\x91\x01"),
        ("pack_array_header", (2,), b"\x92"),
        ("pack_map_header", (1,), b"\x81"),
        ("pack_map_pairs", ([("a", 1)],), b"\x81\xa1a\x01"),
        ("pack_ext_type", (7, b"abc"), b"\xc7\x03\x07abc"),
    ]
    for name, args, expected in calls:
        assert getattr(ours, name)(*args) == expected
        assert ours.bytes() == b""


def test_failed_call_with_autoreset_false_keeps_earlier_content():
    """docs/packer.md: a failed pack() with autoreset=False keeps what was packed before
    it (a deliberate difference: msgpack 1.2 empties the whole buffer)."""
    packer = spanpack.Packer(autoreset=False)
    packer.pack("kept")
    packer.pack([1, 2])
    kept = msgpack.packb("kept") + msgpack.packb([1, 2])
    failing_calls = [
        lambda: packer.pack([3, object()]),
        lambda: packer.pack({"a": "x" * 1000, "b": 2**64}),
        lambda: packer.pack(_nested(1100, "list", None)),
        lambda: packer.pack_map_pairs([("a", 1), ("b", object())]),
        lambda: packer.pack_ext_type(300, b"x"),
        lambda: packer.pack_array_header(2**32),
        lambda: packer.pack_map_header(-1),
    ]
    for call in failing_calls:
        with pytest.raises((TypeError, OverflowError, ValueError)):
            call()
        assert packer.bytes() == kept
    packer.pack("next")
    assert packer.bytes() == kept + msgpack.packb("next")


# --------------------------------------------------------------------------
# buffer protocol: getbuffer(), memoryview(packer), BufferError
# --------------------------------------------------------------------------


def _filled(lib, obj=SAMPLE):
    packer = lib.Packer(autoreset=False)
    packer.pack(to_ref(obj) if lib is msgpack else obj)
    return packer


def test_getbuffer_contents_and_shape_match_msgpack():
    ours, ref = _filled(spanpack), _filled(msgpack)
    for view, ref_view in ((ours.getbuffer(), ref.getbuffer()), (memoryview(ours), memoryview(ref))):
        assert isinstance(view, memoryview)
        assert bytes(view) == ours.bytes() == ref.bytes()
        for attr in ("readonly", "format", "itemsize", "ndim", "shape", "strides", "nbytes", "c_contiguous"):
            assert getattr(view, attr) == getattr(ref_view, attr), attr
        view.release()
        ref_view.release()


def test_getbuffer_of_empty_packer():
    packer = spanpack.Packer()
    packer.pack(SAMPLE)  # autoreset: nothing stays in the buffer
    with packer.getbuffer() as view:
        assert view.nbytes == 0
        assert bytes(view) == b""


MUTATORS = [
    ("pack", (1,)),
    ("reset", ()),
    ("pack_array_header", (1,)),
    ("pack_map_header", (1,)),
    ("pack_map_pairs", ([(1, 2)],)),
    ("pack_ext_type", (1, b"x")),
]


@pytest.mark.parametrize("autoreset", [False, True])
@pytest.mark.parametrize("name, args", MUTATORS, ids=[m[0] for m in MUTATORS])
def test_buffer_error_while_exported(name, args, autoreset):
    for lib in (msgpack, spanpack):  # msgpack: cross-check of the expectation
        packer = lib.Packer(autoreset=autoreset)
        if not autoreset:
            packer.pack("content")
        before = packer.bytes()
        view = packer.getbuffer()
        with pytest.raises(BufferError):
            getattr(packer, name)(*args)
        assert packer.bytes() == before  # nothing written
        assert bytes(view) == before
        view.release()
        result = getattr(packer, name)(*args)  # fine once released
        if autoreset and name not in ("reset",):
            assert result == getattr(lib.Packer(), name)(*args)


def test_buffer_error_with_memoryview_of_packer_and_context_manager():
    packer = spanpack.Packer(autoreset=False)
    packer.pack([1, 2, 3])
    with memoryview(packer) as view:
        assert bytes(view) == b"\x93\x01\x02\x03"
        with pytest.raises(BufferError):
            packer.pack(4)
        with pytest.raises(BufferError):
            packer.reset()
        assert packer.bytes() == b"\x93\x01\x02\x03"
    packer.pack(4)
    assert packer.bytes() == b"\x93\x01\x02\x03\x04"
    packer.reset()
    assert packer.bytes() == b""


def test_two_exports_need_two_releases():
    packer = spanpack.Packer(autoreset=False)
    packer.pack("x")
    first, second = packer.getbuffer(), memoryview(packer)
    first.release()
    with pytest.raises(BufferError):
        packer.pack("y")
    second.release()
    packer.pack("y")
    assert packer.bytes() == b"\xa1x\xa1y"


def test_export_released_by_garbage_collection():
    packer = spanpack.Packer(autoreset=False)
    packer.pack(1)
    view = packer.getbuffer()
    with pytest.raises(BufferError):
        packer.pack(2)
    del view
    gc.collect()
    packer.pack(2)
    assert packer.bytes() == b"\x01\x02"


def test_view_outlives_packer():
    packer = spanpack.Packer(autoreset=False)
    packer.pack(SAMPLE)
    expected = packer.bytes()
    view = packer.getbuffer()
    del packer
    gc.collect()
    assert bytes(view) == expected
    view.release()


def test_packing_own_buffer_raises_buffer_error():
    for lib in (msgpack, spanpack):
        packer = lib.Packer(autoreset=False)
        packer.pack(b"abc")
        with pytest.raises(BufferError):
            packer.pack(packer.getbuffer())
    # usable afterwards (the temporary view is gone), buffer as msgpack leaves it
    packer.pack(1)
    assert packer.bytes() == _after_own_buffer_error_msgpack()


def _after_own_buffer_error_msgpack():
    packer = msgpack.Packer(autoreset=False)
    packer.pack(b"abc")
    try:
        packer.pack(packer.getbuffer())
    except BufferError:
        pass
    packer.pack(1)
    return packer.bytes()


def test_view_of_another_packer_can_be_packed():
    source = _filled(spanpack)
    target = spanpack.Packer()
    with source.getbuffer() as view:
        assert target.pack(view) == msgpack.packb(source.bytes())


# --------------------------------------------------------------------------
# pack_array_header / pack_map_header
# --------------------------------------------------------------------------


HEADER_SIZES = [
    0, 1, 15, 16, 65535, 65536, 2**32 - 1,
    2**32, 2**32 + 1, 2**63 - 1, 2**63, 2**64, 2**100,
    -1, -15, -(2**31), -(2**32), -(2**32) - 1, -(2**63), -(2**63) - 1, -(2**100),
    True, False, IntSub(17),
    "3", None, b"1", [1],
]  # fmt: skip


@pytest.mark.parametrize("method", ["pack_array_header", "pack_map_header"])
@pytest.mark.parametrize("size", HEADER_SIZES, ids=repr)
def test_header_size_handling_matches_msgpack(method, size):
    expected = outcome(getattr(msgpack.Packer(), method), size)
    packer = spanpack.Packer()
    actual = outcome(getattr(packer, method), size)
    assert actual == expected
    assert packer.pack("after") == msgpack.packb("after")


@pytest.mark.parametrize("method", ["pack_array_header", "pack_map_header"])
def test_header_over_limit_is_value_error(method):
    packer = spanpack.Packer()
    for size in (2**32, 2**32 + 1, 2**63 - 1):
        with pytest.raises(ValueError):
            getattr(packer, method)(size)
    assert getattr(packer, method)(2**32 - 1) == getattr(msgpack.Packer(), method)(2**32 - 1)


def test_headers_then_items_make_a_valid_stream():
    packer = spanpack.Packer(autoreset=False)
    packer.pack_map_header(2)
    packer.pack("a")
    packer.pack_array_header(3)
    for i in range(3):
        packer.pack(i)
    packer.pack(b"k")
    packer.pack_ext_type(3, b"zz")
    assert msgpack.unpackb(packer.bytes(), strict_map_key=False) == {"a": [0, 1, 2], b"k": msgpack.ExtType(3, b"zz")}


# --------------------------------------------------------------------------
# pack_map_pairs
# --------------------------------------------------------------------------

GOOD_PAIRS = [
    [],
    [("a", 1), ("b", [2, 3])],
    (("a", 1), (2, None)),
    [["list", "pair"], (b"k", {"nested": True})],
    [("dup", 1), ("dup", 2)],  # duplicate keys are written as given
    [(i, i) for i in range(16)],
    [("t", spanpack.Timestamp(5, 0)), ("e", spanpack.ExtType(9, b""))],
]
BAD_PAIRS = [
    [(1, 2, 3)],
    [(1,)],
    [1],
    [None],
    [("a", object())],
    [("a", 1), (object(), 2)],
    [("big", 2**64)],
    [("s", "\udcff")],
    "ab",  # two one-character strings: not pairs
    None,
    5,
    iter([("a", 1)]),  # no len()
    (p for p in [("a", 1)]),
]


@pytest.mark.parametrize("pairs", GOOD_PAIRS + BAD_PAIRS, ids=repr)
def test_pack_map_pairs_matches_msgpack(pairs):
    ref_pairs = pairs
    if isinstance(pairs, list):
        ref_pairs = [tuple(to_ref(x) for x in p) if isinstance(p, (tuple, list)) else p for p in pairs]
    expected = outcome(msgpack.Packer().pack_map_pairs, ref_pairs)
    actual = outcome(spanpack.Packer().pack_map_pairs, pairs)
    assert actual == expected


def test_pack_map_pairs_dict_items_and_dict():
    d = {"a": 1, "bc": [2]}
    assert spanpack.Packer().pack_map_pairs(d.items()) == msgpack.Packer().pack_map_pairs(d.items())
    # iterating a dict gives its keys; 2-character keys unpack into pairs
    assert outcome(spanpack.Packer().pack_map_pairs, {"ab": 1, "cd": 2}) == outcome(
        msgpack.Packer().pack_map_pairs, {"ab": 1, "cd": 2}
    )
    assert outcome(spanpack.Packer().pack_map_pairs, d) == outcome(msgpack.Packer().pack_map_pairs, d)


@pytest.mark.parametrize("pairs", BAD_PAIRS, ids=repr)
def test_packer_usable_after_failed_pack_map_pairs(pairs):
    """After a failed call the next pack() gives exactly its own bytes.

    (msgpack 1.2 does not roll back here: its next pack() returns the
    half-written map header in front of the object.)
    """
    packer = spanpack.Packer()
    with pytest.raises(Exception):  # noqa: B017 - type checked above
        packer.pack_map_pairs(pairs)
    assert packer.bytes() == b""
    assert packer.pack(SAMPLE) == ref_packb(SAMPLE)


def test_pack_map_pairs_uses_default_and_options():
    pairs = [("o", Opaque(3)), ("f", 0.5), ("b", b"x")]
    default = lambda o: ["opaque", o.payload]  # noqa: E731
    for options in ({}, {"use_single_float": True, "use_bin_type": False}):
        ours = spanpack.Packer(default=default, **options).pack_map_pairs(pairs)
        ref = msgpack.Packer(default=default, **options).pack_map_pairs(pairs)
        assert ours == ref


# --------------------------------------------------------------------------
# pack_ext_type
# --------------------------------------------------------------------------

EXT_ARGS = [
    (0, b""),
    (127, b"x"),
    (-1, b"\x00\x00\x00\x00"),
    (-128, b"x"),
    (128, b"x"),
    (-129, b"x"),
    (2**64, b"x"),
    (True, b"x"),
    (IntSub(5), b"abc"),
    (1, bytearray(b"ab")),
    (1, b"\x00" * 65536),
    (1, "str"),
    (1, None),
    (1, 5),
    ("1", b"x"),
    (None, b"x"),
]


@pytest.mark.parametrize("code, data", EXT_ARGS, ids=lambda v: repr(v)[:20])
def test_pack_ext_type_matches_msgpack(code, data):
    packer = spanpack.Packer()
    if ext_codes.msgpack_is_reference(code):
        expected = outcome(msgpack.Packer().pack_ext_type, code, data)
    else:  # msgpack-python's code is a plain char, unsigned here (tests/packer/ext_codes.py)
        expected = ext_codes.spec_outcome(code, data)
    assert outcome(packer.pack_ext_type, code, data) == expected
    assert packer.pack("after") == msgpack.packb("after")


def test_ext_type_values_pack_like_pack_ext_type():
    for code, data in [(0, b""), (5, b"a"), (127, b"x" * 300)]:
        packer = spanpack.Packer()
        assert packer.pack(spanpack.ExtType(code, data)) == packer.pack_ext_type(code, data)


# --------------------------------------------------------------------------
# default
# --------------------------------------------------------------------------


def test_default_converts_custom_types_like_msgpack():
    def default(o):
        if isinstance(o, Opaque):
            return {"opaque": o.payload}
        if isinstance(o, set):
            return sorted(o)
        if isinstance(o, int):
            return str(o)
        raise TypeError(type(o).__name__)

    obj = [Opaque([Opaque(1), {3, 1, 2}]), 2**64, -(2**63) - 1, {"s": {5}}]
    assert spanpack.packb(obj, default=default) == msgpack.packb(obj, default=default)


def _recording_default(calls, convert=True):
    def default(o):
        calls.append(o)
        if convert and isinstance(o, Opaque):
            return [o.payload]
        return o

    return default


def test_default_called_with_the_same_objects_in_the_same_order():
    leaf_a, leaf_b, leaf_c = Opaque(Opaque("inner")), Opaque([1, Opaque(2)]), Opaque(None)
    big = 2**65
    obj = {"a": leaf_a, "list": [leaf_b, 1, "s", leaf_c], "big": big}
    ours, ref = [], []
    r1 = outcome(spanpack.packb, obj, default=_recording_default(ours))  # fails at `big`
    r2 = outcome(msgpack.packb, obj, default=_recording_default(ref))
    assert r1 == r2
    assert [id(o) for o in ours] == [id(o) for o in ref]
    assert len(ours) == 6  # leaf_a, its payload, leaf_b, Opaque(2), leaf_c, big


def test_default_not_called_for_supported_types():
    calls = []
    spanpack.packb(SAMPLE, default=_recording_default(calls))
    assert calls == []


@pytest.mark.parametrize(
    "obj",
    [object(), [1, object()], {"k": {1, 2}}, 2**64, -(2**63) - 1, Opaque()],
    ids=["object", "nested", "set", "2**64", "-2**63-1", "opaque"],
)
def test_default_returning_unsupported(obj):
    same = same_as_msgpack(obj, default=lambda o: o)
    assert same[0] == "raised"
    same_as_msgpack(obj, default=lambda o: object())
    same_as_msgpack(obj, default=lambda o: {1, 2})


def test_default_exception_propagates_unchanged():
    error = DefaultError("nope")

    def default(o):
        raise error

    packer = spanpack.Packer(default=default)
    with pytest.raises(DefaultError) as info:
        packer.pack([1, {"x": Opaque()}])
    assert info.value is error
    assert packer.pack(SAMPLE) == ref_packb(SAMPLE)


def test_default_returning_itself_wrapped_hits_nesting_limit():
    same_as_msgpack(Opaque(), default=lambda o: [o])
    with pytest.raises(ValueError):
        spanpack.packb(Opaque(), default=lambda o: [o])


def test_default_for_overflowing_int_subclass_and_strict_types():
    calls_ours, calls_ref = [], []
    obj = [IntSub(2**64), IntSub(5), True, 7]
    for options in ({}, {"strict_types": True}):
        r1 = outcome(spanpack.packb, obj, default=_recording_default(calls_ours, False), **options)
        r2 = outcome(msgpack.packb, obj, default=_recording_default(calls_ref, False), **options)
        assert r1 == r2
    assert [id(o) for o in calls_ours] == [id(o) for o in calls_ref]


# --------------------------------------------------------------------------
# nesting limit
# --------------------------------------------------------------------------


_NESTED_LEVELS = dict(CONTAINER_LEVELS, mixed=lambda obj: [{"k": (obj,)}])


def _nested(depth, kind, leaf):
    """`leaf` inside `depth` levels of one kind ("mixed": a list, a dict, a tuple)."""
    return nest(leaf, depth, [kind], _NESTED_LEVELS)


@pytest.mark.parametrize("kind", ["list", "tuple", "dict", "mixed"])
@pytest.mark.parametrize("leaf", [None, 1, "leaf"], ids=repr)
def test_nesting_limit_boundary_matches_msgpack(kind, leaf):
    steps = 1 if kind != "mixed" else 3  # container levels per _nested step
    window = range(1020 // steps - 2, 1030 // steps + 2)
    seen = set()
    packer = spanpack.Packer()
    for depth in window:
        obj = _nested(depth, kind, leaf)
        expected = outcome(msgpack.packb, obj)
        actual = outcome(spanpack.packb, obj)
        assert actual == expected, f"depth {depth}"
        assert outcome(packer.pack, obj) == expected, f"depth {depth} (reused packer)"
        seen.add(expected[0])
    # the window really contains msgpack's limit, and the limit is ValueError
    assert seen == {"ok", "raised"}
    with pytest.raises(ValueError):
        spanpack.packb(_nested(window[-1], kind, leaf))


def test_nesting_limit_for_map_pairs_and_default_matches_msgpack():
    for depth in range(1018, 1030):
        inner = _nested(depth, "list", None)
        assert outcome(spanpack.Packer().pack_map_pairs, [("k", inner)]) == outcome(
            msgpack.Packer().pack_map_pairs, [("k", inner)]
        ), depth
        wrapped = _nested(depth, "list", Opaque())
        default = lambda o: [None]  # noqa: E731
        assert outcome(spanpack.packb, wrapped, default=default) == outcome(
            msgpack.packb, wrapped, default=default
        ), depth


def test_very_deep_nesting_raises_without_crashing():
    obj = []
    for _ in range(200_000):
        obj = [obj]
    packer = spanpack.Packer()
    with pytest.raises(ValueError):
        packer.pack(obj)
    assert packer.pack(SAMPLE) == ref_packb(SAMPLE)
    cyclic = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError):
        packer.pack(cyclic)
    d = {}
    d["self"] = d
    with pytest.raises(ValueError):
        packer.pack(d)
    assert packer.pack(SAMPLE) == ref_packb(SAMPLE)


# --------------------------------------------------------------------------
# types: ints, bools, subclasses, strings, memoryviews, ext, timestamps, dates
# --------------------------------------------------------------------------


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2**33


class Mode(str, enum.Enum):
    FAST = "fast"


Pair = collections.namedtuple("Pair", "a b")

SUBCLASS_VALUES = [
    IntSub(0), IntSub(-33), IntSub(2**64 - 1), IntSub(-(2**63)), IntSub(2**64),
    Level.LOW, Level.HIGH,
    StrSub(""), StrSub("x" * 40), StrSub("\U0001f600"), Mode.FAST,
    FloatSub(1.5), FloatSub(float("nan")),
    BytesSub(b"ab"), BytearraySub(b"cd"),
    ListSub([1, 2]), TupleSub((3,)), DictSub(a=1), collections.OrderedDict(b=2), Pair(1, "x"),
    True, False, [True, 1, False, 0],
]  # fmt: skip


@pytest.mark.parametrize("value", SUBCLASS_VALUES, ids=repr)
@pytest.mark.parametrize(
    "options",
    [{}, {"strict_types": True}, {"strict_types": True, "default": repr}, {"use_bin_type": False}],
    ids=["plain", "strict", "strict+default", "no-bin"],
)
def test_subclasses_and_bool_match_msgpack(value, options):
    same_as_msgpack(value, **options)
    same_as_msgpack({"k": [value]}, **options)


def test_bool_is_not_an_int():
    for options in ({}, {"strict_types": True}):
        assert spanpack.packb([True, False], **options) == b"\x92\xc3\xc2"
    assert spanpack.packb({True: 1, 0: False}) == msgpack.packb({True: 1, 0: False})


class IntLies(int):
    def __int__(self):
        return 99

    def __index__(self):
        return 99


class FloatLies(float):
    def __float__(self):
        return 99.0


class StrLies(str):
    def __str__(self):
        return "lie"

    def encode(self, *args, **kwargs):
        return b"lie"


class BytesLies(bytes):
    def __bytes__(self):
        return b"lie"

    def __len__(self):
        return 99


class ListReversed(list):
    def __iter__(self):
        return reversed(list(list.__iter__(self)))


class DictUpper(dict):
    def items(self):
        return [(k.upper(), v) for k, v in dict.items(self)]


class TupleReversed(tuple):
    def __iter__(self):
        return reversed(tuple(tuple.__iter__(self)))


HOOK_VALUES = [
    IntLies(5),
    FloatLies(2.5),
    StrLies("true text"),
    BytesLies(b"true bytes"),
    ListReversed([1, 2, 3]),
    TupleReversed((1, 2, 3)),
    DictUpper(a=1, b=2),
]


@pytest.mark.parametrize("value", HOOK_VALUES, ids=lambda v: type(v).__name__)
def test_subclass_with_overridden_hooks_matches_msgpack(value):
    same_as_msgpack(value)
    same_as_msgpack([value, value])


@pytest.mark.parametrize(
    "text", ["", "ascii", "\u00e9\u20ac", "\U0001f600" * 20, "\x00", "\uffff\U0010ffff"], ids=repr
)
@pytest.mark.parametrize("errors", [None, "strict", "surrogatepass", "replace", "ignore"])
def test_valid_unicode_matches_msgpack(text, errors):
    same_as_msgpack(text, unicode_errors=errors)
    same_as_msgpack(StrSub(text), unicode_errors=errors)


@pytest.mark.parametrize("text", ["\ud800", "a\udcffb", "\udbff\udc00", "\U0001f600\ud83d", "x" * 40 + "\udfff"])
@pytest.mark.parametrize(
    "errors",
    [None, "strict", "surrogatepass", "replace", "ignore", "backslashreplace", "surrogateescape", "bogus-handler"],
)
def test_lone_surrogates_match_msgpack(text, errors):
    result = same_as_msgpack(text, unicode_errors=errors)
    if errors in (None, "strict"):
        assert result == ("raised", UnicodeEncodeError)


def test_unknown_error_handler_only_matters_when_needed():
    packer = spanpack.Packer(unicode_errors="no-such-handler")
    assert packer.pack("fine") == msgpack.packb("fine")


MEMORYVIEWS = {
    "plain": lambda: memoryview(b"abc"),
    "empty": lambda: memoryview(b""),
    "bytearray": lambda: memoryview(bytearray(b"xyz")),
    "cast-int": lambda: memoryview(bytes(range(8))).cast("i"),
    "cast-double": lambda: memoryview(bytes(range(16))).cast("d"),
    "2d": lambda: memoryview(bytearray(range(6))).cast("B", (2, 3)),
    "0d": lambda: memoryview(b"\x07").cast("B", ()),
    "strided": lambda: memoryview(b"abcdef")[::2],
    "reversed": lambda: memoryview(b"abcdef")[::-1],
    "strided-one": lambda: memoryview(b"abc")[0:1:2],
    "strided-empty": lambda: memoryview(b"abc")[3::2],
    "slice": lambda: memoryview(b"abcdef")[1:4],
}


@pytest.mark.parametrize("make", MEMORYVIEWS.values(), ids=MEMORYVIEWS.keys())
@pytest.mark.parametrize("options", [{}, {"use_bin_type": False}, {"strict_types": True}], ids=repr)
def test_memoryviews_match_msgpack(make, options):
    packer = spanpack.Packer(**options)
    expected = outcome(msgpack.Packer(**options).pack, [make()])
    assert outcome(packer.pack, [make()]) == expected
    assert packer.pack(AFTER) == ref_packb(AFTER, **options)


def test_non_contiguous_memoryview_is_buffer_error():
    with pytest.raises(BufferError):
        msgpack.packb(memoryview(b"abcdef")[::2])
    with pytest.raises(BufferError):
        spanpack.packb(memoryview(b"abcdef")[::2])


def test_released_memoryview():
    view = memoryview(b"abc")
    view.release()
    same_as_msgpack(view)
    same_as_msgpack([1, view])


def test_memoryview_of_bytearray_is_a_snapshot_at_pack_time():
    data = bytearray(b"abc")
    view = memoryview(data)
    assert spanpack.packb(view) == b"\xc4\x03abc"
    data[0] = ord("z")
    assert spanpack.packb(view) == b"\xc4\x03zbc"


INT_EDGES = sorted(
    {s * 2**k + d for k in (5, 7, 8, 15, 16, 31, 32, 63, 64) for s in (1, -1) for d in (-1, 0, 1)}
)


@pytest.mark.parametrize("value", INT_EDGES)
def test_int_edges_match_msgpack(value):
    result = same_as_msgpack(value)
    if value >= 2**64 or value < -(2**63):
        assert result == ("raised", OverflowError)
    same_as_msgpack(IntSub(value))
    same_as_msgpack(value, default=str)
    same_as_msgpack([value], use_single_float=True, strict_types=True)


@pytest.mark.parametrize("code", [0, 1, 127])
def test_ext_type_and_subclass(code):
    class ExtSub(spanpack.ExtType):
        __slots__ = ()

    class RefExtSub(msgpack.ExtType):
        __slots__ = ()

    for options in ({}, {"strict_types": True}, {"strict_types": True, "default": tuple}):
        assert outcome(spanpack.packb, ExtSub(code, b"ab"), **options) == outcome(
            msgpack.packb, RefExtSub(code, b"ab"), **options
        )
        same_as_msgpack(spanpack.ExtType(code, b"ab"), **options)


@pytest.mark.parametrize(
    "seconds, nanoseconds",
    [(0, 0), (2**32 - 1, 0), (2**32, 0), (0, 1), (2**34 - 1, 999_999_999), (2**34, 0), (-1, 0),
     (-(2**63), 0), (2**63 - 1, 999_999_999), (2**63, 0), (-(2**63) - 1, 0), (2**64, 5)],
)  # fmt: skip
def test_timestamps_match_msgpack(seconds, nanoseconds):
    result = same_as_msgpack(spanpack.Timestamp(seconds, nanoseconds))
    if not -(2**63) <= seconds < 2**63:
        assert result == ("raised", OverflowError)
    same_as_msgpack([spanpack.Timestamp(seconds, nanoseconds)], strict_types=True)


def test_timestamp_subclass_goes_to_default():
    class TsSub(spanpack.Timestamp):
        __slots__ = ()

    class RefTsSub(msgpack.Timestamp):
        __slots__ = ()

    for default in (None, lambda o: [o.seconds, o.nanoseconds]):
        assert outcome(spanpack.packb, TsSub(1, 2), default=default) == outcome(
            msgpack.packb, RefTsSub(1, 2), default=default
        )


class NoOffset(datetime.tzinfo):
    def utcoffset(self, dt):
        return None


class BrokenOffset(datetime.tzinfo):
    def utcoffset(self, dt):
        raise DefaultError("broken tzinfo")


DATETIMES = {
    "utc": datetime.datetime(2024, 2, 29, 12, 0, 0, 123456, tzinfo=UTC),
    "offset": datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=-7, minutes=-30))),
    "epoch": datetime.datetime(1970, 1, 1, tzinfo=UTC),
    "before-epoch": datetime.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    "min": datetime.datetime.min.replace(tzinfo=UTC),
    "max": datetime.datetime.max.replace(tzinfo=UTC),
    "2106": datetime.datetime(2106, 2, 7, 6, 28, 16, tzinfo=UTC),
    "2514": datetime.datetime(2514, 5, 30, 1, 53, 4, tzinfo=UTC),
    "naive": datetime.datetime(2024, 1, 1),
    "no-offset-tzinfo": datetime.datetime(2024, 1, 1, tzinfo=NoOffset()),
    "broken-tzinfo": datetime.datetime(2024, 1, 1, tzinfo=BrokenOffset()),
    "subclass-aware": DatetimeSub(2024, 1, 1, tzinfo=UTC),
    "subclass-naive": DatetimeSub(2024, 1, 1),
    "date": datetime.date(2024, 1, 1),
    "time": datetime.time(1, 2, tzinfo=UTC),
}


@pytest.mark.parametrize("value", DATETIMES.values(), ids=DATETIMES.keys())
@pytest.mark.parametrize(
    "options",
    [{}, {"datetime": True}, {"datetime": True, "default": str}, {"default": str}, {"datetime": True, "strict_types": True}],
    ids=repr,
)
def test_datetimes_match_msgpack(value, options):
    same_as_msgpack(value, **options)
    same_as_msgpack({"when": value}, **options)


def test_naive_datetime_is_value_error_with_datetime_option():
    with pytest.raises(ValueError):
        spanpack.packb(datetime.datetime(2020, 1, 1), datetime=True)
    with pytest.raises(TypeError):
        spanpack.packb(datetime.datetime(2020, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(
    "value",
    [set(), frozenset([1]), 1j, object(), Opaque(), type, len, ..., NotImplemented, range(3),
     {1: 2}.keys(), iter([]), datetime.timedelta(1)],
    ids=repr,
)  # fmt: skip
def test_unsupported_types_are_type_error(value):
    result = same_as_msgpack([1, value])
    assert result == ("raised", TypeError)


def test_dict_keys_of_every_type_match_msgpack():
    obj = {
        None: 1, True: 2, 0: 3, -(2**63): 4, 2**64 - 1: 5, 1.5: 6, "s": 7, b"b": 8,
        (1, "t"): 9, spanpack.ExtType(3, b"k"): 10, spanpack.Timestamp(9, 9): 11,
        IntSub(77): 12, StrSub("sub"): 13,
    }  # fmt: skip
    for options in ({}, {"use_bin_type": False}, {"strict_types": True, "default": repr}):
        same_as_msgpack(obj, **options)


# --------------------------------------------------------------------------
# a Packer stays usable after every kind of error
# --------------------------------------------------------------------------

def _refusing_default(o):
    raise DefaultError(type(o).__name__)


FAILURES = {
    "type": ([1, "x", {"k": object()}], {}),
    "overflow": ({"a": [1, 2, 2**64]}, {}),
    "negative-overflow": ([-(2**63) - 1], {}),
    "depth": (_nested(1100, "list", Opaque()), {"_deep": True}),
    "surrogate": (["ok", "bad \ud800"], {}),
    "naive-datetime": ([datetime.datetime(2020, 1, 1)], {"datetime": True}),
    "default-raises": ([Opaque()], {"default": _refusing_default}),
    "default-unsupported": ([Opaque()], {"default": lambda o: o}),
    "strict-tuple": ([(1, 2)], {"strict_types": True}),
    "single-float-overflow": ([1e300], {"use_single_float": True}),
    "timestamp-overflow": ([spanpack.Timestamp(2**64)], {}),
    "buffer-error": (memoryview(b"abcdef")[::2], {}),
    "big-then-bad": ([b"\x00" * 300_000, object()], {}),
}


@pytest.mark.parametrize("obj, options", FAILURES.values(), ids=FAILURES.keys())
def test_packer_usable_after_error(obj, options):
    # (to_ref would recurse too deep on the "depth" object; it holds no ExtType/Timestamp)
    ref_obj = obj if options.get("_deep") else to_ref(obj)
    options = {k: v for k, v in options.items() if k != "_deep"}
    expected_error = outcome(msgpack.Packer(**options).pack, ref_obj)
    assert expected_error[0] == "raised"
    packer = spanpack.Packer(**options)
    for _ in range(3):
        assert outcome(packer.pack, obj) == expected_error
        assert packer.bytes() == b""
        assert packer.pack(AFTER) == ref_packb(AFTER, **options)
        assert packer.pack_array_header(2) == b"\x92"
    assert spanpack.packb(AFTER, **options) == ref_packb(AFTER, **options)


# --------------------------------------------------------------------------
# subclassing Packer
# --------------------------------------------------------------------------


def _make_subclass(base):
    class TaggingPacker(base):
        def __init__(self, *, tag=b"", **kwargs):
            super().__init__(**kwargs)
            self.tag = tag
            self.count = 0

        def pack(self, obj):
            self.count += 1
            packed = super().pack(obj)
            return None if packed is None else self.tag + packed

    return TaggingPacker


def test_subclassing_packer_like_msgpack():
    RefSub = _make_subclass(msgpack.Packer)  # msgpack's Packer can be subclassed
    OurSub = _make_subclass(spanpack.Packer)
    ref = RefSub(tag=b"T", use_bin_type=False)
    ours = OurSub(tag=b"T", use_bin_type=False)
    assert isinstance(ours, spanpack.Packer)
    for obj in (SAMPLE, b"bytes", [1.5]):
        assert ours.pack(obj) == ref.pack(to_ref(obj))
    assert ours.count == 3
    assert ours.pack_array_header(3) == ref.pack_array_header(3)
    streaming = OurSub(autoreset=False)
    streaming.pack(1)
    streaming.pack(2)
    assert streaming.bytes() == b"\x01\x02"
    with streaming.getbuffer() as view:
        assert bytes(view) == b"\x01\x02"
        with pytest.raises(BufferError):
            streaming.pack(3)
    with pytest.raises(TypeError):
        OurSub(no_such_option=True)


def test_subclass_instances_in_cycles_are_collected():
    OurSub = _make_subclass(spanpack.Packer)

    class Marker:
        pass

    marker = Marker()
    probe = weakref.ref(marker)
    packer = OurSub()
    packer.me = packer
    packer.marker = marker
    del packer, marker
    gc.collect()
    assert probe() is None


def test_packer_default_cycle_is_collected():
    class Marker:
        pass

    probes = {}
    for lib in (msgpack, spanpack):
        marker = Marker()
        probes[lib.__name__] = weakref.ref(marker)
        holder = {}

        def default(o, holder=holder, marker=marker):
            return holder["packer"]  # closes the cycle packer -> default -> packer

        holder["packer"] = lib.Packer(default=default)
        del marker, default, holder
    gc.collect()
    assert probes["msgpack"]() is None  # cross-check: msgpack's Packer takes part in gc
    assert probes["spanpack"]() is None


# --------------------------------------------------------------------------
# ExtType and Timestamp classes
# --------------------------------------------------------------------------


def _assert_constructed_alike(ours_cls, ref_cls, args, *views):
    """ours_cls(*args) raises the type ref_cls(*args) raises, or both build
    objects that every view sees alike."""
    ours, ref = outcome(ours_cls, *args), outcome(ref_cls, *args)
    assert ours[0] == ref[0]
    if ours[0] == "raised":
        assert ours[1] is ref[1]
    else:
        for view in views:
            assert view(ours[1]) == view(ref[1])


@pytest.mark.parametrize(
    "args",
    [(0, b""), (127, b"x"), (128, b""), (-1, b""), (1, bytearray(b"x")), (1, "s"), (1.0, b""), ("1", b""), (True, b"")],
    ids=repr,
)
def test_ext_type_constructor_matches_msgpack(args):
    _assert_constructed_alike(spanpack.ExtType, msgpack.ExtType, args,
                              tuple, lambda ext: (ext.code, ext.data))


@pytest.mark.parametrize(
    "args",
    [(0,), (0, 0), (-5, 999_999_999), (2**70, 1), (0, 10**9), (0, -1), (1.5,), (0, 1.0), ("1",), (True,)],
    ids=repr,
)
def test_timestamp_constructor_matches_msgpack(args):
    _assert_constructed_alike(spanpack.Timestamp, msgpack.Timestamp, args,
                              lambda ts: (ts.seconds, ts.nanoseconds), repr)


def _ts_outcome(fn, *args):
    result = outcome(fn, *args)
    if result[0] == "ok" and isinstance(result[1], (spanpack.Timestamp, msgpack.Timestamp)):
        return ("ok", ("Timestamp", result[1].seconds, result[1].nanoseconds))
    return result


_seconds = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**35), 2**35),
    st.sampled_from([0, -1, 2**32 - 1, 2**32, 2**34 - 1, 2**34, 253402300799, -62135596800]),
)
_nanos = st.integers(0, 999_999_999)


@settings(max_examples=300, deadline=None)
@given(seconds=_seconds, nanoseconds=_nanos)
def test_timestamp_methods_match_msgpack(seconds, nanoseconds):
    ours, ref = spanpack.Timestamp(seconds, nanoseconds), msgpack.Timestamp(seconds, nanoseconds)
    assert ours.to_bytes() == ref.to_bytes()
    assert _ts_outcome(spanpack.Timestamp.from_bytes, ref.to_bytes()) == _ts_outcome(
        msgpack.Timestamp.from_bytes, ref.to_bytes()
    )
    assert ours.to_unix() == ref.to_unix()
    assert ours.to_unix_nano() == ref.to_unix_nano()
    assert _ts_outcome(spanpack.Timestamp.from_unix_nano, ref.to_unix_nano()) == _ts_outcome(
        msgpack.Timestamp.from_unix_nano, ref.to_unix_nano()
    )
    assert outcome(ours.to_datetime) == outcome(ref.to_datetime)
    assert ours == spanpack.Timestamp(seconds, nanoseconds)
    assert hash(ours) == hash(spanpack.Timestamp(seconds, nanoseconds))
    assert ours != spanpack.Timestamp(seconds, (nanoseconds + 1) % 10**9)
    assert repr(ours) == repr(ref)
    packed = spanpack.packb(ours)
    assert packed == msgpack.packb(ref)
    assert packed.endswith(b"\xff" + ref.to_bytes())  # ext type -1, body to_bytes()
    assert msgpack.unpackb(packed) == ref


@settings(max_examples=300, deadline=None)
@given(
    unix=st.one_of(st.floats(-1e11, 1e11), st.integers(-(2**40), 2**40)),
    dt=st.datetimes(timezones=st.sampled_from([UTC, datetime.timezone(datetime.timedelta(hours=3))])),
)
def test_timestamp_conversions_match_msgpack(unix, dt):
    assert _ts_outcome(spanpack.Timestamp.from_unix, unix) == _ts_outcome(msgpack.Timestamp.from_unix, unix)
    assert _ts_outcome(spanpack.Timestamp.from_datetime, dt) == _ts_outcome(msgpack.Timestamp.from_datetime, dt)
    assert spanpack.packb(dt, datetime=True) == msgpack.packb(dt, datetime=True)


@pytest.mark.parametrize(
    "value",
    [datetime.datetime(2020, 5, 17, 10, 11, 12, 13), datetime.datetime(1960, 1, 1), b"\x00" * 5],
    ids=repr,
)
def test_timestamp_from_naive_datetime_or_bad_bytes_matches_msgpack(value):
    fn = "from_bytes" if isinstance(value, bytes) else "from_datetime"
    assert _ts_outcome(getattr(spanpack.Timestamp, fn), value) == _ts_outcome(getattr(msgpack.Timestamp, fn), value)


def test_timestamp_equality_is_per_class():
    assert spanpack.Timestamp(1, 2) == spanpack.Timestamp(1, 2)
    assert spanpack.Timestamp(1, 2) != spanpack.Timestamp(1, 3)
    assert spanpack.Timestamp(1, 2) != (1, 2)


# --------------------------------------------------------------------------
# a `default` that mutates the container being packed (deliberate difference:
# spanpack raises RuntimeError where msgpack may write a corrupt stream)
# --------------------------------------------------------------------------


def _scenario_list_grows():
    target = [1, Opaque(), 2]

    def default(o):
        target.append("extra")
        return 0

    return target, default, "raises"


def _scenario_list_shrinks():
    target = [Opaque(), "a" * 50 + str(id(object())), [str(i) * 20 for i in range(5)]]

    def default(o):
        target.clear()
        return 0

    return target, default, "raises"


def _scenario_outer_list_shrinks():
    target = [[Opaque()], "tail" * 30 + str(id(object())), ["more" * 20]]

    def default(o):
        target.pop()
        target.pop()
        return 0

    return target, default, "raises"


def _scenario_list_subclass_grows():
    target = ListSub([Opaque(), 1])

    def default(o):
        target.extend([2, 3, 4])
        return 0

    return target, default, "raises"


def _scenario_dict_grows():
    target = {"a": Opaque(), "b": 1}

    def default(o):
        target["c"] = 2
        return 0

    return target, default, "raises"


def _scenario_dict_shrinks():
    target = {"a": Opaque(), "b": "v" * 50 + str(id(object())), "c": ["x" * 30]}

    def default(o):
        target.clear()
        return 0

    return target, default, "raises"


def _scenario_nested_dict_grows():
    target = {"outer": {"inner": Opaque()}, "z": 1}

    def default(o):
        target["outer"]["added"] = 1
        target["new"] = 2
        return 0

    return target, default, "raises"


def _scenario_list_item_replaced():
    target = [Opaque(), "old" * 30 + str(id(object())), 3]

    def default(o):
        target[1] = "new value"
        target[0] = "replaced the one being packed"
        return 0

    return target, default, "valid-or-raises"


def _scenario_dict_value_replaced():
    target = {"a": Opaque(), "b": "old" * 30 + str(id(object()))}

    def default(o):
        target["b"] = ["new", "value"]
        target["a"] = None
        return 0

    return target, default, "valid-or-raises"


def _scenario_clear_and_return_unsupported():
    target = [Opaque(), Opaque(), "x" * 64 + str(id(object()))]

    def default(o):
        target.clear()
        return object()

    return target, default, "raises"


MUTATION_SCENARIOS = {
    name[len("_scenario_") :]: fn for name, fn in sorted(globals().items()) if name.startswith("_scenario_")
}


def run_mutation_scenario(name):
    """Pack a mutating scenario; returns a short result string (never crashes)."""
    target, default, expect = MUTATION_SCENARIOS[name]()
    packer = spanpack.Packer(default=default)
    try:
        packed = packer.pack(target)
    except RuntimeError:
        result = "RuntimeError"
    except Exception as exc:  # noqa: BLE001
        result = f"other:{type(exc).__name__}"
    else:
        try:
            msgpack.unpackb(packed, strict_map_key=False)  # one complete, well-formed object
            result = "valid"
        except Exception as exc:  # noqa: BLE001
            result = f"corrupt:{type(exc).__name__}"
    after = packer.pack(SAMPLE) == ref_packb(SAMPLE)
    return f"{name} {result} {'usable' if after else 'broken'}"


def _expected_results(name, expect):
    if expect == "raises":
        allowed = {"RuntimeError"}
        if name == "clear_and_return_unsupported":
            allowed.add("other:TypeError")
    else:
        allowed = {"RuntimeError", "valid"}
    return {f"{name} {r} usable" for r in allowed}


@pytest.mark.parametrize("name", sorted(MUTATION_SCENARIOS))
def test_default_mutating_container(name):
    expect = MUTATION_SCENARIOS[name]()[2]
    for _ in range(3):
        assert run_mutation_scenario(name) in _expected_results(name, expect)


def test_default_mutating_container_under_debug_allocator():
    """The same scenarios in a child process with PYTHONMALLOC=debug, where a
    use of a freed object reads poisoned memory instead of a stale copy."""
    env = dict(os.environ, PYTHONMALLOC="debug", PYTHONFAULTHANDLER="1")
    proc = subprocess.run(
        [sys.executable, "-X", "dev", "-m", "tests.packer.test_packer_api", "--mutation-scenarios"],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == len(MUTATION_SCENARIOS)
    for line in lines:
        name = line.split()[0]
        assert line in _expected_results(name, MUTATION_SCENARIOS[name]()[2])


# --------------------------------------------------------------------------
# memory: no leaks over many calls
# --------------------------------------------------------------------------


# Under AddressSanitizer (tox -e sanitize) freed memory sits in ASan's
# quarantine, so RSS says nothing about leaks there, and every call is several
# times slower: keep the tracemalloc and refcount checks, on fewer calls.
_SANITIZED = "asan" in os.environ.get("LD_PRELOAD", "") or "ASAN_OPTIONS" in os.environ
_ITERATION_SCALE = 0.1 if _SANITIZED else 1.0


def _rss_bytes():
    if _SANITIZED:
        return None
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _refcounts(objs):
    return [sys.getrefcount(o) for o in objs]


# What the measured calls allocate: a tracemalloc frame is the Python line
# running when a block was allocated (this module's, or spanpack's own Python),
# so threads other tests left running (a writer's, the agent's) are not counted.
_OWN_ALLOCATIONS = [
    tracemalloc.Filter(True, __file__),
    tracemalloc.Filter(True, os.path.join(os.path.dirname(spanpack.__file__), "*")),
]


def _run_flat(fn, iterations, max_traced_growth, max_rss_growth):
    iterations = int(iterations * _ITERATION_SCALE)
    for _ in range(iterations // 20):  # warm up caches, free lists, arenas
        fn()
    gc.collect()
    tracemalloc.start()
    try:
        rss_before = _rss_bytes()
        traced_before = tracemalloc.take_snapshot().filter_traces(_OWN_ALLOCATIONS)
        for _ in range(iterations):
            fn()
        gc.collect()
        traced_after = tracemalloc.take_snapshot().filter_traces(_OWN_ALLOCATIONS)
        rss_after = _rss_bytes()
    finally:
        tracemalloc.stop()
    traced_growth = sum(stat.size_diff for stat in traced_after.compare_to(traced_before, "filename"))
    assert traced_growth < max_traced_growth, f"traced memory grew by {traced_growth} bytes"
    if rss_before is not None:
        assert rss_after - rss_before < max_rss_growth, f"RSS grew by {rss_after - rss_before} bytes"


def test_packb_memory_is_flat():
    text = "v\u00e4lue" + str(id(object()))
    big = 2**40 + 12345
    inner = [None, True, 1.25, text, b"\x00\x01"]
    ext = spanpack.ExtType(1, b"x")
    ts = spanpack.Timestamp(1, 2)
    when = datetime.datetime(2020, 1, 1, tzinfo=UTC)
    obj = {"name": "span", "id": big, "inner": inner, "ext": ext, "ts": ts, "when": when, "t": (1, 2)}
    watched = [obj, text, big, inner, ext, ts, when]
    counts = _refcounts(watched)
    expected = ref_packb(obj, datetime=True)
    assert spanpack.packb(obj, datetime=True) == expected

    def call():
        spanpack.packb(obj, datetime=True)

    _run_flat(call, 10**6, max_traced_growth=256 * 1024, max_rss_growth=8 * 1024 * 1024)
    assert _refcounts(watched) == counts


def test_reused_packer_and_options_memory_is_flat():
    text = "s\ud800" + str(id(object()))
    opaque = Opaque([1, 2])
    obj = [text, opaque, 2**70, {"k": [b"b" * 40]}]
    watched = [obj, text, opaque]
    counts = _refcounts(watched)

    def default(o):
        return o.payload if isinstance(o, Opaque) else str(o)

    packer = spanpack.Packer(default=default, unicode_errors="surrogatepass", use_single_float=True)
    streaming = spanpack.Packer(autoreset=False)
    expected = msgpack.packb(obj, default=default, unicode_errors="surrogatepass")

    def call():
        packer.pack(obj)
        streaming.pack_map_pairs([("k", 1), ("l", [2])])
        streaming.pack_ext_type(3, b"xyz")
        with streaming.getbuffer():
            pass
        streaming.reset()

    assert packer.pack(obj) == expected
    _run_flat(call, 2 * 10**5, max_traced_growth=256 * 1024, max_rss_growth=8 * 1024 * 1024)
    assert _refcounts(watched) == counts


def test_failing_calls_memory_is_flat():
    bad_object = object()
    bad_text = "bad \udcff" + str(id(object()))
    huge = 2**64 + 7
    naive = datetime.datetime(2020, 1, 1)
    opaque = Opaque()
    noncontig = memoryview(b"abcdef")[::2]
    containers = [
        [1, "ok", {"k": bad_object}],
        {"h": huge},
        ["s", bad_text],
        [naive],
        (opaque,),
        [noncontig],
    ]
    watched = [bad_object, bad_text, huge, naive, opaque, noncontig] + containers
    counts = _refcounts(watched)

    def refuse(o):
        raise DefaultError("refused")

    plain = spanpack.Packer(datetime=True)
    refusing = spanpack.Packer(default=refuse)
    streaming = spanpack.Packer(autoreset=False)
    streaming.pack("keep")
    deep = _nested(1100, "list", None)

    state = {"i": 0}

    def call():
        i = state["i"] = state["i"] + 1
        for packer in (plain, refusing):
            for obj in containers:
                try:
                    packer.pack(obj)
                except (TypeError, OverflowError, UnicodeEncodeError, ValueError, BufferError, DefaultError):
                    pass
        try:
            plain.pack_map_pairs([("a", 1), ("b", bad_object)])
        except TypeError:
            pass
        try:
            plain.pack_ext_type(300, b"x")
        except OverflowError:
            pass
        with streaming.getbuffer():
            try:
                streaming.pack(1)
            except BufferError:
                pass
        if i % 1000 == 0:
            try:
                plain.pack(deep)
            except ValueError:
                pass

    _run_flat(call, 10**5 // 8, max_traced_growth=256 * 1024, max_rss_growth=8 * 1024 * 1024)
    assert _refcounts(watched) == counts
    assert plain.pack(SAMPLE) == ref_packb(SAMPLE)


if __name__ == "__main__" and sys.argv[1:] == ["--mutation-scenarios"]:
    for _name in sorted(MUTATION_SCENARIOS):
        print(run_mutation_scenario(_name), flush=True)
