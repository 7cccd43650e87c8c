"""Type stubs for the C extension spanpack._spanpack."""

from typing import Any, Callable, Dict, Iterable, List, Literal, Mapping, Optional, Sequence, Tuple, Union, final, overload

_Default = Optional[Callable[[Any], Any]]

# The span fields (protocol names) and the wire constants the encoder uses.
SPAN_FIELDS: Tuple[str, ...]
MAX_TEXT_LEN: int
TRUNCATED_PREFIX_LEN: int
TRUNCATION_SUFFIX: str
ORIGIN_KEY: str
TRACE_ID_HIGH_KEY: str
SPAN_LINKS_KEY: str
SPAN_EVENTS_KEY: str
# The in-place readers of CPython internals proven at import ("dict", "instance", "int").
_fast_paths: Tuple[str, ...]

class Packer:
    def __init__(
        self,
        *,
        default: _Default = ...,
        use_single_float: bool = ...,
        autoreset: bool = ...,
        use_bin_type: bool = ...,
        strict_types: bool = ...,
        datetime: bool = ...,
        unicode_errors: Union[None, str, bytes, bytearray] = ...,
        buf_size: Optional[int] = ...,
    ) -> None: ...
    # Each returns the packed bytes, or None when the Packer was made with
    # autoreset=False (the bytes stay in its buffer).
    def pack(self, obj: Any, /) -> Optional[bytes]: ...
    def pack_array_header(self, n: int, /) -> Optional[bytes]: ...
    def pack_map_header(self, n: int, /) -> Optional[bytes]: ...
    def pack_map_pairs(self, pairs: Iterable[Tuple[Any, Any]], /) -> Optional[bytes]: ...
    def pack_ext_type(self, code: int, data: Union[bytes, bytearray, str], /) -> Optional[bytes]: ...
    def bytes(self) -> bytes: ...
    def getbuffer(self) -> memoryview: ...
    def reset(self) -> None: ...

# packb(obj, **options) is Packer(**options).pack(obj): bytes, except None
# with autoreset=False, as msgpack-python's packb.  The last overload is the
# runtime signature.
@overload
def packb(
    obj: Any,
    /,
    *,
    default: _Default = ...,
    use_single_float: bool = ...,
    autoreset: Literal[False],
    use_bin_type: bool = ...,
    strict_types: bool = ...,
    datetime: bool = ...,
    unicode_errors: Union[None, str, bytes, bytearray] = ...,
    buf_size: Optional[int] = ...,
) -> None: ...
@overload
def packb(
    obj: Any,
    /,
    *,
    default: _Default = ...,
    use_single_float: bool = ...,
    autoreset: Literal[True] = ...,
    use_bin_type: bool = ...,
    strict_types: bool = ...,
    datetime: bool = ...,
    unicode_errors: Union[None, str, bytes, bytearray] = ...,
    buf_size: Optional[int] = ...,
) -> bytes: ...
@overload
def packb(
    obj: Any,
    /,
    *,
    default: _Default = ...,
    use_single_float: bool = ...,
    autoreset: bool = ...,
    use_bin_type: bool = ...,
    strict_types: bool = ...,
    datetime: bool = ...,
    unicode_errors: Union[None, str, bytes, bytearray] = ...,
    buf_size: Optional[int] = ...,
) -> Optional[bytes]: ...

# Test hook: the length check of every msgpack header writer.
def _check_msgpack_length(length: int, /) -> None: ...

# spanpack.otel's per-span mapping (ext/otel_map.c); plan: spanpack.otel._map_in_c.
def _otel_map_spans(
    spans: Sequence[Any], plan: Tuple[Any, ...], as_objects: bool = ..., /
) -> List[Optional[Any]]: ...
def _otel_group_traces(
    dd_spans: List[Any], priority_key: str, default_priority: Any, /
) -> List[List[Any]]: ...

class BufferFull(Exception):
    """args[0]: the rejected trace's encoded size."""

    limit_name: str  # "max_size"
    limit: int

class BufferItemTooLarge(Exception):
    """args[0]: the rejected trace's encoded size."""

    limit_name: str  # "max_item_size" or "max_payload_size"
    limit: int

class SpanFieldWarning(UserWarning):
    """A span class keeps a field under another common name (tags for meta,
    duration for duration_ns, ...), which is not written; issued once per
    class, at its first span.  Map the field with fields= to read it or to
    silence the warning."""

@final
class EncodedTrace:
    @property
    def version(self) -> str: ...
    def __len__(self) -> int: ...

_Span = Any  # a dict, an object with the span fields, or a ddtrace Span
_Trace = Sequence[_Span]
# A protocol field -> its attribute; start_ns and duration_ns may also map to
# (attribute, unit), unit one of "s", "ms", "us", "ns".  meta and metrics
# naming one attribute: one mixed tags mapping, split by value type (str and
# bool to meta, int and float to metrics; docs/wire-format.md).
_Fields = Union[None, str, Mapping[str, Union[str, Tuple[str, str]]]]

class TraceEncoder:
    def __init__(
        self,
        version: str = ...,
        fields: _Fields = ...,
        *,
        max_size: Optional[int] = ...,
        max_item_size: Optional[int] = ...,
        max_payload_size: Optional[int] = ...,
        lenient: bool = ...,
        intern: bool = ...,
        native_span_events: bool = ...,
        # v0.4/v0.5 only: tags every span gets unless it has the key itself.
        default_meta: Optional[Mapping[str, str]] = ...,
        default_metrics: Optional[Mapping[str, Union[int, float]]] = ...,
        # A span carrying what is not written is a TypeError, naming it.
        strict: bool = ...,
    ) -> None: ...
    # The limits and the counter are read-only at run time.
    @property
    def max_size(self) -> int: ...
    @property
    def max_item_size(self) -> int: ...
    @property
    def max_payload_size(self) -> Optional[int]:
        """None: no limit (one payload)."""
    @property
    def dropped_tags(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def version(self) -> str: ...
    def __len__(self) -> int: ...
    def encode_traces(self, traces: Sequence[_Trace], /) -> bytes: ...
    def encode_trace(self, trace: _Trace, /) -> EncodedTrace: ...
    def join_encoded(self, encoded_traces: Sequence[EncodedTrace], /) -> bytes: ...
    def put(self, trace: _Trace, /) -> None: ...
    def encode(self) -> List[Tuple[bytes, int]]: ...
    def _intern_stats(self) -> Dict[str, int]: ...
    # AgentWriter's intake (spanpack.writer): after _start_intake(wake_size),
    # _put_counted keeps each trace object (encode() then gives
    # (payload, count, traces) triples) and counts in the same call what it
    # takes and refuses: 0 taken, 1 taken and wake_size reached, 2 + a
    # reason refused (bad input included: not raised, its text kept for
    # _take_last_error); _intake_counts() is (buffered, buffer_full,
    # trace_too_large, bad_input, interrupted, closed).
    def _start_intake(self, wake_size: int, /) -> None: ...
    def _put_counted(self, trace: _Trace, /) -> int: ...
    def _intake_counts(self) -> Tuple[int, int, int, int, int, int]: ...
    def _take_last_error(self) -> Optional[str]: ...
    def _close_intake(self) -> None: ...
