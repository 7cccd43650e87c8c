"""Differential property tests: spanpack's Packer and packb against msgpack 1.2.

For random objects and random Packer options the bytes spanpack writes must
be the bytes msgpack writes, and where msgpack raises, spanpack must raise an
exception of exactly the same type.  spanpack.ExtType / spanpack.Timestamp
values are mapped to msgpack.ExtType / msgpack.Timestamp for the reference.

Example budgets come from a hypothesis profile registered below; choose one
with SPANPACK_PACKER_PROFILE=spanpack-packer-{ci,dev,thorough} (default: ci,
which runs several thousand examples in well under a minute).
"""

import collections
import datetime
import enum
import math
import os
import struct

import msgpack
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import spanpack
from tests.packer import CONTAINER_LEVELS, FixedOffset, ext_codes, nest
from tests.packer.subclasses import IntSub, FloatSub, StrSub, BytesSub, BytearraySub, ListSub, TupleSub, DictSub, DatetimeSub

# --------------------------------------------------------------------------
# hypothesis profiles (registered here, not in conftest, and never loaded
# globally: each test derives its own settings from the chosen profile)
# --------------------------------------------------------------------------

_SUPPRESSED = [
    getattr(HealthCheck, name)
    for name in ("too_slow", "data_too_large", "filter_too_much", "large_base_example")
    if hasattr(HealthCheck, name)
]
settings.register_profile(
    "spanpack-packer-ci",
    max_examples=2000,
    deadline=None,
    suppress_health_check=_SUPPRESSED,
    print_blob=True,
)
settings.register_profile(
    "spanpack-packer-dev", settings.get_profile("spanpack-packer-ci"), max_examples=200
)
settings.register_profile(
    "spanpack-packer-thorough", settings.get_profile("spanpack-packer-ci"), max_examples=20000
)
_PROFILE = settings.get_profile(os.environ.get("SPANPACK_PACKER_PROFILE", "spanpack-packer-ci"))


def budget(fraction):
    """Settings for a test that gets `fraction` of the profile's main budget."""
    return settings(_PROFILE, max_examples=max(10, int(_PROFILE.max_examples * fraction)))


# --------------------------------------------------------------------------
# value types used by the generated objects
# --------------------------------------------------------------------------


Point = collections.namedtuple("Point", "x y")


class Color(enum.IntEnum):
    RED = 1
    BIG = 2**40
    NEG = -(2**40)
    HUGE = 2**64  # out of range: needs `default`


class Tag(str, enum.Enum):
    ALPHA = "alpha"
    BETA = "\u03b2eta"
    LONG = "t" * 40


class Opaque:
    """Not packable by itself; `default_convert` turns it into a list."""

    __slots__ = ("payload",)

    def __init__(self, payload):
        self.payload = payload

    def __repr__(self):
        return f"Opaque({self.payload!r})"


def _subclass(base, name):
    try:
        return type(name, (base,), {"__slots__": ()})
    except TypeError:  # not subclassable: the strategies leave it out
        return None


SpExtSub = _subclass(spanpack.ExtType, "SpExtSub")
RefExtSub = _subclass(msgpack.ExtType, "RefExtSub")
SpTimestampSub = _subclass(spanpack.Timestamp, "SpTimestampSub")
RefTimestampSub = _subclass(msgpack.Timestamp, "RefTimestampSub")


def to_ref(obj):
    """The same object with spanpack's ExtType/Timestamp swapped for msgpack's."""
    t = type(obj)
    if t is spanpack.ExtType:
        return msgpack.ExtType(obj.code, obj.data)
    if SpExtSub is not None and t is SpExtSub:
        return RefExtSub(obj.code, obj.data)
    if t is spanpack.Timestamp:
        return msgpack.Timestamp(obj.seconds, obj.nanoseconds)
    if SpTimestampSub is not None and t is SpTimestampSub:
        return RefTimestampSub(obj.seconds, obj.nanoseconds)
    if t in (list, ListSub, tuple, TupleSub):
        return t(to_ref(item) for item in obj)
    if t is Point:
        return Point(to_ref(obj.x), to_ref(obj.y))
    if t in (dict, DictSub, collections.OrderedDict):
        return t((to_ref(k), to_ref(v)) for k, v in obj.items())
    if t is Opaque:
        return Opaque(to_ref(obj.payload))
    return obj


# --------------------------------------------------------------------------
# `default` callbacks (shared by both sides, so they treat the two libraries'
# ExtType/Timestamp classes alike)
# --------------------------------------------------------------------------


class DefaultRefused(Exception):
    pass


def _sort_key(item):
    return (type(item).__name__, item)


def default_convert(o):
    if isinstance(o, Opaque):
        return ["opaque", o.payload]
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=_sort_key)
    if isinstance(o, (spanpack.Timestamp, msgpack.Timestamp)):
        return [o.seconds, o.nanoseconds]
    if isinstance(o, datetime.datetime):
        return o.isoformat()
    if isinstance(o, datetime.date):
        return o.toordinal()
    if isinstance(o, complex):
        return [o.real, o.imag]
    if isinstance(o, int):
        value = int(o)
        return value if -(2**63) <= value < 2**64 else str(value)
    if isinstance(o, float):
        return float(o)
    if isinstance(o, str):
        return str.__str__(o)
    if isinstance(o, (bytes, bytearray)):
        return bytes(o)
    if isinstance(o, dict):
        return dict(o)
    if isinstance(o, (list, tuple)):
        return list(o)
    return o


def default_identity(o):
    return o


def default_refuse(o):
    raise DefaultRefused(type(o).__name__)


def default_wrap(o):
    return [o]  # never packable in the end: recurses until the nesting limit


DEFAULTS = [None, default_convert, default_identity, default_refuse, default_wrap]


def outcome(fn, *args, **kwargs):
    """("ok", result) or ("raised", exception type)."""
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - the type is what gets compared
        return ("raised", type(exc))


# --------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------

_BITS = (5, 7, 8, 15, 16, 31, 32, 63, 64)
BOUNDARY_INTS = sorted(
    {sign * 2**k + d for k in _BITS for sign in (1, -1) for d in (-1, 0, 1)}
    | {0, 1, -1, 2**65, -(2**65), 2**64 + 2**63, 2**100, -(2**100)}
)
plain_ints = st.one_of(
    st.sampled_from(BOUNDARY_INTS),
    st.integers(-(2**63), 2**64 - 1),
    st.integers(-(2**70), 2**70),
    st.integers(-40, 300),
)
int_like = st.one_of(plain_ints, plain_ints.map(IntSub), st.sampled_from(list(Color)))


def _f64(bits):
    return struct.unpack(">d", bits.to_bytes(8, "big"))[0]


FLT_MAX = struct.unpack(">f", bytes.fromhex("7f7fffff"))[0]
_FLT_ROUNDING_MIDPOINT = FLT_MAX + 2.0**103  # halfway to the next float32 step
SPECIAL_FLOATS = [
    0.0,
    -0.0,
    math.inf,
    -math.inf,
    math.nan,
    -math.nan,
    _f64(0x7FF0000000000001),  # signalling NaN
    _f64(0xFFF8000000000000),
    _f64(0x7FF8000000000001),
    _f64(0x7FFFFFFFFFFFFFFF),
    _f64(0xFFF0000000000001),
    5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    -1.7976931348623157e308,
    FLT_MAX,
    -FLT_MAX,
    math.nextafter(FLT_MAX, math.inf),
    _FLT_ROUNDING_MIDPOINT,
    -_FLT_ROUNDING_MIDPOINT,
    math.nextafter(_FLT_ROUNDING_MIDPOINT, 0.0),
    math.nextafter(_FLT_ROUNDING_MIDPOINT, math.inf),
    1e39,
    1.401298464324817e-45,
    7.006492321624085e-46,
    1e-46,
    0.1,
    1 / 3,
    16777217.0,
]
plain_floats = st.one_of(
    st.sampled_from(SPECIAL_FLOATS),
    st.floats(),
    st.floats(width=32),
    st.floats(-4e38, 4e38),
)
float_like = st.one_of(plain_floats, plain_floats.map(FloatSub))

SPECIAL_CHARS = [
    "\x00", "a", "\x7f", "\x80", "\u00e9", "\u07ff", "\u0800", "\u20ac", "\ufffd",
    "\uffff", "\U00010000", "\U0001f600", "\U0001d11e", "\U0010ffff",
    "\ud800", "\udbff", "\udc00", "\udfff", "\udc80", "\udcff",
]  # fmt: skip
chars = st.one_of(
    st.sampled_from(SPECIAL_CHARS),
    st.characters(),
    st.characters(categories=["Cs"]),  # lone surrogates
)
short_text = st.text(chars, max_size=12)
_STR_PREFIX_LENGTHS = sorted({b + d for b in (32, 256, 65536) for d in range(-5, 2)})
plain_text = st.one_of(
    short_text,
    st.text(chars, max_size=40),
    st.builds(lambda n, tail: "x" * n + tail, st.sampled_from(_STR_PREFIX_LENGTHS), st.text(chars, max_size=3)),
)
text_like = st.one_of(plain_text, plain_text.map(StrSub), st.sampled_from(list(Tag)))

_BIN_LENGTHS = sorted({0, 1, 31, 32} | {b + d for b in (256, 65536) for d in (-2, -1, 0, 1)})
blobs = st.one_of(
    st.binary(max_size=40),
    st.builds(lambda n, tail: b"\xa5" * n + tail, st.sampled_from(_BIN_LENGTHS), st.binary(max_size=2)),
)
_slice_index = st.none() | st.integers(-14, 14)
sliced_views = st.builds(
    lambda data, start, stop, step: memoryview(data)[start:stop:step],
    st.binary(max_size=12),
    _slice_index,
    _slice_index,
    st.none() | st.sampled_from([-3, -2, -1, 1, 2, 3]),
)
cast_views = st.one_of(
    st.builds(
        lambda n, fmt: memoryview(bytes(range(8 * n))).cast(fmt),
        st.integers(0, 4),
        st.sampled_from(["B", "b", "c", "H", "i", "q", "d", "f"]),
    ),
    st.builds(
        lambda rows, cols: memoryview(bytearray(range(rows * cols))).cast("B", (rows, cols)),
        st.integers(1, 4),
        st.integers(1, 4),
    ),
    st.builds(lambda b: memoryview(bytes([b])).cast("B", ()), st.integers(0, 255)),
)
bytes_like = st.one_of(
    blobs,
    blobs.map(bytearray),
    blobs.map(BytesSub),
    blobs.map(BytearraySub),
    blobs.map(memoryview),
    blobs.map(lambda b: memoryview(bytearray(b))),
    sliced_views,
    cast_views,
)

_EXT_LENGTHS = [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 255, 256, 65535, 65536]
ext_data = st.one_of(
    st.binary(max_size=20),
    st.builds(lambda n, fill: bytes([fill]) * n, st.sampled_from(_EXT_LENGTHS), st.integers(0, 255)),
)
_ext_classes = [spanpack.ExtType] + ([SpExtSub] if SpExtSub is not None else [])
exts = st.builds(lambda cls, code, data: cls(code, data), st.sampled_from(_ext_classes), st.integers(0, 127), ext_data)

_TS_SECONDS = [
    0, 1, 2**32 - 1, 2**32, 2**34 - 1, 2**34, -1, -(2**31), -(2**34),
    2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64, -(2**64),
]  # fmt: skip
ts_seconds = st.one_of(
    st.sampled_from(_TS_SECONDS),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 2**34),
    st.integers(-(2**66), 2**66),
)
ts_nanos = st.one_of(st.sampled_from([0, 1, 999_999_999]), st.integers(0, 999_999_999))
_ts_classes = [spanpack.Timestamp] + ([SpTimestampSub] if SpTimestampSub is not None else [])
timestamps = st.builds(lambda cls, s, ns: cls(s, ns), st.sampled_from(_ts_classes), ts_seconds, ts_nanos)

TIMEZONES = [
    datetime.timezone.utc,
    datetime.timezone(datetime.timedelta(hours=5, minutes=30)),
    datetime.timezone(-datetime.timedelta(hours=23, minutes=59, seconds=59, microseconds=999999)),
    datetime.timezone(datetime.timedelta(hours=23, minutes=59)),
    datetime.timezone(datetime.timedelta(seconds=1)),
    datetime.timezone(datetime.timedelta(microseconds=7)),
    FixedOffset(-90),
]
plain_datetimes = st.one_of(
    st.datetimes(timezones=st.none() | st.sampled_from(TIMEZONES)),
    st.datetimes(
        min_value=datetime.datetime(1969, 12, 31, 23, 59),
        max_value=datetime.datetime(1970, 1, 1, 0, 1),
        timezones=st.just(datetime.timezone.utc),
    ),
)
datetime_like = st.one_of(
    plain_datetimes,
    plain_datetimes.map(
        lambda d: DatetimeSub(
            d.year, d.month, d.day, d.hour, d.minute, d.second, d.microsecond, d.tzinfo, fold=d.fold
        )
    ),
)

unsupported = st.one_of(
    st.sampled_from([datetime.date(2020, 2, 29), 1 + 2j, datetime.timedelta(seconds=3)]),
    st.frozensets(st.integers(-3, 3) | st.text("ab", max_size=2), max_size=4),
    st.sets(st.integers(-3, 3), max_size=4),
    st.builds(Opaque, st.none() | plain_ints | short_text),
)

leaves = st.one_of(
    st.none(),
    st.booleans(),
    int_like,
    float_like,
    text_like,
    bytes_like,
    exts,
    timestamps,
    datetime_like,
    unsupported,
)

hashable_keys = st.one_of(
    st.none(),
    st.booleans(),
    plain_ints,
    plain_ints.map(IntSub),
    plain_floats,
    short_text,
    short_text.map(StrSub),
    st.binary(max_size=6),
    st.builds(spanpack.ExtType, st.integers(0, 127), st.binary(max_size=5)),
    st.builds(spanpack.Timestamp, ts_seconds, ts_nanos),
    st.tuples(plain_ints, short_text),
    st.frozensets(st.integers(-3, 3), max_size=3),
    plain_datetimes,
)

_tiny = st.none() | st.integers(-3, 3)
boundary_containers = st.one_of(
    st.lists(_tiny, min_size=14, max_size=17),
    st.lists(_tiny, min_size=14, max_size=17).map(tuple),
    st.dictionaries(st.integers(0, 200), _tiny, min_size=14, max_size=17),
    st.dictionaries(st.text("xyz", min_size=1, max_size=4), _tiny, min_size=14, max_size=17),
)


def _containers(children):
    items = st.lists(children, max_size=5)
    pairs = st.dictionaries(hashable_keys, children, max_size=5)
    return st.one_of(
        items,
        items.map(tuple),
        items.map(ListSub),
        items.map(TupleSub),
        st.builds(Point, children, children),
        pairs,
        pairs.map(DictSub),
        pairs.map(collections.OrderedDict),
        st.builds(Opaque, children),
    )


objects = st.recursive(st.one_of(leaves, boundary_containers), _containers, max_leaves=25)

UNICODE_ERRORS = [
    None, "strict", "surrogatepass", "replace", "ignore",
    "backslashreplace", "surrogateescape", "xmlcharrefreplace", "namereplace",
]  # fmt: skip
options = st.fixed_dictionaries(
    {},
    optional={
        "use_single_float": st.booleans(),
        "use_bin_type": st.booleans(),
        "strict_types": st.booleans(),
        "datetime": st.booleans(),
        "unicode_errors": st.sampled_from(UNICODE_ERRORS),
        "default": st.sampled_from(DEFAULTS),
        "buf_size": st.sampled_from([0, 1, 2, 7, 64, 4096, 256 * 1024]),
    },
)

# Objects that make a plain Packer() fail (some options rescue a few of them).
failing = st.one_of(
    st.builds(lambda x: [x, object()], objects),
    st.builds(lambda x: {"k": x, "bad": 2**64}, objects),
    st.just(-(2**63) - 1),
    st.just(["ok", "\ud800"]),
    st.just({"when": datetime.datetime(2000, 1, 1)}),
    st.builds(lambda x: (x, Opaque(x)), objects),
)

# --------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------


def _assert_same(actual, expected, what):
    if expected[0] == "ok" and actual[0] == "ok":
        assert actual[1] == expected[1], f"{what}: bytes differ from msgpack"
    else:
        assert actual == expected, f"{what}: spanpack {actual} != msgpack {expected}"


@budget(1.0)
@given(obj=objects, opts=options)
def test_packb_matches_msgpack(obj, opts):
    expected = outcome(msgpack.packb, to_ref(obj), **opts)
    actual = outcome(spanpack.packb, obj, **opts)
    note(f"msgpack: {expected!r}")
    _assert_same(actual, expected, "packb")


@budget(0.5)
@given(value=leaves, opts=options)
def test_scalars_match_msgpack(value, opts):
    # each leaf alone, as an array element and as a map value
    for obj in (value, [value, value], {"v": value}):
        expected = outcome(msgpack.packb, to_ref(obj), **opts)
        actual = outcome(spanpack.packb, obj, **opts)
        _assert_same(actual, expected, "packb")


@budget(0.15)
@given(obj=objects, opts=options)
def test_packer_instance_matches_packb(obj, opts):
    """A fresh Packer(**opts).pack agrees with msgpack.Packer(**opts).pack."""
    expected = outcome(msgpack.Packer(**opts).pack, to_ref(obj))
    actual = outcome(spanpack.Packer(**opts).pack, obj)
    _assert_same(actual, expected, "Packer.pack")


_header_sizes = st.sampled_from([0, 1, 15, 16, 255, 65535, 65536, 2**32 - 1, 2**32, -1])
packer_ops = st.lists(
    st.one_of(
        st.tuples(st.just("pack"), objects),
        st.tuples(st.just("pack"), failing),
        st.tuples(st.just("pack_array_header"), _header_sizes),
        st.tuples(st.just("pack_map_header"), _header_sizes),
        st.tuples(st.just("pack_map_pairs"), st.lists(st.tuples(hashable_keys, objects), max_size=4)),
        st.tuples(st.just("pack_ext_type"), st.integers(-128, 127), st.binary(max_size=20)),
        st.tuples(st.just("reset")),
        st.tuples(st.just("bytes")),
    ),
    min_size=1,
    max_size=8,
)


def _run_op(packer, op, convert):
    name, *args = op
    if name == "pack":
        return outcome(packer.pack, convert(args[0]))
    if name == "pack_map_pairs":
        return outcome(packer.pack_map_pairs, [(convert(k), convert(v)) for k, v in args[0]])
    if name == "pack_ext_type" and convert is to_ref:
        # msgpack-python's code is a plain char (tests/packer/ext_codes.py)
        args = [ext_codes.msgpack_code(args[0])] + args[1:]
    return outcome(getattr(packer, name), *args)


SENTINEL = {"after": [1, -1, 2**40, 1.5, "s\u00e9", b"b", None, True]}


@budget(0.4)
@given(ops=packer_ops, opts=options, autoreset=st.booleans())
def test_reused_packer_matches_msgpack(ops, opts, autoreset):
    """One Packer, many calls (including failing ones): same results as msgpack."""
    ours = spanpack.Packer(autoreset=autoreset, **opts)
    ref = msgpack.Packer(autoreset=autoreset, **opts)
    for step, op in enumerate(ops):
        before = ours.bytes()
        expected = _run_op(ref, op, to_ref)
        actual = _run_op(ours, op, lambda x: x)
        _assert_same(actual, expected, f"step {step} {op[0]}")
        if expected[0] == "raised":
            # A failed call leaves spanpack's buffer as it was (docs/packer.md: with
            # autoreset=False a failed pack() keeps what was packed before it).
            # msgpack 1.2 differs here (it empties the buffer after a failed
            # pack() and keeps a half-written map after a failed
            # pack_map_pairs), so both restart from an empty buffer.
            assert ours.bytes() == before, f"buffer not rolled back at step {step} {op[0]}"
            ours.reset()
            ref.reset()
        if not autoreset:
            assert ours.bytes() == ref.bytes(), f"buffer after step {step} {op[0]}"
    # still usable, and in step with msgpack
    assert _run_op(ours, ("pack", SENTINEL), lambda x: x) == _run_op(ref, ("pack", SENTINEL), to_ref)
    assert ours.bytes() == ref.bytes()


_NEST_LEVELS = dict(
    CONTAINER_LEVELS,
    listsub=lambda obj: ListSub([1, obj]),
    dictsub=lambda obj: DictSub({0: obj}),
    point=lambda obj: Point(None, obj),
    opaque=Opaque,
)
_NEST_KINDS = list(_NEST_LEVELS)


@budget(0.05)
@given(
    depth=st.one_of(st.integers(1015, 1035), st.integers(0, 40)),
    kinds=st.lists(st.sampled_from(_NEST_KINDS), min_size=1, max_size=3),
    leaf=st.sampled_from([None, 0, [], {}, (), 2**64, "\ud800", "ok"]),
    opts=options,
)
def test_deep_nesting_matches_msgpack(depth, kinds, leaf, opts):
    # No ExtType/Timestamp inside, so both libraries get the very same object.
    obj = nest(leaf, depth, kinds, _NEST_LEVELS)
    expected = outcome(msgpack.packb, obj, **opts)
    actual = outcome(spanpack.packb, obj, **opts)
    _assert_same(actual, expected, f"depth {depth}")
    # and a packer that failed on it is still usable
    packer = spanpack.Packer(**opts)
    outcome(packer.pack, obj)
    assert packer.pack(SENTINEL) == msgpack.packb(to_ref(SENTINEL), **opts)

