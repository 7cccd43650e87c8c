"""Make ddtrace's own trace writers encode their v0.4/v0.5 payloads with spanpack.

``spanpack.ddtrace.install()`` hands ddtrace's writers (its native writer,
the default from 4.2 on, and its Python ``AgentWriter`` of 4.2 to 4.7,
chosen with ``_DD_TRACE_WRITER_NATIVE=false``) a spanpack encoder in place of
ddtrace's ``MsgpackEncoderV04`` / ``MsgpackEncoderV05``.  Every one of those
writers, native or not, encodes in Python: it calls ``client.encoder.put()``
on the application thread when a trace finishes and ``client.encoder.encode()``
on its flush thread, and only the sending of the finished payload is native
(libdatadog's exporter, in the native writer).  So one substitution serves
both, and ddtrace's buffering, size limits, retries, downgrade to v0.4,
metrics and sending stay its own.

What is replaced, and how it is undone:

* the ``MSGPACK_ENCODERS`` name that ddtrace's ``writer_client`` module reads
  when a writer client is made (``AgentWriterClientV4/V5``), so every writer
  made afterwards (``recreate()``, a fork, the v0.5 -> v0.4 downgrade) gets a
  spanpack encoder; ``ddtrace.internal.encoding.MSGPACK_ENCODERS`` itself is
  not changed;
* the encoder of each client of the global tracer's current writer.  Traces
  that encoder already holds are not lost: the spanpack encoder keeps it and
  flushes it with its own payloads.

``uninstall()`` puts the module's name back and turns every spanpack encoder
it handed out into a pass-through to a ddtrace encoder: traces from then on
are encoded by ddtrace's code, and what spanpack already buffered is still
flushed.

Nothing is changed unless all of this is as expected: a ddtrace release line
spanpack knows (4.2 to 4.16), the classes and names above where they are, the
writer client reading ``MSGPACK_ENCODERS`` when it is made, and spanpack
encoding a probe trace of ddtrace's own ``Span`` class byte for byte as
ddtrace does.  Otherwise ``install()`` logs one warning (logger
``spanpack.ddtrace``), returns False, and ddtrace is left as it was.

A trace spanpack refuses (a ``TypeError`` or ``ValueError`` for span data it
will not write) is handed to ddtrace's own encoder, which then does with it
exactly what it would have done without ``install()``; spanpack's limit
errors are raised as ddtrace's ``BufferFull`` / ``BufferItemTooLarge``, the
exceptions ddtrace's writer counts and logs.

This module imports ddtrace only inside ``install()`` (``import spanpack``
never imports it).
"""

from __future__ import annotations

import logging
import re
import threading
from types import ModuleType
from typing import Any, Dict, List, Optional, Tuple

from ._spanpack import BufferFull as _SpanpackBufferFull
from ._spanpack import BufferItemTooLarge as _SpanpackItemTooLarge
from .encoder import TraceMsgPackEncoder

__all__ = ["DdtraceWriterEncoder", "install", "installed", "uninstall"]

_log = logging.getLogger("spanpack.ddtrace")

#: The ddtrace release lines this module was written and tested against
#: (4.2.3, 4.3.2, 4.9.7 and 4.16.0 end to end), inclusive.
KNOWN_RELEASES = ((4, 2), (4, 16))

#: The payload versions whose encoders are replaced.
VERSIONS = ("v0.4", "v0.5")


class _DdtraceParts:
    """What install() found in ddtrace and changes: the writer client module,
    its original ``MSGPACK_ENCODERS``, ddtrace's encoder classes and the two
    exceptions its writer catches."""

    def __init__(
        self,
        version: str,
        writer_client: ModuleType,
        original_encoders: Any,
        encoder_classes: Dict[str, Any],
        buffer_full: Any,
        item_too_large: Any,
        native_span_events: Any,
    ) -> None:
        self.version = version
        self.writer_client = writer_client
        self.original_encoders = original_encoders
        self.encoder_classes = encoder_classes
        self.buffer_full = buffer_full
        self.item_too_large = item_too_large
        # ddtrace's agent settings: its v0.4 encoder reads
        # trace_native_span_events when it is made, and so do ours.
        self.native_span_events = native_span_events

    def native_span_events_now(self) -> bool:
        return bool(getattr(self.native_span_events, "trace_native_span_events", False))


class DdtraceWriterEncoder:
    """A spanpack encoder with the face of ddtrace's ``MsgpackEncoderV04`` /
    ``MsgpackEncoderV05``, as ddtrace's writers use it: ``put(trace)`` on the
    application thread, ``encode()`` -> ``[(payload, trace_count)]`` on the
    flush thread, ``len()``, ``size``, ``max_size``, ``max_item_size``,
    ``content_type``; the limit errors are ddtrace's exception classes.

    Made by install(), not by hand.  It keeps a ddtrace encoder of the same
    version and limits beside it, made when first needed: for the traces
    spanpack refuses, for the traces a replaced encoder already held
    (``adopted``), and for every trace after uninstall().  ``encode()``
    returns spanpack's payload and then that encoder's, when each holds
    traces; each payload is complete on its own, as the writer sends it.
    """

    content_type = "application/msgpack"

    def __init__(
        self,
        version: str,
        max_size: int,
        max_item_size: int,
        parts: _DdtraceParts,
        adopted: Any = None,
    ) -> None:
        self._version = version
        self._parts = parts
        self._spanpack = TraceMsgPackEncoder(
            version,
            max_size=max_size,
            max_item_size=max_item_size,
            native_span_events=version == "v0.4" and parts.native_span_events_now(),
        )
        self._spanpack_put = self._spanpack.put
        self._ddtrace_encoder: Any = adopted
        self._ddtrace_encoder_lock = threading.Lock()
        # After uninstall(): every trace goes to ddtrace's encoder.
        self.passthrough = False
        #: Traces spanpack refused and ddtrace's encoder was given instead.
        self.fallback_traces = 0

    # -- the limits, as ddtrace's encoder reports them -----------------------

    @property
    def max_size(self) -> int:
        return self._spanpack.max_size

    @property
    def max_item_size(self) -> int:
        return self._spanpack.max_item_size

    @property
    def version(self) -> str:
        return self._version

    @property
    def size(self) -> int:
        size: int = self._spanpack.size
        other = self._ddtrace_encoder
        # An empty ddtrace encoder still reports an empty payload's few
        # bytes; those would be counted twice.
        if other is not None and len(other):
            size += other.size
        return size

    def __len__(self) -> int:
        count = len(self._spanpack)
        other = self._ddtrace_encoder
        if other is not None:
            count += len(other)
        return count

    def __repr__(self) -> str:
        return "<spanpack.ddtrace.DdtraceWriterEncoder %s, %d traces, %d bytes%s>" % (
            self._version,
            len(self),
            self.size,
            ", passthrough" if self.passthrough else "",
        )

    # -- buffering ------------------------------------------------------------

    def put(self, trace: List[Any]) -> None:
        if self.passthrough:
            self._ddtrace().put(trace)
            return
        try:
            self._spanpack_put(trace)
        except _SpanpackBufferFull as error:
            # The limit errors, raised as the classes ddtrace's writer catches
            # (it counts and logs the dropped trace by args[0], its size).
            raise self._parts.buffer_full(*error.args) from None
        except _SpanpackItemTooLarge as error:
            raise self._parts.item_too_large(*error.args) from None
        except Exception:
            # Span data spanpack will not write (docs/wire-format.md), or an
            # error from the spans' own code: ddtrace's encoder gets the trace
            # and does with it what it would have done without install():
            # writes it, or raises what it raises.
            self.fallback_traces += 1
            _log.debug("spanpack refused a trace; ddtrace's encoder takes it", exc_info=True)
            self._ddtrace().put(trace)

    def encode(self) -> List[Tuple[Optional[bytes], int]]:
        payloads: List[Tuple[Optional[bytes], int]] = list(self._spanpack.encode())
        other = self._ddtrace_encoder
        if other is not None and len(other):
            try:
                payloads.extend(other.encode())
            except Exception:
                # ddtrace's encoder lost its own traces, as it would have
                # without install(); spanpack's payload is still sent.
                _log.error("ddtrace's encoder failed to encode the traces it held", exc_info=True)
        return payloads

    def _ddtrace(self) -> Any:
        """ddtrace's own encoder of this version and these limits."""
        encoder = self._ddtrace_encoder
        if encoder is None:
            with self._ddtrace_encoder_lock:
                encoder = self._ddtrace_encoder
                if encoder is None:
                    encoder = self._parts.encoder_classes[self._version](
                        max_size=self.max_size, max_item_size=self.max_item_size
                    )
                    self._ddtrace_encoder = encoder
        return encoder


class _EncoderFactory:
    """Stands in for one of ddtrace's encoder classes in the writer client's
    ``MSGPACK_ENCODERS``: called as ddtrace calls the class."""

    def __init__(self, version: str, parts: _DdtraceParts) -> None:
        self.version = version
        self.parts = parts

    def __call__(self, max_size: int, max_item_size: int) -> DdtraceWriterEncoder:
        return _track(DdtraceWriterEncoder(self.version, max_size, max_item_size, self.parts))

    def __repr__(self) -> str:
        return "<spanpack encoder for ddtrace %s>" % self.version


_state_lock = threading.RLock()
_installed: Optional[_DdtraceParts] = None
# Every encoder handed out, weakly: uninstall() turns them to pass-through
# and install() back.  A WeakSet, so a writer's encoder dies with it.
_handed_out: Any = None


def _track(encoder: DdtraceWriterEncoder) -> DdtraceWriterEncoder:
    global _handed_out
    if _handed_out is None:
        import weakref

        _handed_out = weakref.WeakSet()
    _handed_out.add(encoder)
    return encoder


def installed() -> bool:
    """Whether ddtrace's writers encode with spanpack now."""
    return _installed is not None


def install() -> bool:
    """Make ddtrace's writers encode v0.4/v0.5 with spanpack.

    True when spanpack encodes for ddtrace after the call (installed now or
    already); False, with one warning logged, when this ddtrace is not one
    spanpack knows, in which case nothing in ddtrace was changed.
    """
    global _installed
    with _state_lock:
        if _installed is not None:
            return True
        try:
            found = _inspect_ddtrace()
        except Exception as error:  # install() must never break the program
            found = "inspecting it failed (%s: %s)" % (type(error).__name__, error)
        if isinstance(found, str):
            _log.warning("spanpack.ddtrace.install(): ddtrace left unchanged: %s", found)
            return False
        parts = found
        replacement = dict(parts.original_encoders)
        for version in VERSIONS:
            replacement[version] = _EncoderFactory(version, parts)
        # New writer clients from now on; then the writer already running.
        setattr(parts.writer_client, "MSGPACK_ENCODERS", replacement)
        try:
            _replace_live_encoders(parts)
        except Exception as error:
            # Nothing of the running writer was changed (its encoders are all
            # made before any is assigned); only the name is to be put back.
            setattr(parts.writer_client, "MSGPACK_ENCODERS", parts.original_encoders)
            _log.warning("spanpack.ddtrace.install(): ddtrace left unchanged: the running writer's encoder "
                         "could not be replaced (%s: %s)", type(error).__name__, error)
            return False
        _installed = parts
        for encoder in list(_handed_out or ()):
            encoder.passthrough = False
        return True


def uninstall() -> bool:
    """Give ddtrace its own encoders back.  True if spanpack was installed.

    Writers made from now on get ddtrace's encoder classes; encoders already
    handed out pass every new trace to a ddtrace encoder and still flush what
    spanpack buffered, so no trace is lost."""
    global _installed
    with _state_lock:
        parts = _installed
        if parts is None:
            return False
        setattr(parts.writer_client, "MSGPACK_ENCODERS", parts.original_encoders)
        for encoder in list(_handed_out or ()):
            encoder.passthrough = True
        _installed = None
        return True


def _replace_live_encoders(parts: _DdtraceParts) -> None:
    """Give the global tracer's current writer spanpack encoders."""
    import sys

    trace_module = sys.modules.get("ddtrace.trace")
    tracer = getattr(trace_module, "tracer", None)
    aggregator = getattr(tracer, "_span_aggregator", None)
    writer = getattr(aggregator, "writer", None)
    clients = getattr(writer, "_clients", None)
    if not isinstance(clients, list):
        return  # LogWriter (AWS Lambda without the extension), or no tracer yet
    versions_of = {cls: version for version, cls in parts.encoder_classes.items()}
    replacements = []
    for client in clients:
        current: Any = getattr(client, "encoder", None)
        version = versions_of.get(type(current))
        if version is None:
            continue  # ours already, or another encoder (CI Visibility, JSON)
        replacements.append(
            (client, DdtraceWriterEncoder(version, current.max_size, current.max_item_size, parts, adopted=current))
        )
    # All made first, so that a failure above leaves every client as it was.
    for client, encoder in replacements:
        client.encoder = _track(encoder)


def _release_line(version: str) -> Optional[Tuple[int, int]]:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _inspect_ddtrace() -> Any:
    """A _DdtraceParts when ddtrace is as install() expects, else the reason (str)."""
    try:
        import ddtrace
    except Exception as error:  # not installed, or failing to import
        return "ddtrace does not import (%s: %s)" % (type(error).__name__, error)
    version = str(getattr(ddtrace, "__version__", "?"))
    line = _release_line(version)
    low, high = KNOWN_RELEASES
    if line is None or not low <= line <= high:
        return "ddtrace %s is not a release spanpack knows (%d.%d to %d.%d)" % ((version,) + low + high)
    try:
        from ddtrace.internal import _encoding
        from ddtrace.internal.settings import _agent as agent_settings
        from ddtrace.internal.writer import writer as writer_module
        from ddtrace.internal.writer import writer_client
    except Exception as error:
        return "ddtrace %s: its writer modules do not import as expected (%s: %s)" % (
            version, type(error).__name__, error)

    encoder_classes: Dict[str, Any] = {
        "v0.4": getattr(_encoding, "MsgpackEncoderV04", None),
        "v0.5": getattr(_encoding, "MsgpackEncoderV05", None),
    }
    registry = getattr(writer_client, "MSGPACK_ENCODERS", None)
    if not isinstance(registry, dict):
        return "ddtrace %s: writer_client.MSGPACK_ENCODERS is not a dict" % version
    for name, cls in encoder_classes.items():
        if not isinstance(cls, type) or registry.get(name) is not cls:
            # Someone else replaced them, or ddtrace moved them.
            return "ddtrace %s: writer_client.MSGPACK_ENCODERS[%r] is %r, not ddtrace's MsgpackEncoder class" % (
                version, name, registry.get(name))
    for client_name in ("AgentWriterClientV4", "AgentWriterClientV5"):
        client_class = getattr(writer_client, client_name, None)
        code = getattr(getattr(client_class, "__init__", None), "__code__", None)
        if code is None or "MSGPACK_ENCODERS" not in code.co_names:
            # The replacement works only if the client looks the name up when made.
            return "ddtrace %s: writer_client.%s does not take its encoder from MSGPACK_ENCODERS" % (
                version, client_name)
    buffer_full: Any = getattr(_encoding, "BufferFull", None)
    item_too_large: Any = getattr(_encoding, "BufferItemTooLarge", None)
    for name, exc in (("BufferFull", buffer_full), ("BufferItemTooLarge", item_too_large)):
        if not (isinstance(exc, type) and issubclass(exc, Exception)) or getattr(writer_module, name, None) is not exc:
            return "ddtrace %s: the writer does not catch _encoding.%s" % (version, name)
    agent_config = getattr(agent_settings, "config", None)
    if not hasattr(agent_config, "trace_native_span_events"):
        return "ddtrace %s: no agent setting trace_native_span_events" % version

    parts = _DdtraceParts(
        version, writer_client, registry, dict(encoder_classes), buffer_full, item_too_large, agent_config
    )
    mismatch = _probe(parts)
    if mismatch:
        return "ddtrace %s: %s" % (version, mismatch)
    return parts


def _probe(parts: _DdtraceParts) -> Optional[str]:
    """None when spanpack encodes a trace of ddtrace's own Span class byte for
    byte as ddtrace's encoders do (both versions), else what went wrong.  The
    spans are made directly, outside any tracer, so nothing is sent."""
    try:
        from ddtrace._trace.span import Span

        root = Span("spanpack.probe", service="probe", resource="GET /", span_type="web",
                    trace_id=0x5BA2C0DE, span_id=0x11, parent_id=None, start=1)
        root.set_tag("probe.tag", "value")
        root.set_metric("probe.metric", 2.5)
        child = Span("spanpack.probe.child", service="probe", trace_id=0x5BA2C0DE, span_id=0x12,
                     parent_id=0x11, start=1)
        child.set_tag("error.message", "probe")
        child.error = 1
        child.finish(2)
        root.finish(3)
        trace = [root, child]
    except Exception as error:
        return "a probe trace of ddtrace's Span class could not be made (%s: %s)" % (type(error).__name__, error)
    for version in VERSIONS:
        try:
            theirs = parts.encoder_classes[version](max_size=1 << 20, max_item_size=1 << 20)
            theirs.put(list(trace))
            expected = theirs.encode()
            ours = DdtraceWriterEncoder(version, 1 << 20, 1 << 20, parts)
            ours.put(list(trace))
            got = ours.encode()
        except Exception as error:
            return "the %s probe trace failed (%s: %s)" % (version, type(error).__name__, error)
        if ours.fallback_traces:
            return "spanpack refused the %s probe trace of ddtrace's Span class" % version
        if got != expected:
            return "spanpack's %s payload of the probe trace differs from ddtrace's" % version
    return None
