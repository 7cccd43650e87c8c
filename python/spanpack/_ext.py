"""msgpack extension values: ExtType and the Timestamp extension (type -1).

Defined in Python because they are plain value classes; the C Packer checks
for them by type, exactly where msgpack-python's Packer does.
"""

from __future__ import annotations

import datetime as _datetime
import struct
from typing import NamedTuple

_EPOCH = _datetime.datetime(1970, 1, 1, tzinfo=_datetime.timezone.utc)
_NANOS_PER_SECOND = 10**9


class _ExtTypeFields(NamedTuple):
    code: int
    data: bytes


class ExtType(_ExtTypeFields):
    """An application-defined msgpack extension value: ``code`` in 0..127, ``data`` bytes."""

    __slots__ = ()

    def __new__(cls, code: int, data: bytes) -> "ExtType":
        if not isinstance(code, int):
            raise TypeError("code must be int")
        if not isinstance(data, bytes):
            raise TypeError("data must be bytes")
        if not 0 <= code <= 127:
            raise ValueError("code must be 0~127")
        return super().__new__(cls, code, data)


class Timestamp:
    """A point in time as msgpack's timestamp extension carries it.

    ``seconds`` since the Unix epoch (may be negative) and ``nanoseconds`` in
    [0, 10**9).  Immutable by convention.
    """

    __slots__ = ("seconds", "nanoseconds")

    def __init__(self, seconds: int, nanoseconds: int = 0) -> None:
        if not isinstance(seconds, int):
            raise TypeError("seconds must be an integer")
        if not isinstance(nanoseconds, int):
            raise TypeError("nanoseconds must be an integer")
        if not 0 <= nanoseconds < _NANOS_PER_SECOND:
            raise ValueError("nanoseconds must be a non-negative integer less than 999999999.")
        self.seconds = seconds
        self.nanoseconds = nanoseconds

    def __repr__(self) -> str:
        return f"Timestamp(seconds={self.seconds}, nanoseconds={self.nanoseconds})"

    def __eq__(self, other: object) -> bool:
        if type(other) is self.__class__:
            return (self.seconds, self.nanoseconds) == (other.seconds, other.nanoseconds)
        return False

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((self.seconds, self.nanoseconds))

    @staticmethod
    def from_bytes(data: bytes) -> "Timestamp":
        """Decode the 4-, 8- or 12-byte body of a timestamp extension value."""
        if len(data) == 4:
            return Timestamp(struct.unpack("!L", data)[0], 0)
        if len(data) == 8:
            packed = struct.unpack("!Q", data)[0]
            return Timestamp(packed & 0x3_FFFF_FFFF, packed >> 34)
        if len(data) == 12:
            nanoseconds, seconds = struct.unpack("!Iq", data)
            return Timestamp(seconds, nanoseconds)
        raise ValueError(
            "Timestamp type can only be created from 32, 64, or 96-bit byte objects"
        )

    def to_bytes(self) -> bytes:
        """The smallest timestamp extension body that holds this value."""
        if self.seconds >> 34 == 0:
            packed = self.nanoseconds << 34 | self.seconds
            if packed >> 32 == 0:
                return struct.pack("!L", packed)
            return struct.pack("!Q", packed)
        return struct.pack("!Iq", self.nanoseconds, self.seconds)

    @staticmethod
    def from_unix(unix_sec: float) -> "Timestamp":
        """From seconds since the epoch, as int or float."""
        seconds = int(unix_sec // 1)
        nanoseconds = int((unix_sec % 1) * _NANOS_PER_SECOND)
        return Timestamp(seconds, nanoseconds)

    def to_unix(self) -> float:
        return self.seconds + self.nanoseconds / 1e9

    @staticmethod
    def from_unix_nano(unix_ns: int) -> "Timestamp":
        return Timestamp(*divmod(unix_ns, _NANOS_PER_SECOND))

    def to_unix_nano(self) -> int:
        return self.seconds * _NANOS_PER_SECOND + self.nanoseconds

    def to_datetime(self) -> _datetime.datetime:
        """An aware UTC datetime (microsecond precision)."""
        return _EPOCH + _datetime.timedelta(
            seconds=self.seconds, microseconds=self.nanoseconds // 1000
        )

    @staticmethod
    def from_datetime(dt: _datetime.datetime) -> "Timestamp":
        """From a datetime; a naive one is taken as local time, like datetime.timestamp()."""
        if dt.tzinfo is None:
            dt = dt.astimezone()
        delta = dt - _EPOCH
        return Timestamp(delta.days * 86400 + delta.seconds, delta.microseconds * 1000)
