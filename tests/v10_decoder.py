"""A strict decoder for /v1.0/traces payloads, written from the rules the
Datadog agent's decoder applies (docs/wire-format-v1.md), stricter wherever
decoders disagree, so that a payload it accepts is accepted by all of them:

* every object is a map with the integer keys of its kind; an unknown key,
  the up-front string table (payload key 1) and the agent-only
  dropped-trace flag (chunk key 5) are errors;
* strings are streamed: a str takes the next id (from 1; 0 is ""), a uint
  must be an id already taken; the same text twice as a str is an error
  (the agent's table would give it the old id, the test agent a new one);
* trace ids are bin of exactly 16 bytes; ids, times and span kinds are
  unsigned; a double is a float64 (0xcb) or a float32 (0xca) that the agent
  widens (msgp's ReadFloat64Bytes), never an int; error is a bool;
* attributes are one array of (key, type, value) triplets whose length is a
  multiple of 3; an array value holds a type and a value per element;
* the payload is exactly one msgpack object.

decode(payload) returns the payload with every string resolved: dicts keyed
by the wire's integer keys, attributes as lists of (key, type, value).
"""

from __future__ import annotations

import struct
from typing import Any, Dict, List, Tuple


class DecodeError(ValueError):
    pass


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.strings: List[str] = [""]
        self.seen = {""}

    def fail(self, message: str) -> None:
        raise DecodeError("at byte %d: %s" % (self.pos, message))

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            self.fail("truncated")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def peek(self) -> int:
        if self.pos >= len(self.data):
            self.fail("truncated")
        return self.data[self.pos]

    def _sized(self, fix_base: int, fix_mask: int, codes: Dict[int, str], what: str) -> int:
        b = self.peek()
        if b & ~fix_mask == fix_base:
            self.pos += 1
            return b & fix_mask
        if b in codes:
            self.pos += 1
            return struct.unpack(codes[b], self.take(struct.calcsize(codes[b])))[0]
        self.fail("expected %s, got byte 0x%02x" % (what, b))
        return 0

    def map_header(self) -> int:
        return self._sized(0x80, 0x0F, {0xDE: ">H", 0xDF: ">I"}, "a map")

    def array_header(self) -> int:
        return self._sized(0x90, 0x0F, {0xDC: ">H", 0xDD: ">I"}, "an array")

    def is_str(self) -> bool:
        b = self.peek()
        return b & 0xE0 == 0xA0 or b in (0xD9, 0xDA, 0xDB)

    def str_(self) -> str:
        size = self._sized(0xA0, 0x1F, {0xD9: ">B", 0xDA: ">H", 0xDB: ">I"}, "a str")
        raw = self.take(size)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail("invalid UTF-8: %s" % e)
            return ""

    def integer(self) -> int:
        b = self.peek()
        if b <= 0x7F:
            self.pos += 1
            return b
        if b >= 0xE0:
            self.pos += 1
            return b - 0x100
        codes = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
                 0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
        if b not in codes:
            self.fail("expected an int, got byte 0x%02x" % b)
        self.pos += 1
        return struct.unpack(codes[b], self.take(struct.calcsize(codes[b])))[0]

    def uint(self, bits: int = 64) -> int:
        value = self.integer()
        if not 0 <= value < 1 << bits:
            self.fail("expected a uint%d, got %d" % (bits, value))
        return value

    def int_(self, bits: int = 64) -> int:
        value = self.integer()
        if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
            self.fail("expected an int%d, got %d" % (bits, value))
        return value

    def bool_(self) -> bool:
        b = self.take(1)[0]
        if b not in (0xC2, 0xC3):
            self.pos -= 1
            self.fail("expected a bool, got byte 0x%02x" % b)
        return b == 0xC3

    def double(self) -> float:
        lead = self.peek()
        if lead == 0xCA:
            self.pos += 1
            return struct.unpack(">f", self.take(4))[0]
        if lead != 0xCB:
            self.fail("expected a float64 or float32, got byte 0x%02x" % lead)
        self.pos += 1
        return struct.unpack(">d", self.take(8))[0]

    def bin_(self) -> bytes:
        size = self._sized(0xFF, 0x00, {0xC4: ">B", 0xC5: ">H", 0xC6: ">I"}, "bin")
        return self.take(size)

    def streamed(self) -> str:
        if self.is_str():
            text = self.str_()
            if text in self.seen:
                self.fail("string %r streamed twice" % text[:40])
            self.seen.add(text)
            self.strings.append(text)
            return text
        index = self.uint(32)
        if index >= len(self.strings):
            self.fail("string id %d not streamed yet (%d so far)" % (index, len(self.strings)))
        return self.strings[index]

    # -- objects -------------------------------------------------------------

    def keyed(self, kind: str, readers: Dict[int, Any]) -> Dict[int, Any]:
        out: Dict[int, Any] = {}
        for _ in range(self.map_header()):
            key = self.uint(32)
            if key not in readers:
                self.fail("unknown %s key %d" % (kind, key))
            if key in out:
                self.fail("%s key %d twice" % (kind, key))
            out[key] = readers[key]()
        return out

    def any_value(self) -> Tuple[int, Any]:
        kind = self.uint(32)
        if kind == 1:
            return kind, self.streamed()
        if kind == 2:
            return kind, self.bool_()
        if kind == 3:
            return kind, self.double()
        if kind == 4:
            return kind, self.int_()
        if kind == 5:
            return kind, self.bin_()
        if kind == 6:
            n = self.array_header()
            if n % 2:
                self.fail("array value of %d elements: not type/value pairs" % n)
            return kind, [self.any_value() for _ in range(n // 2)]
        if kind == 7:
            return kind, self.attributes()
        self.fail("unknown value type %d" % kind)
        return kind, None

    def attributes(self) -> List[Tuple[str, int, Any]]:
        n = self.array_header()
        if n % 3:
            self.fail("attributes of %d elements: not a multiple of 3" % n)
        out = []
        for _ in range(n // 3):
            key = self.streamed()
            kind, value = self.any_value()
            out.append((key, kind, value))
        return out

    def trace_id(self) -> bytes:
        value = self.bin_()
        if len(value) != 16:
            self.fail("trace id of %d bytes, not 16" % len(value))
        return value

    def list_of(self, read: Any) -> List[Any]:
        return [read() for _ in range(self.array_header())]

    def link(self) -> Dict[int, Any]:
        return self.keyed("link", {1: self.trace_id, 2: self.uint, 3: self.attributes,
                                   4: self.streamed, 5: lambda: self.uint(32)})

    def event(self) -> Dict[int, Any]:
        return self.keyed("event", {1: self.uint, 2: self.streamed, 3: self.attributes})

    def kind(self) -> int:
        value = self.uint(32)
        if not 1 <= value <= 5:
            self.fail("span kind %d is not one of 1-5" % value)
        return value

    def span(self) -> Dict[int, Any]:
        return self.keyed("span", {
            1: self.streamed, 2: self.streamed, 3: self.streamed, 4: self.uint, 5: self.uint,
            6: self.uint, 7: self.uint, 8: self.bool_, 9: self.attributes, 10: self.streamed,
            11: lambda: self.list_of(self.link), 12: lambda: self.list_of(self.event),
            13: self.streamed, 14: self.streamed, 15: self.streamed, 16: self.kind,
        })

    def chunk(self) -> Dict[int, Any]:
        return self.keyed("chunk", {
            1: lambda: self.int_(32), 2: self.streamed, 3: self.attributes,
            4: lambda: self.list_of(self.span), 6: self.trace_id, 7: lambda: self.uint(32),
        })

    def payload(self) -> Dict[int, Any]:
        readers: Dict[int, Any] = {key: self.streamed for key in range(2, 10)}
        readers[10] = self.attributes
        readers[11] = lambda: self.list_of(self.chunk)
        return self.keyed("payload", readers)


def decode(payload: bytes) -> Dict[int, Any]:
    reader = _Reader(bytes(payload))
    result = reader.payload()
    if reader.pos != len(reader.data):
        reader.fail("%d bytes after the payload" % (len(reader.data) - reader.pos))
    return result
