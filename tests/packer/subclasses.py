"""Subclasses of the built-in types the Packer handles, with nothing overridden.

msgpack-python packs a subclass as its base type (an int subclass as an int, a
dict subclass as a map, ...); the Packer tests check spanpack does the same.
"""

import datetime


class IntSub(int):
    pass


class FloatSub(float):
    pass


class StrSub(str):
    pass


class BytesSub(bytes):
    pass


class BytearraySub(bytearray):
    pass


class ListSub(list):
    pass


class TupleSub(tuple):
    pass


class DictSub(dict):
    pass


class DatetimeSub(datetime.datetime):
    pass
