"""spanpack: fast msgpack encoding of tracing spans into Datadog agent payloads.

The core is the C extension ``spanpack._spanpack``; this package re-exports it
and adds the Python layer (headers, sending, the AgentWriter).
"""

__version__ = "0.1.0"

from ._ext import ExtType, Timestamp
from ._spanpack import BufferFull, BufferItemTooLarge, EncodedTrace, Packer, packb
from .encoder import TraceMsgPackEncoder, payload_headers
from .transport import send
from .writer import AgentWriter

__all__ = [
    "AgentWriter",
    "BufferFull",
    "BufferItemTooLarge",
    "EncodedTrace",
    "ExtType",
    "Packer",
    "Timestamp",
    "TraceMsgPackEncoder",
    "packb",
    "payload_headers",
    "send",
]
