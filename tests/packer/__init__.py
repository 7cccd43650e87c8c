"""The msgpack Packer: API, conversions, vectors, differential against msgpack-python."""


def outcome(fn, *args, **kwargs):
    """("ok", result) or ("raised", exception type): what the Packer tests compare
    between spanpack and msgpack-python."""
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - the type is what gets compared
        return ("raised", type(exc))
