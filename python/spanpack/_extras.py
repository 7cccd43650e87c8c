"""Span links and span events, shaped the way the reference tracer sends them.

They are rare (most spans have neither), so the C encoder hands them to these
functions instead of duplicating their many small rules in C.  A link or an
event may be a ddtrace object, a dict, or any object with the attributes.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

# The C module adds its constants before it imports this module.
from ._spanpack import MAX_TEXT_LEN as _MAX_TEXT_LEN
from ._spanpack import TRUNCATED_PREFIX_LEN as _TRUNCATED_PREFIX_LEN
from ._spanpack import TRUNCATION_SUFFIX as _TRUNCATION_SUFFIX

_FLAGS_SET_BIT = 1 << 31
_LOW_64_BITS = (1 << 64) - 1

# Native (v0.4) span-event attribute type codes.
_STRING, _BOOL, _INT, _DOUBLE, _ARRAY = range(5)


def _truncate(text: Any) -> Any:
    if isinstance(text, str) and len(text) > _MAX_TEXT_LEN:
        return text[:_TRUNCATED_PREFIX_LEN] + _TRUNCATION_SUFFIX
    return text


def _field(item: Any, name: str, default: Any = None) -> Any:
    if isinstance(item, dict):
        return item.get(name, default)
    return getattr(item, name, default)


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple, set, frozenset))


def _flatten(root_key: str, value: Any, out: Dict[str, Any]) -> None:
    """Lists become key.0, key.1, ... recursively."""
    if not _is_sequence(value):
        out[root_key] = value
        return
    for position, item in enumerate(value):
        _flatten(f"{root_key}.{position}", item, out)


def _attribute_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _link_id(link: Any, name: str, bits: int) -> int:
    value = _field(link, name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << bits:
        raise TypeError(f"span link {name} must be an int in [0, 2**{bits}), not {value!r}")
    return value


def _link_dict(link: Any) -> Dict[str, Any]:
    """The link as ddtrace's SpanLink.to_dict() gives it (hex-string ids)."""
    to_dict = getattr(link, "to_dict", None)
    if to_dict is not None and not isinstance(link, dict):
        return to_dict()
    trace_id = _link_id(link, "trace_id", 128)
    span_id = _link_id(link, "span_id", 64)
    result: Dict[str, Any] = {"trace_id": f"{trace_id:032x}", "span_id": f"{span_id:016x}"}
    attributes = _field(link, "attributes")
    if attributes:
        flat: Dict[str, Any] = {}
        for key, value in attributes.items():
            _flatten(key, value, flat)
        result["attributes"] = {key: _attribute_text(value) for key, value in flat.items()}
    dropped = _field(link, "dropped_attributes_count", 0) or 0
    if dropped > 0:
        result["dropped_attributes_count"] = dropped
    tracestate = _field(link, "tracestate")
    if tracestate:
        result["tracestate"] = tracestate
    flags = _field(link, "flags")
    if flags is not None:
        result["flags"] = flags
    return result


def links_json(links: List[Any]) -> str:
    """v0.5: links travel as JSON in meta "_dd.span_links"."""
    return json.dumps([_link_dict(link) for link in links])


def links_for_v04(links: List[Any]) -> List[Dict[str, Any]]:
    """v0.4 "span_links": ids as ints, the high half of a 128-bit trace id as
    trace_id_high (last), flags with bit 31 set to mark them as present."""
    converted = []
    for link in links:
        fields = _link_dict(link)
        high = int(fields["trace_id"][:16], 16)
        if high > 0:
            fields["trace_id_high"] = high
        fields["trace_id"] = int(fields["trace_id"][16:], 16)
        fields["span_id"] = int(fields["span_id"], 16)
        if "flags" in fields:
            fields["flags"] = fields["flags"] | _FLAGS_SET_BIT
        # libdatadog's v0.4 decoder rejects the whole payload for this key
        # (ddtrace 4.2.3 writes it); the v0.5 JSON form keeps it.
        fields.pop("dropped_attributes_count", None)
        out: Dict[str, Any] = {}
        for key, value in fields.items():
            if isinstance(value, bool) or not isinstance(value, (int, float, str, dict)):
                raise TypeError(f"span link field {key!r} has unsupported type {type(value)!r}")
            if isinstance(value, dict):
                value = {_truncate(k): _truncate(v) for k, v in value.items()}
            out[_truncate(key)] = _truncate(value)
        converted.append(out)
    return converted


def _event_fields(event: Any) -> Dict[str, Any]:
    fields = {"name": _field(event, "name"), "time_unix_nano": _field(event, "time_unix_nano")}
    attributes = _field(event, "attributes")
    if attributes:
        fields["attributes"] = attributes
    return fields


def events_json(events: List[Any]) -> str:
    """Events as JSON in meta "events" (v0.5 always; v0.4 unless native):
    whatever json.dumps makes of them, as in the reference tracer."""
    return json.dumps([_event_fields(event) for event in events])


def _native_attribute(value: Any, nested: bool) -> Dict[str, Any]:
    if isinstance(value, str):
        return {"type": _STRING, "string_value": _truncate(value)}
    if isinstance(value, bool):
        return {"type": _BOOL, "bool_value": value}
    if isinstance(value, int):
        if not -(1 << 63) <= value <= _LOW_64_BITS:
            raise OverflowError(f"span event attribute {value!r} does not fit in 64 bits")
        return {"type": _INT, "int_value": value}
    if isinstance(value, float):
        return {"type": _DOUBLE, "double_value": value}
    if isinstance(value, list) and not nested:
        values = [_native_attribute(item, True) for item in value]
        return {"type": _ARRAY, "array_value": {"values": values}}
    raise TypeError(f"unsupported span event attribute {value!r}")


def events_for_v04(events: List[Any]) -> List[Dict[str, Any]]:
    """v0.4 native "span_events": typed attribute values."""
    converted = []
    for event in events:
        fields = _event_fields(event)
        if not isinstance(fields["name"], str):
            raise TypeError(f"span event name must be str, not {fields['name']!r}")
        time = fields["time_unix_nano"]
        if isinstance(time, bool) or not isinstance(time, int) or not 0 <= time <= _LOW_64_BITS:
            raise TypeError(f"span event time_unix_nano must be an int in [0, 2**64), not {time!r}")
        for key in fields.get("attributes", ()):
            if not isinstance(key, str):
                raise TypeError(f"span event attribute keys must be str, not {key!r}")
        out: Dict[str, Any] = {
            "name": _truncate(fields["name"]),
            "time_unix_nano": fields["time_unix_nano"],
        }
        if "attributes" in fields:
            out["attributes"] = {
                _truncate(key): _native_attribute(value, False)
                for key, value in fields["attributes"].items()
            }
        converted.append(out)
    return converted


# ---------------------------------------------------------------------------
# v1.0: links and events as integer-keyed maps.  The C writer packs the
# result as plain msgpack, except that every str is written as a streamed
# string (docs/wire-format-v1.md).

# Value types of a v1.0 attribute triplet.
_V1_STRING, _V1_BOOL, _V1_DOUBLE, _V1_INT, _V1_BYTES, _V1_ARRAY = 1, 2, 3, 4, 5, 6
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def links_for_v10(links: List[Any]) -> List[Dict[int, Any]]:
    """Links: 1 trace id (16 bytes, big-endian), 2 span id, 3 attributes
    (string triplets, lists flattened as in v0.4), 4 tracestate, 5 flags
    (bit 31 set, as in v0.4, to say that they are present)."""
    converted = []
    for link in links:
        fields = _link_dict(link)
        out: Dict[int, Any] = {
            1: int(fields["trace_id"], 16).to_bytes(16, "big"),
            2: int(fields["span_id"], 16),
        }
        attributes = fields.get("attributes")
        if attributes:
            triplets: List[Any] = []
            for key, value in attributes.items():
                if not isinstance(key, str) or not isinstance(value, str):
                    raise TypeError(f"span link attribute {key!r} must be str, not {value!r}")
                triplets += [_truncate(key), _V1_STRING, _truncate(value)]
            out[3] = triplets
        tracestate = fields.get("tracestate")
        if tracestate:
            if not isinstance(tracestate, str):
                raise TypeError(f"span link tracestate must be str, not {tracestate!r}")
            out[4] = _truncate(tracestate)
        flags = fields.get("flags")
        if flags is not None:
            if isinstance(flags, bool) or not isinstance(flags, int) or not 0 <= flags < 1 << 32:
                raise TypeError(f"span link flags must be an int in [0, 2**32), not {flags!r}")
            out[5] = flags | _FLAGS_SET_BIT
        converted.append(out)
    return converted


def _v10_value(value: Any, nested: bool) -> List[Any]:
    """[type, value] of one event attribute value."""
    if isinstance(value, str):
        return [_V1_STRING, _truncate(value)]
    if isinstance(value, bool):
        return [_V1_BOOL, value]
    if isinstance(value, int):
        if not _I64_MIN <= value <= _I64_MAX:
            raise OverflowError(f"span event attribute {value!r} does not fit in int64")
        return [_V1_INT, value]
    if isinstance(value, float):
        return [_V1_DOUBLE, value]
    if isinstance(value, list) and not nested:
        items: List[Any] = []
        for item in value:
            items += _v10_value(item, True)
        return [_V1_ARRAY, items]
    raise TypeError(f"unsupported span event attribute {value!r}")


def events_for_v10(events: List[Any]) -> List[Dict[int, Any]]:
    """Events: 1 time (ns), 2 name, 3 attributes as typed triplets (an array
    value holds a type and a value per element)."""
    converted = []
    for event in events_for_v04(events):
        out: Dict[int, Any] = {1: event["time_unix_nano"], 2: event["name"]}
        attributes = _event_fields(event).get("attributes")
        if attributes:
            triplets: List[Any] = []
            for key, value in attributes.items():
                triplets += [key, *_v10_value(_plain_attribute(value), False)]
            out[3] = triplets
        converted.append(out)
    return converted


def _plain_attribute(native: Dict[str, Any]) -> Any:
    """Back from events_for_v04's typed form to the value (already checked)."""
    kind = native["type"]
    if kind == _ARRAY:
        return [_plain_attribute(item) for item in native["array_value"]["values"]]
    return native[("string_value", "bool_value", "int_value", "double_value")[kind]]
