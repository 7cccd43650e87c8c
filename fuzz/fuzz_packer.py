"""Differential fuzz harness: spanpack's Packer / packb against msgpack-python.

Every input is turned (deterministically) into an adversarial object graph and
a set of Packer options.  The graph is built twice from the same bytes, once
for msgpack-python and once for spanpack, so that side effects (a ``default``
that mutates the container being packed, counters in ``__iter__``) play out
the same way on both sides.  Checks:

* no crash (run under ASan/UBSan to make memory errors fatal);
* when both succeed the bytes are equal, and spanpack's bytes decode to
  exactly one msgpack object (no header/item count mismatch);
* when msgpack-python succeeds spanpack succeeds too, except for the
  documented difference: RuntimeError when ``default`` resized a container
  that was being packed;
* when both fail, the exception types are equal.

Run with atheris (coverage of this module guides the mutations)::

    python fuzz/fuzz_packer.py -max_total_time=1800 corpus_dir

or without atheris, feeding random bytes from a seeded generator::

    python fuzz/fuzz_packer.py --random 100000 --seed 1

See fuzz/README.md.
"""

from __future__ import annotations

import datetime
import math
import os
import random
import struct
import sys
import time

import msgpack

import spanpack

# The plain subclasses (nothing overridden), the tzinfo class and the ext code
# rule are the Packer tests' own; the repository root, which holds tests/, is
# found from this file's location.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
from tests.packer import FixedOffset  # noqa: E402
from tests.packer.ext_codes import MSGPACK_CHAR_IS_SIGNED, msgpack_code  # noqa: E402
from tests.packer.subclasses import BytesSub, DatetimeSub, DictSub, ListSub, TupleSub  # noqa: E402

# Constructs that reproduced the bugs in tests/robustness/test_regressions.py (all fixed
# now) are on by default; FUZZ_INCLUDE_KNOWN=0 leaves them out, for fuzzing a
# build that predates the fixes without hitting them over and over.
INCLUDE_KNOWN = os.environ.get("FUZZ_INCLUDE_KNOWN", "1") != "0"


# msgpack-python takes an ext code as a C plain char: signed on x86-64 (the
# spec's -128..127, as spanpack), unsigned on arm64 (0..255); see
# tests/packer/ext_codes.py.  There msgpack gets a negative code's byte as an
# unsigned code (the same bytes, msgpack_code), and 128, which only it would
# take, is not tried.
EXT_CODES = [0, 1, 127, 128, -1, -128, -129, 300] if MSGPACK_CHAR_IS_SIGNED else [0, 1, 127, -1, -128, -129, 300]


class Input:
    """Consumes the fuzzer's bytes; returns zeros once they run out."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        value = self.data[self.pos]
        self.pos += 1
        return value

    def uint(self, nbytes: int) -> int:
        value = 0
        for _ in range(nbytes):
            value = value << 8 | self.byte()
        return value

    def below(self, n: int) -> int:
        if n <= 1:
            return 0
        if n <= 256:
            return self.byte() % n
        return self.uint(4) % n

    def flag(self) -> bool:
        return self.byte() & 1 == 1

    def pick(self, options):
        return options[self.below(len(options))]

    def raw(self, n: int) -> bytes:
        chunk = self.data[self.pos : self.pos + n]
        self.pos += len(chunk)
        return chunk + bytes(n - len(chunk))

    @property
    def exhausted(self) -> bool:
        return self.pos >= len(self.data)


# ---------------------------------------------------------------------------
# Value pools

INT_EDGES = [
    0, 1, -1, 31, 32, -32, -33, 127, 128, -128, -129, 255, 256, 32767, 32768, -32768,
    -32769, 65535, 65536, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32 - 1, 2**32,
    2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, -(2**64), 2**128, -(2**200),
]
FLOAT_EDGES = [
    0.0, -0.0, 1.5, -1.5, float("nan"), float("inf"), float("-inf"), 1e308, -1e308,
    5e-324, 2.2250738585072014e-308, 3.4028234663852886e38, 3.5e38, -3.5e38, 1e-46,
    float.fromhex("0x1.fffffep+127"), float.fromhex("0x1.ffffffp+127"),
]
TEXT_EDGES = [
    "", "a", "é", "€", "\U0001f600", "\ud800", "\udfff", "a\udc80b", "\x00", "\u2028",
    "x" * 31, "x" * 32, "x" * 255, "x" * 256, "é" * 128, "x" * 65535, "x" * 65536,
]
UNICODE_ERRORS = [None, "strict", "surrogatepass", "surrogateescape", "replace", "ignore",
                  "backslashreplace", "bogus-handler"]
EXT_LENGTHS = [0, 1, 2, 3, 4, 8, 16, 17, 255, 256, 65535, 65536]
TS_SECONDS = [0, 1, -1, 2**32 - 1, 2**32, 2**34 - 1, 2**34, -(2**34), 2**63 - 1, -(2**63)]
TS_NANOS = [0, 1, 999_999_999, 500_000_000]


class IntSub(int):
    def __index__(self):  # neither packer may call these
        raise AssertionError("__index__ called")


class FloatSub(float):
    def __float__(self):
        raise AssertionError("__float__ called")


class StrSub(str):
    def __str__(self):
        raise AssertionError("__str__ called")


class LyingList(list):
    """A list subclass whose iteration yields a different number of items."""

    def __init__(self, items, extra):
        super().__init__(items)
        self.extra = extra

    def __iter__(self):
        yield from list.__iter__(self)
        yield from self.extra


class ItemsDict(dict):
    """A dict subclass whose items() lies about the pairs."""

    def __init__(self, base, pairs):
        super().__init__(base)
        self.pairs = pairs

    def items(self):
        return self.pairs


class SideEffects:
    """An unpackable object whose dunders have side effects; reaches `default`."""

    def __init__(self, log):
        self.log = log

    def __index__(self):
        self.log.append("index")
        return 7

    def __float__(self):
        self.log.append("float")
        return 1.0

    def __str__(self):
        self.log.append("str")
        return "side"

    def __repr__(self):
        return "SideEffects()"


class RaisingTz(datetime.tzinfo):
    def utcoffset(self, dt):
        raise ValueError("utcoffset failed")

    def dst(self, dt):
        return None


class ExtSub(spanpack.ExtType):
    pass


class MsgpackExtSub(msgpack.ExtType):
    pass


class Builder:
    """Builds one object graph; `msgpack_side` selects which library's ExtType /
    Timestamp classes to use, everything else is identical."""

    def __init__(self, inp: Input, msgpack_side: bool):
        self.inp = inp
        self.msgpack_side = msgpack_side
        self.ExtType = msgpack.ExtType if msgpack_side else spanpack.ExtType
        self.Timestamp = msgpack.Timestamp if msgpack_side else spanpack.Timestamp
        self.containers = []  # mutable containers, targets for a mutating default
        self.mutated = False  # a container changed size, or a subclass lied about it
        self.swapped = False  # default replaced a dict key (same size): RuntimeError allowed
        self.log = []
        self.default_mode = 0
        self.budget = 300  # objects per graph

    # -- scalars ----------------------------------------------------------
    def integer(self):
        inp = self.inp
        kind = inp.below(5)
        if kind == 0:
            value = inp.pick(INT_EDGES)
        elif kind == 1:
            value = inp.uint(2) - 32768
        elif kind == 2:
            value = (inp.uint(8) << inp.below(140)) * (-1 if inp.flag() else 1)
        elif kind == 3:
            value = IntSub(inp.pick(INT_EDGES))
        else:
            value = inp.pick(INT_EDGES) + inp.below(3) - 1
        return value

    def floating(self):
        inp = self.inp
        kind = inp.below(4)
        if kind == 0:
            return inp.pick(FLOAT_EDGES)
        if kind == 1:
            return struct.unpack("<d", inp.raw(8))[0]
        if kind == 2:
            return struct.unpack("<f", inp.raw(4))[0]
        return FloatSub(inp.pick(FLOAT_EDGES))

    def text(self):
        inp = self.inp
        kind = inp.below(5)
        if kind == 0:
            value = inp.pick(TEXT_EDGES)
        elif kind == 1:
            value = "".join(chr(inp.uint(3) % 0x110000) for _ in range(inp.below(12)))
        elif kind == 2:
            value = inp.raw(inp.below(40)).decode("latin-1")
        elif kind == 3:
            value = inp.raw(inp.below(40)).decode("utf-8", "surrogateescape")
        else:
            value = StrSub(inp.pick(TEXT_EDGES[:12]))
        return value

    def binary(self):
        inp = self.inp
        data = inp.raw(inp.below(20)) if inp.flag() else b"\xab" * inp.pick(EXT_LENGTHS)
        kind = inp.below(7)
        if kind == 0:
            return data
        if kind == 1:
            return bytearray(data)
        if kind == 2:
            return BytesSub(data)
        if kind == 3:
            return memoryview(data)
        if kind == 4:
            return memoryview(bytearray(data))[:: max(1, inp.below(3))]  # maybe non-contiguous
        if kind == 5:
            padded = data + bytes(-len(data) % 4)
            view = memoryview(padded).cast("i") if padded else memoryview(padded)
            return view[::2] if inp.flag() else view
        padded = data[: len(data) - len(data) % 4] or b"\0\0\0\0"
        return memoryview(padded).cast("B", shape=[len(padded) // 2, 2]) if len(
            padded
        ) % 2 == 0 else memoryview(padded)

    def ext(self):
        inp = self.inp
        code = inp.below(128)
        data = bytes([inp.byte()]) * inp.pick(EXT_LENGTHS)
        if inp.flag():
            return (MsgpackExtSub if self.msgpack_side else ExtSub)(code, data)
        return self.ExtType(code, data)

    def timestamp(self):
        inp = self.inp
        seconds = inp.pick(TS_SECONDS) + inp.below(3) - 1
        nanos = inp.pick(TS_NANOS)
        ts = self.Timestamp(seconds, nanos)
        if inp.below(8) == 0:
            # Out-of-range values set after construction (both are plain classes).
            try:
                object.__setattr__(ts, "seconds", inp.pick([2**64, -(2**64), 2**63]))
            except (AttributeError, TypeError):
                pass
        return ts

    def moment(self):
        inp = self.inp
        kind = inp.below(7)
        seconds = inp.uint(5) - 2**38 // 2 if inp.flag() else inp.uint(4)
        try:
            base = datetime.datetime(1970, 1, 1) + datetime.timedelta(
                seconds=seconds, microseconds=inp.uint(3) % 10**6)
        except OverflowError:
            base = datetime.datetime(2000, 1, 1)
        if kind == 0:
            return base
        if kind == 1:
            return base.replace(tzinfo=datetime.timezone.utc)
        if kind == 2:
            return base.replace(tzinfo=datetime.timezone(datetime.timedelta(minutes=inp.below(1440) - 720)))
        if kind == 3:
            return base.replace(tzinfo=RaisingTz())
        if kind == 4:
            return base.replace(tzinfo=FixedOffset(inp.below(2000) - 1000))
        if kind == 5:
            return DatetimeSub(2000, 1, 1, tzinfo=datetime.timezone.utc)
        return inp.pick([datetime.datetime.min, datetime.datetime.max,
                         datetime.datetime.max.replace(tzinfo=datetime.timezone.utc),
                         datetime.date(2020, 1, 1)])

    # -- containers -------------------------------------------------------
    def container(self, depth):
        inp = self.inp
        kind = inp.below(10)
        n = inp.below(6) if inp.below(8) else inp.pick([15, 16, 17, 40])
        items = [self.value(depth + 1) for _ in range(n)]
        if kind == 0:
            result = items
        elif kind == 1:
            result = tuple(items)
        elif kind == 2:
            result = ListSub(items)
        elif kind == 3:
            result = TupleSub(items)
        elif kind == 4:
            extra = [1] * inp.below(2)
            self.mutated = self.mutated or bool(extra)
            result = LyingList(items, extra)
        elif kind in (5, 6):
            result = {}
            for item in items:
                key = self.key()
                result[key] = item
        elif kind == 7:
            result = DictSub((self.key(), item) for item in items)
        elif kind == 8:
            base = {self.key(): item for item in items}
            pairs = list(base.items())
            if inp.flag() and pairs:
                pairs = pairs[:-1] if inp.flag() else pairs + [pairs[0]]
                self.mutated = True
            if inp.flag():
                pairs = [p + (1,) if i == 0 else p for i, p in enumerate(pairs)]
            result = ItemsDict(base, pairs)
        else:
            result = items
            if inp.flag():
                result.append(result)  # recursive
        if isinstance(result, (list, dict)):
            self.containers.append(result)
        return result

    def key(self):
        kind = self.inp.below(4)
        if kind == 0:
            return self.integer() if self.inp.flag() else self.inp.below(50)
        if kind == 1:
            return self.inp.pick([None, True, False, 1.5, b"k", (1, 2)])
        return self.text()

    def value(self, depth=0):
        self.budget -= 1
        inp = self.inp
        if self.budget <= 0 or inp.exhausted:
            return inp.below(3)
        kind = inp.below(16 if depth < 6 else 11)
        if kind == 0:
            return inp.pick([None, True, False])
        if kind in (1, 2):
            return self.integer()
        if kind == 3:
            return self.floating()
        if kind in (4, 5):
            return self.text()
        if kind == 6:
            return self.binary()
        if kind == 7:
            return self.ext()
        if kind == 8:
            return self.timestamp()
        if kind == 9:
            return self.moment()
        if kind == 10:
            return SideEffects(self.log) if inp.flag() else object()
        return self.container(depth)

    # -- default ----------------------------------------------------------
    def make_default(self):
        inp = self.inp
        mode = inp.below(9)
        self.default_mode = mode
        if mode == 0:
            return None
        victim_choice = inp.byte()
        replacement = self.value(5)

        def default(obj):
            if mode == 1:
                return type(obj).__name__.replace("Msgpack", "")
            if mode == 2:
                return [1, "two", None]
            if mode == 3:
                raise ValueError("default refused")
            if mode == 4:
                return obj  # not packable either: TypeError
            if mode == 5:
                return replacement
            if mode in (6, 7) and self.containers:
                victim = self.containers[victim_choice % len(self.containers)]
                if isinstance(victim, list):
                    if mode == 6:
                        victim.append(0)
                    elif victim:
                        victim[0] = "replaced"  # same size
                    if mode == 6:
                        self.mutated = True
                elif isinstance(victim, dict):
                    if mode == 6:
                        victim[("new", len(victim))] = 1
                        self.mutated = True
                    elif victim:
                        # Same size: delete one key, add another.
                        first = next(iter(victim))
                        del victim[first]
                        victim[("swap", len(self.log))] = 2
                        self.log.append("swap")
                        # Same size, but a key already written was replaced by one
                        # that would be written too: spanpack must raise RuntimeError
                        # rather than write more pairs than the map header says
                        # (tests/robustness/test_regressions.py, bug 4).
                        self.swapped = True
                        self.mutated = self.mutated or not INCLUDE_KNOWN
                return 0
            if mode == 8:
                return SideEffects(self.log)  # unpackable again
            return None

        return default

    def options(self):
        inp = self.inp
        options = {}
        if inp.flag():
            options["use_single_float"] = inp.flag()
        if inp.flag():
            options["use_bin_type"] = inp.flag()
        if inp.flag():
            options["strict_types"] = inp.flag()
        if inp.flag():
            options["datetime"] = inp.flag()
        if inp.flag():
            options["unicode_errors"] = inp.pick(UNICODE_ERRORS)
        if inp.below(4) == 0:
            options["buf_size"] = inp.pick([0, 1, 7, 1024, 1 << 20])  # None: documented extension
        return options


def decode_check(out: bytes) -> None:
    """spanpack's output must be exactly one msgpack object."""
    try:
        msgpack.unpackb(out, raw=True, strict_map_key=False, timestamp=0, use_list=False,
                        object_pairs_hook=tuple,
                        ext_hook=lambda code, data: (code, data))
    except msgpack.StackError:
        return
    except ValueError as error:
        if "Timestamp" in str(error) or "timestamp" in str(error):
            return
        raise AssertionError(f"spanpack wrote undecodable output {out[:80]!r}: {error!r}")


def run(func):
    try:
        return func(), None
    except RecursionError as error:
        return None, error
    except Exception as error:  # noqa: BLE001 - compared below
        return None, error


def compare(what, mine, theirs, builder_mine, builder_theirs, decode=True):
    out_m, err_m = mine
    out_t, err_t = theirs
    mutated = builder_mine.mutated or builder_theirs.mutated
    if decode and err_m is None and isinstance(out_m, bytes) and not mutated:
        decode_check(out_m)
    if builder_mine.swapped and isinstance(err_m, RuntimeError):
        return  # spanpack refuses; msgpack-python may write a corrupt map
    if err_m is None and err_t is None:
        if out_m != out_t and not mutated:
            raise AssertionError(f"{what}: bytes differ\n spanpack {out_m!r:.300}\n msgpack  {out_t!r:.300}")
        return
    if err_m is not None and err_t is None:
        if mutated and isinstance(err_m, RuntimeError):
            return  # documented difference
        raise AssertionError(f"{what}: spanpack raised {err_m!r} but msgpack returned {out_t!r:.200}")
    if err_m is None and err_t is not None:
        if mutated:
            return
        raise AssertionError(f"{what}: msgpack raised {err_t!r} but spanpack returned {out_m!r:.200}")
    if type(err_m) is not type(err_t):
        if mutated and isinstance(err_m, RuntimeError):
            return
        # Both libraries legitimately raise their own subclasses here.
        if isinstance(err_m, RecursionError) or isinstance(err_t, RecursionError):
            return
        raise AssertionError(f"{what}: exception types differ: spanpack {err_m!r} msgpack {err_t!r}")


def build_pair(data):
    sides = []
    for msgpack_side in (False, True):
        inp = Input(data)
        builder = Builder(inp, msgpack_side)
        options = builder.options()
        default = builder.make_default()
        if default is not None:
            options["default"] = default
        obj = builder.value()
        extra = inp.byte()
        sides.append((builder, options, obj, extra))
    return sides


def scenario_packb(data):
    (bm, om, objm, extra), (bt, ot, objt, _) = build_pair(data)
    om.pop("buf_size", None) if extra & 1 else None
    ot.pop("buf_size", None) if extra & 1 else None
    om.pop("autoreset", None)
    ot.pop("autoreset", None)
    mine = run(lambda: spanpack.packb(objm, **om))
    theirs = run(lambda: msgpack.packb(objt, **ot))
    compare("packb", mine, theirs, bm, bt)


def scenario_packer(data):
    (bm, om, objm, extra), (bt, ot, objt, _) = build_pair(data)
    autoreset = bool(extra & 2)
    pm = run(lambda: spanpack.Packer(autoreset=autoreset, **om))
    pt = run(lambda: msgpack.Packer(autoreset=autoreset, **ot))
    compare("Packer()", (None, pm[1]), (None, pt[1]), bm, bt, decode=False)
    if pm[1] is not None:
        return
    pm, pt = pm[0], pt[0]
    inp = Input(data[::-1])
    for step in range(inp.below(6) + 1):
        op = inp.below(7)
        if op == 0:
            mine = run(lambda: pm.pack(objm))
            theirs = run(lambda: pt.pack(objt))
            # After a failure the buffers legitimately differ: spanpack rolls a
            # failed call back, msgpack-python empties the buffer (pack) or
            # keeps the partial output (pack_map_pairs).  Stop comparing there.
            if mine[1] is not None or theirs[1] is not None:
                compare("pack", mine, theirs, bm, bt)
                return
        elif op in (1, 2):
            method = "pack_array_header" if op == 1 else "pack_map_header"
            n = inp.pick([0, 1, 15, 16, 65535, 65536, 2**32 - 1, 2**32, -1])
            mine = run(lambda: getattr(pm, method)(n))
            theirs = run(lambda: getattr(pt, method)(n))
        elif op == 3:
            pairs_m = [(inp.below(5), objm)] * inp.below(3)
            pairs_t = [(k, objt) for k, _ in pairs_m]
            mine = run(lambda: pm.pack_map_pairs(pairs_m))
            theirs = run(lambda: pt.pack_map_pairs(pairs_t))
            if mine[1] is not None or theirs[1] is not None:
                compare("pack_map_pairs", mine, theirs, bm, bt)
                return
        elif op == 4:
            code = inp.pick(EXT_CODES)
            payload = inp.pick([b"", b"a", b"ab", b"abcd", b"x" * 17, "text", bytearray(b"zz"), 5])
            mine = run(lambda: pm.pack_ext_type(code, payload))
            theirs = run(lambda: pt.pack_ext_type(msgpack_code(code), payload))
            if mine[1] is not None and theirs[1] is not None:
                # Both arguments bad: the two check them in a different order
                # (pack_ext_type(300, 5): OverflowError vs TypeError).
                continue
        elif op == 5:
            mine = run(pm.bytes)
            theirs = run(pt.bytes)
        else:
            run(pm.reset)
            run(pt.reset)
            continue
        # A header alone, or the whole buffer, is not one complete object.
        compare(f"Packer op {op}", mine, theirs, bm, bt, decode=op in (3, 4))
    if not autoreset:
        bytes_m, bytes_t = pm.bytes(), pt.bytes()
        if bytes_m != bytes_t and not (bm.mutated or bt.mutated):
            raise AssertionError(f"buffers differ {bytes_m[:100]!r} {bytes_t[:100]!r}")
        if INCLUDE_KNOWN:
            view = pm.getbuffer()
            assert bytes(view) == bytes_m
            view.release()


def scenario_known_getbuffer(data):
    """Bug 3: a memoryview exported from inside `default` while packing."""
    views = []
    big = b"x" * (1000 + Input(data).uint(2))

    def default(obj):
        views.append(packer.getbuffer())
        return big

    packer = spanpack.Packer(autoreset=False, default=default)
    try:
        packer.pack([object()])
    except BufferError:
        return
    for view in views:
        bytes(view)


SCENARIOS = [scenario_packb, scenario_packb, scenario_packer]


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    if INCLUDE_KNOWN and data[0] == 0xFF:
        scenario_known_getbuffer(data[1:])
        return
    SCENARIOS[data[0] % len(SCENARIOS)](data[1:])


# ---------------------------------------------------------------------------
# Drivers

def run_random(test_one_input, iterations: int, seed: int, lengths, min_len: int = 1,
               seconds: float = 0) -> int:
    """Feed `test_one_input` seeded random inputs (sizes up to one of
    `lengths`) for `iterations` runs, or `seconds` when iterations is 0;
    returns the executions done.  Shared by both harnesses."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds if seconds else None
    done = 0
    while done < iterations or (iterations == 0 and deadline):
        if deadline and time.monotonic() > deadline:
            break
        length = rng.choice(lengths)
        data = rng.randbytes(rng.randrange(min_len, length + 1))
        try:
            test_one_input(data)
        except BaseException:
            sys.stderr.write(f"failing input (seed {seed}, iteration {done}): {data.hex()}\n")
            raise
        done += 1
    return done


def run_main(argv, test_one_input, random_driver, report=None) -> None:
    """A harness's command line: --random/--seconds/--seed with the seeded
    driver, --replay of one input, or else a run under atheris.  `report`,
    if given, prints extra lines after a random run."""
    if "--random" in argv or "--replay" in argv:
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("--random", type=int, default=0, help="iterations (0: use --seconds)")
        parser.add_argument("--seconds", type=float, default=0)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--replay", help="hex input or a file of one")
        args = parser.parse_args(argv[1:])
        if args.replay:
            text = open(args.replay).read() if os.path.exists(args.replay) else args.replay
            test_one_input(bytes.fromhex(text.strip()))
            print("replayed without failure")
            return
        start = time.monotonic()
        done = random_driver(args.random, args.seed, seconds=args.seconds)
        if report is not None:
            report()
        print(f"{done} executions in {time.monotonic() - start:.1f} s, no failure")
        return
    import atheris

    atheris.instrument_all()
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


def random_driver(iterations: int, seed: int, seconds: float = 0) -> int:
    """Feed TestOneInput seeded random inputs; returns the executions done."""
    return run_random(TestOneInput, iterations, seed, (8, 32, 64, 128, 256, 512), 1, seconds)


def main(argv) -> None:
    run_main(argv, TestOneInput, random_driver)


if __name__ == "__main__":
    main(sys.argv)
