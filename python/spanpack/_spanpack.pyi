"""Type stubs for the C extension spanpack._spanpack."""

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

class Packer:
    def __init__(
        self,
        *,
        default: Optional[Callable[[Any], Any]] = ...,
        use_single_float: bool = ...,
        autoreset: bool = ...,
        use_bin_type: bool = ...,
        strict_types: bool = ...,
        datetime: bool = ...,
        unicode_errors: Optional[str] = ...,
        buf_size: Optional[int] = ...,
    ) -> None: ...
    def pack(self, obj: Any) -> Optional[bytes]: ...
    def pack_array_header(self, n: int) -> Optional[bytes]: ...
    def pack_map_header(self, n: int) -> Optional[bytes]: ...
    def pack_map_pairs(self, pairs: Iterable[Tuple[Any, Any]]) -> Optional[bytes]: ...
    def pack_ext_type(self, code: int, data: bytes) -> Optional[bytes]: ...
    def bytes(self) -> bytes: ...
    def getbuffer(self) -> memoryview: ...
    def reset(self) -> None: ...

def packb(obj: Any, **options: Any) -> Optional[bytes]: ...

class BufferFull(Exception):
    """args[0]: the rejected trace's encoded size."""

    limit_name: str  # "max_size"
    limit: int

class BufferItemTooLarge(Exception):
    """args[0]: the rejected trace's encoded size."""

    limit_name: str  # "max_item_size" or "max_payload_size"
    limit: int

class EncodedTrace:
    @property
    def version(self) -> str: ...
    def __len__(self) -> int: ...

Span = Any  # a dict, an object with the span fields, or a ddtrace Span
Trace = Sequence[Span]
Fields = Union[None, str, Mapping[str, str]]

class TraceEncoder:
    max_size: int
    max_item_size: int
    @property
    def max_payload_size(self) -> Optional[int]:
        """None: no limit (one payload)."""
    dropped_tags: int
    def __init__(
        self,
        version: str = ...,
        fields: Fields = ...,
        *,
        max_size: Optional[int] = ...,
        max_item_size: Optional[int] = ...,
        max_payload_size: Optional[int] = ...,
        lenient: bool = ...,
        intern: bool = ...,
        native_span_events: bool = ...,
    ) -> None: ...
    @property
    def size(self) -> int: ...
    @property
    def version(self) -> str: ...
    def __len__(self) -> int: ...
    def encode_traces(self, traces: Sequence[Trace]) -> bytes: ...
    def encode_trace(self, trace: Trace) -> EncodedTrace: ...
    def join_encoded(self, encoded_traces: Sequence[EncodedTrace]) -> bytes: ...
    def put(self, trace: Trace) -> None: ...
    def encode(self) -> List[Tuple[bytes, int]]: ...
    def _intern_stats(self) -> Dict[str, int]: ...
