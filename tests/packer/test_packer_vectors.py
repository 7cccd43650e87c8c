"""Exact msgpack byte vectors at every format boundary.

Each expected value is written out as hex from the msgpack specification
(https://github.com/msgpack/msgpack/blob/master/spec.md), then checked against
spanpack and cross-checked against msgpack-python, so a wrong vector here is
caught by msgpack itself rather than silently agreed with.

Large values (65536-element arrays, 64 KiB strings) are written as the spec
header in hex followed by a body the test builds from the input value.
"""

import datetime

import msgpack
import pytest

import spanpack
from tests.packer import ext_codes

UTC = datetime.timezone.utc


class Vector:
    """obj packed with options must give bytes.fromhex(head) + tail."""

    def __init__(self, name, obj, head, tail=b"", **options):
        self.name = name
        self.obj = obj
        self.expected = bytes.fromhex(head) + tail
        self.options = options

    def __repr__(self):
        return self.name


def _items(n, item=None):
    return [item] * n


def _nil_body(n):
    return b"\xc0" * n


def _bin_keyed_map(n):
    """A map of n entries, key i = 2-byte big-endian bytes, value None."""
    return {i.to_bytes(2, "big"): None for i in range(n)}


def _bin_keyed_body(n):
    # each entry: bin8 header c4 02, the two key bytes, nil c0
    return b"".join(b"\xc4\x02" + i.to_bytes(2, "big") + b"\xc0" for i in range(n))


VECTORS = [
    # nil / bool
    Vector("nil", None, "c0"),
    Vector("false", False, "c2"),
    Vector("true", True, "c3"),
    # positive fixint
    Vector("posfixint 0", 0, "00"),
    Vector("posfixint 1", 1, "01"),
    Vector("posfixint 127", 127, "7f"),
    # uint 8/16/32/64
    Vector("uint8 128", 128, "cc 80"),
    Vector("uint8 255", 255, "cc ff"),
    Vector("uint16 256", 256, "cd 01 00"),
    Vector("uint16 65535", 65535, "cd ff ff"),
    Vector("uint32 65536", 65536, "ce 00 01 00 00"),
    Vector("uint32 2**32-1", 2**32 - 1, "ce ff ff ff ff"),
    Vector("uint64 2**32", 2**32, "cf 00 00 00 01 00 00 00 00"),
    Vector("uint64 2**63", 2**63, "cf 80 00 00 00 00 00 00 00"),
    Vector("uint64 2**64-1", 2**64 - 1, "cf ff ff ff ff ff ff ff ff"),
    # negative fixint
    Vector("negfixint -1", -1, "ff"),
    Vector("negfixint -32", -32, "e0"),
    # int 8/16/32/64
    Vector("int8 -33", -33, "d0 df"),
    Vector("int8 -128", -128, "d0 80"),
    Vector("int16 -129", -129, "d1 ff 7f"),
    Vector("int16 -32768", -32768, "d1 80 00"),
    Vector("int32 -32769", -32769, "d2 ff ff 7f ff"),
    Vector("int32 -2**31", -(2**31), "d2 80 00 00 00"),
    Vector("int64 -2**31-1", -(2**31) - 1, "d3 ff ff ff ff 7f ff ff ff"),
    Vector("int64 -2**63", -(2**63), "d3 80 00 00 00 00 00 00 00"),
    # fixstr / str8 / str16 / str32 (use_bin_type=True, the default)
    Vector("fixstr 0", "", "a0"),
    Vector("fixstr 1", "a", "a1 61"),
    Vector("fixstr 31", "a" * 31, "bf", b"a" * 31),
    Vector("str8 32", "a" * 32, "d9 20", b"a" * 32),
    Vector("str8 255", "a" * 255, "d9 ff", b"a" * 255),
    Vector("str16 256", "a" * 256, "da 01 00", b"a" * 256),
    Vector("str16 65535", "a" * 65535, "da ff ff", b"a" * 65535),
    Vector("str32 65536", "a" * 65536, "db 00 01 00 00", b"a" * 65536),
    Vector("fixstr 2-byte utf8", "\u00e9", "a2 c3 a9"),
    Vector("fixstr 3-byte utf8", "\u20ac", "a3 e2 82 ac"),
    Vector("fixstr astral", "\U0001f600", "a4 f0 9f 98 80"),
    Vector("str8 at 32 utf8 bytes", "\u00e9" * 16, "d9 20", "\u00e9".encode() * 16),
    Vector("fixstr at 31 utf8 bytes", "a" + "\u00e9" * 15, "bf 61", "\u00e9".encode() * 15),
    # use_bin_type=False: no str8, raw str16 from 32 bytes on
    Vector("old fixstr 31", "a" * 31, "bf", b"a" * 31, use_bin_type=False),
    Vector("old str16 32", "a" * 32, "da 00 20", b"a" * 32, use_bin_type=False),
    Vector("old str16 255", "a" * 255, "da 00 ff", b"a" * 255, use_bin_type=False),
    Vector("old str16 256", "a" * 256, "da 01 00", b"a" * 256, use_bin_type=False),
    Vector("old str16 65535", "a" * 65535, "da ff ff", b"a" * 65535, use_bin_type=False),
    Vector("old str32 65536", "a" * 65536, "db 00 01 00 00", b"a" * 65536, use_bin_type=False),
    # use_bin_type=False packs bytes as raw strings
    Vector("old bytes fixstr 0", b"", "a0", use_bin_type=False),
    Vector("old bytes fixstr 31", b"\x01" * 31, "bf", b"\x01" * 31, use_bin_type=False),
    Vector("old bytes str16 32", b"\x01" * 32, "da 00 20", b"\x01" * 32, use_bin_type=False),
    Vector("old bytearray str16", bytearray(b"\x02" * 300), "da 01 2c", b"\x02" * 300, use_bin_type=False),
    Vector("old memoryview fixstr", memoryview(b"xyz"), "a3 78 79 7a", use_bin_type=False),
    # bin8 / bin16 / bin32
    Vector("bin8 0", b"", "c4 00"),
    Vector("bin8 1", b"\x00", "c4 01 00"),
    Vector("bin8 255", b"\xff" * 255, "c4 ff", b"\xff" * 255),
    Vector("bin16 256", b"\xff" * 256, "c5 01 00", b"\xff" * 256),
    Vector("bin16 65535", b"\xff" * 65535, "c5 ff ff", b"\xff" * 65535),
    Vector("bin32 65536", b"\xff" * 65536, "c6 00 01 00 00", b"\xff" * 65536),
    Vector("bytearray bin8", bytearray(b"ab"), "c4 02 61 62"),
    Vector("memoryview bin8", memoryview(b"ab"), "c4 02 61 62"),
    Vector("memoryview bin16", memoryview(b"\x07" * 256), "c5 01 00", b"\x07" * 256),
    Vector("memoryview cast to int32", memoryview(bytes(range(8))).cast("i"), "c4 08 00 01 02 03 04 05 06 07"),
    # fixarray / array16 / array32
    Vector("fixarray 0", [], "90"),
    Vector("fixarray 1", [1], "91 01"),
    Vector("fixarray 15", _items(15), "9f", _nil_body(15)),
    Vector("array16 16", _items(16), "dc 00 10", _nil_body(16)),
    Vector("array16 65535", _items(65535), "dc ff ff", _nil_body(65535)),
    Vector("array32 65536", _items(65536), "dd 00 01 00 00", _nil_body(65536)),
    Vector("tuple as fixarray", (1, 2), "92 01 02"),
    Vector("tuple as array16", tuple(_items(16)), "dc 00 10", _nil_body(16)),
    # fixmap / map16 / map32
    Vector("fixmap 0", {}, "80"),
    Vector("fixmap 1", {"a": 1}, "81 a1 61 01"),
    Vector("fixmap 15", _bin_keyed_map(15), "8f", _bin_keyed_body(15)),
    Vector("map16 16", _bin_keyed_map(16), "de 00 10", _bin_keyed_body(16)),
    Vector("map16 65535", _bin_keyed_map(65535), "de ff ff", _bin_keyed_body(65535)),
    Vector("map32 65536", _bin_keyed_map(65536), "df 00 01 00 00", _bin_keyed_body(65536)),
    # float32 / float64
    Vector("float64 1.5", 1.5, "cb 3f f8 00 00 00 00 00 00"),
    Vector("float64 0.1", 0.1, "cb 3f b9 99 99 99 99 99 9a"),
    Vector("float64 -0.0", -0.0, "cb 80 00 00 00 00 00 00 00"),
    Vector("float64 0.0", 0.0, "cb 00 00 00 00 00 00 00 00"),
    Vector("float64 inf", float("inf"), "cb 7f f0 00 00 00 00 00 00"),
    Vector("float64 -inf", float("-inf"), "cb ff f0 00 00 00 00 00 00"),
    Vector("float64 nan", float("nan"), "cb 7f f8 00 00 00 00 00 00"),
    Vector("float64 max", 1.7976931348623157e308, "cb 7f ef ff ff ff ff ff ff"),
    Vector("float64 min subnormal", 5e-324, "cb 00 00 00 00 00 00 00 01"),
    Vector("float32 1.5", 1.5, "ca 3f c0 00 00", use_single_float=True),
    Vector("float32 0.1", 0.1, "ca 3d cc cc cd", use_single_float=True),
    Vector("float32 -0.0", -0.0, "ca 80 00 00 00", use_single_float=True),
    Vector("float32 inf", float("inf"), "ca 7f 80 00 00", use_single_float=True),
    Vector("float32 -inf", float("-inf"), "ca ff 80 00 00", use_single_float=True),
    Vector("float32 nan", float("nan"), "ca 7f c0 00 00", use_single_float=True),
    Vector("float32 max", 3.4028234663852886e38, "ca 7f 7f ff ff", use_single_float=True),
    Vector("float32 min subnormal", 1.401298464324817e-45, "ca 00 00 00 01", use_single_float=True),
    Vector("float32 underflow to 0", 1e-46, "ca 00 00 00 00", use_single_float=True),
    # fixext 1/2/4/8/16, ext 8/16/32
    Vector("fixext1", spanpack.ExtType(5, b"\x01"), "d4 05 01"),
    Vector("fixext2", spanpack.ExtType(5, b"\x01\x02"), "d5 05 01 02"),
    Vector("fixext4", spanpack.ExtType(127, b"\x01\x02\x03\x04"), "d6 7f 01 02 03 04"),
    Vector("fixext8", spanpack.ExtType(0, bytes(range(8))), "d7 00 00 01 02 03 04 05 06 07"),
    Vector("fixext16", spanpack.ExtType(1, bytes(range(16))), "d8 01", bytes(range(16))),
    Vector("ext8 0", spanpack.ExtType(5, b""), "c7 00 05"),
    Vector("ext8 3", spanpack.ExtType(5, b"abc"), "c7 03 05 61 62 63"),
    Vector("ext8 17", spanpack.ExtType(5, b"q" * 17), "c7 11 05", b"q" * 17),
    Vector("ext8 255", spanpack.ExtType(5, b"q" * 255), "c7 ff 05", b"q" * 255),
    Vector("ext16 256", spanpack.ExtType(5, b"q" * 256), "c8 01 00 05", b"q" * 256),
    Vector("ext16 65535", spanpack.ExtType(5, b"q" * 65535), "c8 ff ff 05", b"q" * 65535),
    Vector("ext32 65536", spanpack.ExtType(5, b"q" * 65536), "c9 00 01 00 00 05", b"q" * 65536),
    # timestamp 32/64/96 (ext type -1)
    Vector("timestamp32 0", spanpack.Timestamp(0, 0), "d6 ff 00 00 00 00"),
    Vector("timestamp32 max", spanpack.Timestamp(2**32 - 1, 0), "d6 ff ff ff ff ff"),
    Vector("timestamp64 2**32", spanpack.Timestamp(2**32, 0), "d7 ff 00 00 00 01 00 00 00 00"),
    Vector("timestamp64 1ns", spanpack.Timestamp(0, 1), "d7 ff 00 00 00 04 00 00 00 00"),
    Vector(
        "timestamp64 max",
        spanpack.Timestamp(2**34 - 1, 999_999_999),
        "d7 ff ee 6b 27 ff ff ff ff ff",
    ),
    Vector(
        "timestamp96 2**34",
        spanpack.Timestamp(2**34, 0),
        "c7 0c ff 00 00 00 00 00 00 00 04 00 00 00 00",
    ),
    Vector(
        "timestamp96 -1",
        spanpack.Timestamp(-1, 0),
        "c7 0c ff 00 00 00 00 ff ff ff ff ff ff ff ff",
    ),
    Vector(
        "timestamp96 min",
        spanpack.Timestamp(-(2**63), 999_999_999),
        "c7 0c ff 3b 9a c9 ff 80 00 00 00 00 00 00 00",
    ),
    Vector(
        "timestamp96 max",
        spanpack.Timestamp(2**63 - 1, 1),
        "c7 0c ff 00 00 00 01 7f ff ff ff ff ff ff ff",
    ),
    # aware datetimes with datetime=True go out as timestamps
    Vector("datetime epoch", datetime.datetime(1970, 1, 1, tzinfo=UTC), "d6 ff 00 00 00 00", datetime=True),
    Vector(
        "datetime 1s 1us",
        datetime.datetime(1970, 1, 1, 0, 0, 1, 1, tzinfo=UTC),
        "d7 ff 00 00 0f a0 00 00 00 01",
        datetime=True,
    ),
    Vector(
        "datetime before epoch",
        datetime.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC),
        "c7 0c ff 00 00 00 00 ff ff ff ff ff ff ff ff",
        datetime=True,
    ),
    Vector(
        "datetime +01:00",
        datetime.datetime(1970, 1, 1, 1, 0, 2, tzinfo=datetime.timezone(datetime.timedelta(hours=1))),
        "d6 ff 00 00 00 02",
        datetime=True,
    ),
    # a little nesting
    Vector("nested", {"a": [1, -1, None]}, "81 a1 61 93 01 ff c0"),
    Vector("nested bin in array", [b"x", "x"], "92 c4 01 78 a1 78"),
]


@pytest.mark.parametrize("vector", VECTORS, ids=repr)
def test_vector_is_what_msgpack_writes(vector):
    """Cross-check of the hand-written vector itself."""
    assert msgpack.packb(_to_msgpack(vector.obj), **vector.options) == vector.expected


@pytest.mark.parametrize("vector", VECTORS, ids=repr)
def test_packb_vector(vector):
    assert spanpack.packb(vector.obj, **vector.options) == vector.expected


@pytest.mark.parametrize("vector", VECTORS, ids=repr)
def test_packer_vector(vector):
    packer = spanpack.Packer(**vector.options)
    assert packer.pack(vector.obj) == vector.expected
    # the same packer again gives the same bytes (nothing left behind)
    assert packer.pack(vector.obj) == vector.expected


@pytest.mark.parametrize("vector", VECTORS, ids=repr)
def test_streamed_vector(vector):
    packer = spanpack.Packer(autoreset=False, **vector.options)
    assert packer.pack(vector.obj) is None
    assert packer.pack(vector.obj) is None
    assert packer.bytes() == vector.expected * 2


def _to_msgpack(obj):
    if type(obj) is spanpack.ExtType:
        return msgpack.ExtType(obj.code, obj.data)
    if type(obj) is spanpack.Timestamp:
        return msgpack.Timestamp(obj.seconds, obj.nanoseconds)
    return obj


# Container headers written on their own.
HEADER_VECTORS = [
    (0, "90", "80"),
    (1, "91", "81"),
    (15, "9f", "8f"),
    (16, "dc 00 10", "de 00 10"),
    (255, "dc 00 ff", "de 00 ff"),
    (65535, "dc ff ff", "de ff ff"),
    (65536, "dd 00 01 00 00", "df 00 01 00 00"),
    (2**32 - 1, "dd ff ff ff ff", "df ff ff ff ff"),
]


@pytest.mark.parametrize("n, array_hex, map_hex", HEADER_VECTORS)
def test_header_vectors(n, array_hex, map_hex):
    assert msgpack.Packer().pack_array_header(n) == bytes.fromhex(array_hex)
    assert msgpack.Packer().pack_map_header(n) == bytes.fromhex(map_hex)
    assert spanpack.Packer().pack_array_header(n) == bytes.fromhex(array_hex)
    assert spanpack.Packer().pack_map_header(n) == bytes.fromhex(map_hex)


EXT_TYPE_VECTORS = [
    (1, b"\x01", "d4 01 01"),
    (-1, b"\x00" * 4, "d6 ff 00 00 00 00"),
    (-128, b"ab", "d5 80 61 62"),
    (127, b"", "c7 00 7f"),
    (2, b"z" * 8, "d7 02" + "7a" * 8),
    (3, b"z" * 16, "d8 03" + "7a" * 16),
    (4, b"z" * 255, "c7 ff 04" + "7a" * 255),
    (5, b"z" * 256, "c8 01 00 05" + "7a" * 256),
    (6, b"z" * 65536, "c9 00 01 00 00 06" + "7a" * 65536),
]


@pytest.mark.parametrize("code, data, expected_hex", EXT_TYPE_VECTORS, ids=lambda v: str(v)[:20])
def test_pack_ext_type_vectors(code, data, expected_hex):
    expected = bytes.fromhex(expected_hex)
    if ext_codes.msgpack_is_reference(code):  # not -128..-1 where char is unsigned (arm64)
        assert msgpack.Packer().pack_ext_type(code, data) == expected
    assert ext_codes.spec_outcome(code, data) == ("ok", expected)
    assert spanpack.Packer().pack_ext_type(code, data) == expected


EXT_CODE_EDGES = [-129, -128, -127, -56, -1, 0, 1, 127, 128, 200, 255, 256]
EXT_SIZES = [0, 1, 2, 3, 4, 8, 16, 17, 255, 256, 65535, 65536]


@pytest.mark.parametrize("code", EXT_CODE_EDGES)
def test_ext_code_rule(code):
    """spanpack takes the spec's -128..127 on every CPU; tests/packer/ext_codes.py's
    rule is msgpack-python's wherever msgpack-python's char is signed."""
    for size in EXT_SIZES:
        data = b"z" * size
        expected = ext_codes.spec_outcome(code, data)
        try:
            ours = ("ok", spanpack.Packer().pack_ext_type(code, data))
        except OverflowError:
            ours = ("raised", OverflowError)
        assert ours == expected, (code, size)
        if ext_codes.MSGPACK_CHAR_IS_SIGNED:
            try:
                reference = ("ok", msgpack.Packer().pack_ext_type(code, data))
            except OverflowError:
                reference = ("raised", OverflowError)
            assert reference == expected, (code, size)
    if -128 <= code <= 127 and code != -1:  # a decoder reads the code back (-1: timestamps)
        packed = spanpack.Packer().pack_ext_type(code, b"x")
        assert msgpack.unpackb(packed, ext_hook=lambda c, d: (c, d)) == (code, b"x")


def test_msgpack_ext_code_is_a_plain_char():
    """Why the ext code tests consult ext_codes: msgpack-python's rule is
    -128..127 where char is signed and 0..255 where it is unsigned."""
    packer = msgpack.Packer()
    if ext_codes.MSGPACK_CHAR_IS_SIGNED:
        assert packer.pack_ext_type(-1, b"x") == bytes.fromhex("d4 ff 78")
        with pytest.raises(OverflowError):
            packer.pack_ext_type(200, b"x")
    else:
        with pytest.raises(OverflowError):
            packer.pack_ext_type(-1, b"x")
        assert packer.pack_ext_type(200, b"x") == bytes.fromhex("d4 c8 78")


def test_map_pairs_vector():
    pairs = [("a", 1), (2, None), (b"k", [True])]
    expected = bytes.fromhex("83 a1 61 01 02 c0 c4 01 6b 91 c3")
    assert msgpack.Packer().pack_map_pairs(pairs) == expected
    assert spanpack.Packer().pack_map_pairs(pairs) == expected
