"""msgpack-python as the reference for ext type codes, only where it is one.

An ext type code is a signed 8-bit integer, -128..127 (the msgpack spec);
spanpack's ``pack_ext_type`` takes exactly those and raises OverflowError for
every other int.  msgpack-python's converts the code to a C plain ``char``,
which is signed on x86-64 (the same rule) but unsigned on arm64: there it
raises OverflowError for -128..-1 and writes 128..255 (200 as the byte 0xc8,
which every decoder reads back as -56).  The tests therefore compare ext
codes with msgpack-python only where its answer does not depend on the sign
of ``char``, and elsewhere hold spanpack to the rule written out here.
"""

import msgpack

#: Codes whose outcome in msgpack-python depends on whether char is signed.
CHAR_SIGN_DEPENDENT = frozenset(range(-128, 0)) | frozenset(range(128, 256))


def _msgpack_char_is_signed() -> bool:
    try:
        msgpack.Packer().pack_ext_type(-1, b"")
    except OverflowError:
        return False
    return True


MSGPACK_CHAR_IS_SIGNED = _msgpack_char_is_signed()


def msgpack_is_reference(code) -> bool:
    """Whether msgpack-python's outcome for `code` is the spec's here.  The
    value of an int (or int subclass, read as msgpack reads it, without its
    hooks) decides; the other objects the tests pass convert to small
    non-negative codes or fail to convert on every platform."""
    if MSGPACK_CHAR_IS_SIGNED or not isinstance(code, int):
        return True
    return int.__index__(code) not in CHAR_SIGN_DEPENDENT


def msgpack_code(code: int) -> int:
    """The code to hand msgpack-python for the spec's `code` in -128..127 so
    that it writes the spec's bytes: the code itself where char is signed,
    a negative code's byte as an unsigned code where it is not."""
    if not MSGPACK_CHAR_IS_SIGNED and -128 <= code < 0:
        return code & 0xFF
    return code


def spec_outcome(code: int, data: bytes):
    """("ok", bytes) or ("raised", OverflowError) by the spec, for an int code
    and bytes data (the outcome form of the tests' ``outcome``)."""
    value = int.__index__(code)
    if not -128 <= value <= 127:
        return ("raised", OverflowError)
    data = bytes(data)
    size = len(data)
    fixed = {1: b"\xd4", 2: b"\xd5", 4: b"\xd6", 8: b"\xd7", 16: b"\xd8"}
    if size in fixed:
        header = fixed[size]
    elif size <= 0xFF:
        header = b"\xc7" + size.to_bytes(1, "big")
    elif size <= 0xFFFF:
        header = b"\xc8" + size.to_bytes(2, "big")
    else:
        header = b"\xc9" + size.to_bytes(4, "big")
    return ("ok", header + (value & 0xFF).to_bytes(1, "big") + data)
