"""The msgpack Packer: API, conversions, vectors, differential against msgpack-python."""

import datetime


def outcome(fn, *args, **kwargs):
    """("ok", result) or ("raised", exception type): what the Packer tests compare
    between spanpack and msgpack-python."""
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - the type is what gets compared
        return ("raised", type(exc))


#: One level of nesting around an object, by kind: the plain containers.
CONTAINER_LEVELS = {
    "list": lambda obj: [obj],
    "tuple": lambda obj: (obj,),
    "dict": lambda obj: {"k": obj},
}


def nest(leaf, depth, kinds, levels=CONTAINER_LEVELS):
    """`leaf` inside `depth` levels, innermost first, whose kinds (keys of
    `levels`) are taken from `kinds` in turn."""
    obj = leaf
    for level in range(depth):
        obj = levels[kinds[level % len(kinds)]](obj)
    return obj


class FixedOffset(datetime.tzinfo):
    """A tzinfo that is not datetime.timezone."""

    def __init__(self, minutes):
        self.minutes = minutes

    def utcoffset(self, dt):
        return datetime.timedelta(minutes=self.minutes)

    def dst(self, dt):
        return datetime.timedelta(0)

    def tzname(self, dt):
        return f"FIXED{self.minutes:+d}"

    def __repr__(self):
        return f"FixedOffset({self.minutes})"
