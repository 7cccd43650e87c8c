"""spanpack: fast msgpack encoding of tracing spans into Datadog agent payloads.

The core is the C extension ``spanpack._spanpack``; this package re-exports it.
"""

from ._ext import ExtType, Timestamp
from ._spanpack import Packer, packb

__all__ = ["ExtType", "Packer", "Timestamp", "packb"]
__version__ = "0.1.0"
