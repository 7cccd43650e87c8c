"""Type stubs for spanpack.writer (the public surface of AgentWriter)."""

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypedDict

from ._spanpack import _Trace as Trace

log: logging.Logger

VERSIONS: Tuple[str, ...]
DROP_REASONS: Tuple[str, ...]
DEFAULT_FLUSH_INTERVAL: float
DEFAULT_MAX_BUFFER_SIZE: int
DEFAULT_MAX_PAYLOAD_SIZE: int
DEFAULT_TIMEOUT: float
DEFAULT_MAX_ATTEMPTS: int
DEFAULT_RETRY_BACKOFF: float
BUFFER_BYTES_SHARE: int

class WriterStats(TypedDict):
    """``AgentWriter.stats``: traces_written == traces_sent + traces_dropped + traces_buffered."""

    traces_written: int
    traces_sent: int  # confirmed by a 2xx, or sent whole with no reply (those are also in the next)
    traces_sent_unconfirmed: int  # sent whole, no reply: the agent may have them; never resent
    traces_dropped: int
    traces_buffered: int  # in the buffer, or in the batch being sent
    dropped_by_reason: Dict[str, int]  # every reason of DROP_REASONS, 0 included
    spans_sent: int
    payloads_sent: int
    bytes_sent: int
    retries: int
    replies_too_large: int  # replies over 1 MiB, refused unread
    writer_errors: int  # unexpected errors on the flush thread (logged with their traceback)
    on_response_errors: int
    thread_starts: int  # 1, or more if the flush thread had to be restarted
    version: Optional[str]  # None until known

def supported_versions(**encoder_options: Any) -> List[str]: ...
def choose_version(advertised_endpoints: Sequence[str], supported: Sequence[str]) -> str: ...

class AgentWriter:
    url: str
    flush_interval: float
    max_buffer_size: int
    max_payload_size: int
    timeout: float
    on_response: Optional[Callable[[Dict[str, Any]], None]]
    max_attempts: int
    retry_backoff: float
    def __init__(
        self,
        url: Optional[str] = ...,
        version: str = ...,
        flush_interval: float = ...,
        max_buffer_size: int = ...,
        max_payload_size: int = ...,
        timeout: float = ...,
        on_response: Optional[Callable[[Dict[str, Any]], None]] = ...,
        *,
        max_attempts: int = ...,
        retry_backoff: float = ...,
        **encoder_options: Any,
    ) -> None: ...
    def write(self, trace: Trace) -> None: ...
    def flush(self, timeout: Optional[float] = ...) -> bool: ...
    def stop(self, timeout: Optional[float] = ...) -> bool: ...
    @property
    def stats(self) -> WriterStats: ...
    @property
    def version(self) -> Optional[str]: ...
