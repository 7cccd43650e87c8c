"""spanpack: fast msgpack encoding of tracing spans into Datadog agent payloads.

The core is the C extension ``spanpack._spanpack``; this package re-exports it
and adds the Python layer (headers, sending, the AgentWriter, agent versions).
"""

__version__ = "0.1.0"

from ._ext import ExtType, Timestamp
from ._spanpack import BufferFull, BufferItemTooLarge, EncodedTrace, Packer, SpanFieldWarning, packb
from .encoder import TraceMsgPackEncoder, agent_versions, payload_headers
from .transport import send
from .writer import AgentWriter

__all__ = [
    "AgentWriter",
    "BufferFull",
    "BufferItemTooLarge",
    "EncodedTrace",
    "ExtType",
    "Packer",
    "SpanFieldWarning",
    "Timestamp",
    "TraceMsgPackEncoder",
    "agent_versions",
    "packb",
    "payload_headers",
    "send",
]
