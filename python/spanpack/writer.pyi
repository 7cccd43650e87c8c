"""Type stubs for spanpack.writer (the public surface of AgentWriter)."""

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

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
    def stats(self) -> Dict[str, Any]: ...
    @property
    def version(self) -> str: ...
