"""AgentWriter: buffer finished traces and send them to a Datadog trace agent.

The application thread encodes each trace into the encoder's own buffer
(``put``: exact bytes, all-or-nothing) and keeps a reference to the trace; a
background thread takes the buffer as payloads (``encode``) and owns the
network: the kept-alive connection, version negotiation, retries, splitting
and downgrades.

The ledger.  At every moment ``traces_written == traces_sent +
traces_dropped + traces_buffered``, and the three are each what they say:

- buffered: ``len(encoder)`` (the C encoder counts a trace inside the same
  ``put`` call that stores it) plus the unsettled traces of the batch the
  flush thread holds;
- dropped at ``write()``: one ``next()`` on the reason's ``itertools.count``,
  a single C call (read back from its ``repr``);
- everything else (sent, dropped later, unconfirmed) is counted by the flush
  thread, under the lock.  Signal handlers run on the main thread only, so
  nothing can interrupt those multi-step updates half-way, and readers take
  the lock.

``traces_written`` is the sum, not a counter of its own: a counter would be
a second step that an exception from a signal handler could separate from
the first.  A ``write()`` that such an exception interrupts either took the
trace (buffered) or not (then it raised before the trace reached the
encoder, and the trace is in no count because it was never taken).

What a buffered trace is kept as: its bytes in the encoder's buffer, and the
trace object itself until its payload is settled, for re-encoding after a
413 (split) or a version downgrade.  The objects count against
``max_buffer_size``: the encoder may hold ``max_buffer_size // 8`` bytes,
the rest is left for the objects (a trace's objects take 2-7x its encoded
size in measurements).  Should the list of kept objects and the encoder ever
disagree (an exception between ``put`` and the append), that batch is still
sent and counted exactly; only its re-encoding is given up.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import itertools
import json
import logging
import os
import random
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypedDict, TypeVar, Union, cast

from ._extras import _I64_MAX, _I64_MIN, _truncate
from ._spanpack import (
    MAX_TEXT_LEN,
    ORIGIN_KEY,
    SPAN_EVENTS_KEY,
    SPAN_LINKS_KEY,
    TRACE_ID_HIGH_KEY,
    BufferFull,
    BufferItemTooLarge,
)
from .encoder import TraceMsgPackEncoder, agent_versions, payload_headers
from .transport import MAX_REPLY_SIZE, AgentConnection, RequestFailed, agent_url_from_env, parse_agent_url

log = logging.getLogger("spanpack.writer")

#: Trace API versions, best first; "auto" picks the best the agent and the
#: installed encoder both support.
VERSIONS = ("v1.0", "v0.5", "v0.4")

#: Why a trace was dropped (the keys of ``stats["dropped_by_reason"]``, all present).
DROP_REASONS = (
    "buffer_full",  # write() found the buffer at its limit
    "trace_too_large",  # larger than max_payload_size, or refused with 413 on its own
    "bad_input",  # the encoder raised for this trace
    "interrupted",  # a BaseException (KeyboardInterrupt, SystemExit) from span code during write()
    "agent_refused",  # a 4xx other than 404/413/415/408/429, or a downgrade it could not follow
    "retries_exhausted",  # connection errors, timeouts before the payload was sent, 5xx or 429 on every attempt
    "stopped",  # written after stop(), or not yet sent when stop()'s deadline came
    "writer_error",  # an unexpected error in the writer itself (logged with its traceback)
)

DEFAULT_FLUSH_INTERVAL = 1.0
DEFAULT_MAX_BUFFER_SIZE = 20 << 20
DEFAULT_MAX_PAYLOAD_SIZE = 5 << 20
DEFAULT_TIMEOUT = 2.0
DEFAULT_MAX_ATTEMPTS = 4
DEFAULT_RETRY_BACKOFF = 0.1

#: ``delivery=``: resend a payload sent whole whose reply never came (the
#: agent may then hold it twice), or never (it may then be lost).
DELIVERY_MODES = ("at-least-once", "at-most-once")

#: The encoder's bytes may take this share of max_buffer_size; the trace
#: objects kept for re-encoding are given the rest.
BUFFER_BYTES_SHARE = 8

# Statuses that say "try again later"; 408 is the server giving up on a slow request.
_RETRY_STATUSES = frozenset((408, 429))
# Statuses an agent that does not know this version's endpoint answers.
_DOWNGRADE_STATUSES = frozenset((404, 415))

# v1.0 payload fields the older versions carry as a header instead.
_HEADER_FIELDS = {
    "tracer_version": "Datadog-Meta-Tracer-Version",
    "language_name": "Datadog-Meta-Lang",
    "language_version": "Datadog-Meta-Lang-Version",
    "container_id": "Datadog-Container-ID",
}
# v1.0 payload fields that v0.4/v0.5 payloads carry as a meta tag on every
# span (default tags), under the key the agent reads each from when a payload
# has no such field: the root span's (docs/wire-format.md, "The v1.0 payload
# fields in v0.4/v0.5 payloads").
_CARRIED_FIELDS = {
    "hostname": "_dd.hostname",
    "env": "env",
    "app_version": "version",
    "runtime_id": "runtime-id",
}
# ...and payload_attributes: str values as meta tags, numbers (bools as 1/0)
# as metrics, as the APM test agent puts a v1.0 payload's attributes on every span.
_ATTRIBUTES = "payload_attributes"
_V10_ONLY_FIELDS = tuple(_CARRIED_FIELDS) + (_ATTRIBUTES,)
# Meta keys the encoders write themselves (a default tag cannot take them).
_ENCODER_META_KEYS = frozenset((ORIGIN_KEY, TRACE_ID_HIGH_KEY, SPAN_LINKS_KEY, SPAN_EVENTS_KEY))
_DEFAULT_TAG_OPTIONS = ("default_meta", "default_metrics")
_WRITER_SIZES = ("max_size", "max_item_size", "max_payload_size")

Trace = Sequence[Any]

_live_writers: "weakref.WeakSet[AgentWriter]" = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    for writer in list(_live_writers):
        writer.stop(timeout=writer.timeout)


def _reset_all_in_child() -> None:
    for writer in list(_live_writers):
        writer._reset_after_fork()


atexit.register(_stop_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_all_in_child)


def _encoder_option_names() -> Tuple[str, ...]:
    names = list(inspect.signature(TraceMsgPackEncoder.__init__).parameters)
    return tuple(name for name in names if name not in ("self", "version"))


_ENCODER_OPTIONS = _encoder_option_names()
_installed: Optional[List[str]] = None


def _installed_versions() -> List[str]:
    global _installed
    if _installed is None:
        _installed = supported_versions()
    return _installed


def supported_versions(**encoder_options: Any) -> List[str]:
    """The trace API versions the installed encoder can write, best first.

    A version counts when an encoder for it can be made and its buffer used
    (the writer needs ``put``/``encode``, not only one-shot encoding).
    """
    found = []
    for version in VERSIONS:
        try:
            TraceMsgPackEncoder(version, **encoder_options).encode()
        except (ValueError, TypeError, NotImplementedError):
            continue
        found.append(version)
    return found


def choose_version(advertised_endpoints: Sequence[str], supported: Sequence[str]) -> str:
    """The best version in ``supported`` whose ``/vX.Y/traces`` the agent lists.

    v0.4 when none is listed: every agent accepts it.
    """
    listed = agent_versions({"endpoints": list(advertised_endpoints)})
    for version in supported:
        if version in listed:
            return version
    return "v0.4"


class _Group:
    """Traces to go as one payload, and that payload once encoded."""

    __slots__ = ("traces", "count", "payload", "encoder", "at_agent")

    def __init__(self, traces: Optional[List[Trace]], count: int, payload: Optional[bytes] = None, encoder: Any = None,
                 at_agent: bool = False):
        self.traces = traces  # None: not kept (cannot be re-encoded)
        self.count = count
        self.payload = payload
        self.encoder = encoder  # the encoder that made ``payload``
        # An attempt went out whole and got no reply: the agent may hold
        # these traces, so they are never counted dropped, and each later
        # attempt is a resend.
        self.at_agent = at_agent


class _Batch:
    """What the flush thread took in one swap of the buffer."""

    __slots__ = ("unsettled", "sending", "at_agent")

    def __init__(self, count: int) -> None:
        self.unsettled = count
        self.sending = 0  # traces of the payload whose request is under way (and not in at_agent)
        self.at_agent = 0  # unsettled traces of groups whose ``at_agent`` is set


_SENT, _UNCONFIRMED = "sent", "unconfirmed"
_SPLIT, _REENCODE = "split", "reencode"


class WriterStats(TypedDict):
    """``AgentWriter.stats``: traces_written == traces_sent + traces_dropped + traces_buffered."""

    traces_written: int
    traces_sent: int  # confirmed by a 2xx, or sent whole with no reply (those are also in the next)
    traces_sent_unconfirmed: int  # sent whole, never answered: the agent may have them, or not
    traces_resent: int  # sent again after an attempt that went whole and got no reply: possible duplicates
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


# A `with lock:` may leave the lock held when a signal handler raises just
# after __enter__ returns: its __exit__ is skipped.  CPython 3.14 does so
# (CPython gh-148874, fixed in 3.15), and so does 3.9 (bpo-29988, fixed in
# 3.10); CI's 3.12 run once left it held after 8 of 1,000 raises too (a test
# machine under load), so no version is taken to be free of it.  Signal
# handlers run in the main thread, so the methods a program calls (write,
# flush, stop, stats) release on the way out whatever such an exception left
# held below them: the flush thread, which needs the lock, would otherwise
# wait forever.
# How long a flush thread may take to begin running before it is taken for
# dead and replaced; also how often flush() and stop() look again while
# they wait.
_THREAD_CHECK = 1.0

_Method = TypeVar("_Method", bound=Callable[..., Any])


def _depth(lock: Any) -> Optional[int]:
    """How many times this thread holds `lock` (an RLock); None if it holds
    it but cannot tell how often (3.9's RLock has no _recursion_count)."""
    if hasattr(lock, "_recursion_count"):
        return int(lock._recursion_count())
    return None if lock._is_owned() else 0


def _release_down_to(lock: Any, held: Optional[int]) -> None:
    """Release what this thread holds of `lock` beyond `held` holds."""
    if held is None:
        return
    for _ in range(1 << 20):  # (bounded: release() raises once the lock is free)
        depth = _depth(lock)
        if depth is not None and depth <= held:
            break
        lock.release()


def _holds_on_entry(lock: Any, writer: "AgentWriter", guarded_code: Any) -> Optional[int]:
    """On entry to a guarded method with `lock` held by this thread: how
    many of its holds belong to calls still running below (span code, an
    on_response callback or a signal handler calling the writer again).  On
    the main thread, where signal handlers run and only guarded methods take
    the lock, holds with no guarded call of this writer below were left by
    an exception (a second one can land in the guard's own release): they
    are released here, and the answer is 0."""
    if threading.current_thread() is not threading.main_thread():
        return _depth(lock)  # the flush thread's own loop may hold it
    frame: Any = sys._getframe(2)
    while frame is not None:
        if frame.f_code is guarded_code and frame.f_locals.get("self") is writer:
            return _depth(lock)
        frame = frame.f_back
    _release_down_to(lock, 0)
    return 0


def _releases_leaked_lock(method: _Method) -> _Method:
    def guarded(self: "AgentWriter", *args: Any, **kwargs: Any) -> Any:
        lock: Any = self._lock  # _is_owned() is RLock's, untyped in typeshed
        # On entry the lock is not this thread's unless the call re-entered
        # (or a leak was left): one test each way on the usual path.
        held = _holds_on_entry(lock, self, code) if lock._is_owned() else 0
        try:
            return method(self, *args, **kwargs)
        finally:
            if lock._is_owned():
                _release_down_to(lock, held)

    code = guarded.__code__
    return cast(_Method, functools.wraps(method)(guarded))


class AgentWriter:
    """Send traces to a Datadog trace agent from a background thread.

    ::

        writer = spanpack.AgentWriter()      # the agent from DD_* variables
        writer.write(trace)                  # any thread; never waits on the network
        writer.stop()                        # also run at interpreter exit

    Traces must not be mutated after ``write()``: a split or a downgrade
    re-encodes them from the objects.  See the README for the bounds and
    the counting rules.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        version: str = "auto",
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        max_buffer_size: int = DEFAULT_MAX_BUFFER_SIZE,
        max_payload_size: int = DEFAULT_MAX_PAYLOAD_SIZE,
        timeout: float = DEFAULT_TIMEOUT,
        on_response: Optional[Callable[[Dict[str, Any]], None]] = None,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry_backoff: float = DEFAULT_RETRY_BACKOFF,
        delivery: str = "at-least-once",
        **encoder_options: Any,
    ) -> None:
        unknown = [name for name in encoder_options if name not in _ENCODER_OPTIONS]
        clash = [name for name in unknown if name in _WRITER_SIZES]
        if clash:
            raise TypeError("AgentWriter sets %s itself (use max_buffer_size / max_payload_size)" % ", ".join(clash))
        own_tags = [name for name in _DEFAULT_TAG_OPTIONS if name in encoder_options]
        if own_tags:
            raise TypeError(
                "AgentWriter sets %s itself, from %s, so that every version it may send carries them"
                % (", ".join(own_tags), ", ".join(_V10_ONLY_FIELDS))
            )
        if unknown:
            raise TypeError("AgentWriter() got an unexpected keyword argument %r" % unknown[0])
        if not (flush_interval > 0 and timeout > 0):
            raise ValueError("flush_interval and timeout must be positive")
        if not 0 < max_payload_size <= max_buffer_size:
            raise ValueError("need 0 < max_payload_size <= max_buffer_size")
        if max_attempts < 1 or not retry_backoff >= 0:
            raise ValueError("need max_attempts >= 1 and retry_backoff >= 0")
        if on_response is not None and not callable(on_response):
            raise TypeError("on_response must be callable")
        if delivery not in DELIVERY_MODES:
            raise ValueError("delivery must be %s, not %r" % (" or ".join(map(repr, DELIVERY_MODES)), delivery))
        self.url = url or agent_url_from_env()
        self._address = parse_agent_url(self.url)  # a bad URL fails here, not on the thread
        self.flush_interval = float(flush_interval)
        self.max_buffer_size = int(max_buffer_size)
        self.max_payload_size = int(max_payload_size)
        self.timeout = float(timeout)
        self.on_response = on_response
        self.max_attempts = int(max_attempts)
        self.retry_backoff = float(retry_backoff)
        self.delivery = delivery
        self._encoder_options = dict(encoder_options)
        self._headers = {
            header: str(encoder_options[field])
            for field, header in _HEADER_FIELDS.items()
            if encoder_options.get(field) is not None
        }
        for field, header in _HEADER_FIELDS.items():
            value = self._headers.get(header, "")
            if "\r" in value or "\n" in value:
                raise ValueError("%s=%r: a line break cannot go in the %s header" % (field, value, header))
        # The v1.0 payload fields as v0.4/v0.5 carry them; bad values fail here, naming the option.
        self._default_meta, self._default_metrics = _carried_tags(encoder_options)

        installed = _installed_versions()
        if version == "auto":
            candidates = list(installed)
        elif version in VERSIONS:
            if version not in installed:
                raise ValueError("version %r: the installed encoder does not write it" % version)
            candidates = [v for v in installed if VERSIONS.index(v) >= VERSIONS.index(version)]
        else:
            raise ValueError("version must be 'auto' or one of %s, not %r" % (", ".join(VERSIONS), version))
        for candidate in candidates:  # bad option values fail here, naming the option
            self._new_encoder(candidate)
        self._supported = candidates
        self._negotiated = version != "auto"
        # None until known: the fixed version, or what /info (or an accepted payload) says.
        self._known_version: Optional[str] = None if version == "auto" else version
        # What payloads are encoded in until then: the best we can write.
        self._version = candidates[0]
        self._stopped = False
        self._log_interval = 60.0
        self._init_runtime_state()
        _live_writers.add(self)

    def _encoder_options_for(self, version: str) -> Dict[str, Any]:
        if version == "v1.0":
            return self._encoder_options
        options = {
            name: value
            for name, value in self._encoder_options.items()
            if name not in _HEADER_FIELDS and name not in _V10_ONLY_FIELDS
        }
        if self._default_meta:
            options["default_meta"] = self._default_meta
        if self._default_metrics:
            options["default_metrics"] = self._default_metrics
        return options

    def _new_encoder(self, version: str) -> TraceMsgPackEncoder:
        return TraceMsgPackEncoder(
            version,
            max_size=max(self.max_buffer_size // BUFFER_BYTES_SHARE, 1),
            max_item_size=self.max_payload_size,
            max_payload_size=self.max_payload_size,
            **self._encoder_options_for(version),
        )

    def _init_runtime_state(self) -> None:
        """Everything a forked child must not share with its parent."""
        # Reentrant: span code run by put() may itself write a trace.
        self._lock = threading.RLock()
        self._work_ready = threading.Condition(self._lock)
        self._batch_done = threading.Condition(self._lock)
        self._encoder = self._new_encoder(self._version)
        self._kept: List[Trace] = []  # the encoder's traces, in its order
        # write()'s drops, one C-level increment each (see the module docstring).
        self._write_drops: Dict[str, "itertools.count[int]"] = {reason: itertools.count() for reason in DROP_REASONS}
        self._wake_at = self._wake_threshold()
        self._flush_requested = False
        # The flush thread, and the one of its threads now inside _run.  The
        # writer judges "alive" by these, never by Thread.is_alive() or
        # join(): up to 3.12 a signal handler raising inside either marks a
        # running thread stopped for good (threading's bpo-45274 clean-up
        # releases the thread's own lock), and the main thread, where
        # handlers run, calls write(), flush() and stop().
        self._thread: Optional[threading.Thread] = None
        self._running: Optional[threading.Thread] = None
        self._thread_started_at = 0.0
        self._batch: Optional[_Batch] = None
        self._batches_taken = 0
        self._batches_done = 0
        self._stop_deadline: Optional[float] = None
        self._connection: Optional[AgentConnection] = None
        self._sent = 0
        self._unconfirmed = 0
        self._resent = 0
        self._spans_sent = 0
        self._payloads_sent = 0
        self._bytes_sent = 0
        self._retries = 0
        self._replies_too_large = 0
        self._errors = 0
        self._on_response_errors = 0
        self._thread_starts = 0
        self._dropped: Dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._logged: Dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._last_error: Dict[str, str] = {}
        self._last_log = float("-inf")

    def _wake_threshold(self) -> int:
        return max(min(self.max_payload_size, self._encoder.max_size) // 2, 1)

    def _reset_after_fork(self) -> None:
        # The parent keeps (and sends) what it buffered; the child starts
        # empty, with a new encoder, its own lock (the parent's may have been
        # held by another thread at the fork), thread and connection.
        # Closing the child's copy of the socket leaves the parent's open.
        if self._connection is not None:
            self._connection.close()
        self._init_runtime_state()

    # -- application side -------------------------------------------------

    @_releases_leaked_lock
    def write(self, trace: Trace) -> None:
        """Buffer one trace (a list of spans) for sending; never raises for its content.

        Only a ``BaseException`` raised by span code (counted
        ``interrupted``) or by a signal handler gets out of it (but a
        handler's ``Exception`` that lands while span code runs is taken
        for the span's: the trace is counted ``bad_input``).
        """
        with self._lock:
            if self._stopped:
                next(self._write_drops["stopped"])
            else:
                encoder = self._encoder
                try:
                    encoder.put(trace)
                except BufferFull:
                    next(self._write_drops["buffer_full"])
                except BufferItemTooLarge:
                    next(self._write_drops["trace_too_large"])
                except BaseException as error:
                    # A signal handler may raise once put() has returned: then
                    # the encoder holds one trace more than the kept list, and
                    # the exception is the handler's, not about the trace.
                    if len(encoder) > len(self._kept):
                        self._kept.append(trace)
                        raise
                    if not isinstance(error, Exception):
                        next(self._write_drops["interrupted"])
                        raise
                    next(self._write_drops["bad_input"])
                    self._last_error["bad_input"] = "%s: %s" % (type(error).__name__, error)
                else:
                    self._kept.append(trace)
                    if self._thread is None or self._thread is not self._running:
                        # (none yet, one just started, or one that never got
                        # to run: see _thread_runs)
                        self._ensure_thread()
                    if encoder.size >= self._wake_at:
                        self._wake_at = self.max_buffer_size + 1  # once per batch
                        self._work_ready.notify()
                    return
            message = self._drop_summary(force=False)
        if message:
            log.warning(message)

    @_releases_leaked_lock
    def flush(self, timeout: Optional[float] = None) -> bool:
        """Send what is buffered now; True once all of it is settled (sent or dropped)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if threading.current_thread() is self._thread:
                return False  # called from on_response: it would wait on itself
            if not len(self._encoder) and self._batch is None:
                return True
            if not self._ensure_thread():
                return False
            # A swap takes the whole buffer, so the next batch holds everything
            # buffered now; a batch in flight is finished before it.
            target = self._batches_taken + (1 if len(self._encoder) else 0)
            self._flush_requested = True
            self._work_ready.notify()
            while self._batches_done < target:
                if not self._ensure_thread():  # it ended: a new one settles what it left
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                # (woken at least once a second to see that the thread still runs)
                self._batch_done.wait(_THREAD_CHECK if remaining is None else min(remaining, _THREAD_CHECK))
            return True

    @_releases_leaked_lock
    def stop(self, timeout: Optional[float] = None) -> bool:
        """Send what is buffered and stop the thread; later writes are dropped as ``stopped``.

        Returns within ``timeout`` seconds, or, with ``timeout=None``, within
        ``max_attempts * timeout`` plus the retry backoffs (the time one
        payload's attempts may take).  Returns False if the thread had not
        finished by then; it counts what it had not sent as ``stopped``
        (or ``traces_sent_unconfirmed`` for a payload sent whole) when it
        gets to it.  Safe to call more than once.
        """
        bound = self._stop_bound() if timeout is None else max(0.0, float(timeout))
        deadline = time.monotonic() + bound
        with self._lock:
            if not self._stopped:
                self._stopped = True
                self._stop_deadline = deadline
            else:
                deadline = min(deadline, self._stop_deadline or deadline)
            thread = self._thread
            live = self._thread_runs()
            self._work_ready.notify_all()
        finished = True
        if not live:
            self._send_inline(deadline)
        elif thread is not threading.current_thread():
            with self._lock:  # _run's end clears self._thread and notifies
                while self._thread is thread and self._thread_runs():
                    remaining = deadline + 0.05 - time.monotonic()
                    if remaining <= 0:
                        break
                    self._batch_done.wait(min(remaining, _THREAD_CHECK))
                finished = self._thread is not thread
        with self._lock:
            message = self._drop_summary(force=True)
        if message:
            log.warning(message)
        return finished

    def _stop_bound(self) -> float:
        backoffs = sum(self.retry_backoff * (2 ** (attempt - 1)) for attempt in range(1, self.max_attempts))
        return self.max_attempts * self.timeout + backoffs

    def _send_inline(self, deadline: float) -> None:
        """stop() without a live flush thread: send the buffer on the caller's thread."""
        for _ in range(1000):  # each round takes the whole buffer; bounded regardless
            with self._lock:
                if self._thread_runs():
                    return
                self._recover_batch()
                if not len(self._encoder):
                    return
                batch, groups = self._take_batch()
            try:
                self._process_batch(batch, groups)
            except Exception as error:
                with self._lock:
                    self._errors += 1
                    self._recover_batch()
                log.error("spanpack.AgentWriter: unexpected error while sending", exc_info=error)
            if time.monotonic() >= deadline:
                with self._lock:
                    if len(self._encoder):
                        batch, groups = self._take_batch()
                        self._settle_rest(batch, groups, "stopped")
                return

    @property
    @_releases_leaked_lock
    def stats(self) -> WriterStats:
        """A snapshot of the counters (a new dict on every read; see ``WriterStats``)."""
        with self._lock:
            dropped = self._drop_totals()
            batch = self._batch
            buffered = len(self._encoder) + (batch.unsettled if batch is not None else 0)
            total_dropped = sum(dropped.values())
            return {
                "traces_written": self._sent + total_dropped + buffered,
                "traces_sent": self._sent,
                "traces_sent_unconfirmed": self._unconfirmed,
                "traces_resent": self._resent,
                "traces_dropped": total_dropped,
                "traces_buffered": buffered,
                "dropped_by_reason": dropped,
                "spans_sent": self._spans_sent,
                "payloads_sent": self._payloads_sent,
                "bytes_sent": self._bytes_sent,
                "retries": self._retries,
                "replies_too_large": self._replies_too_large,
                "writer_errors": self._errors,
                "on_response_errors": self._on_response_errors,
                "thread_starts": self._thread_starts,
                "version": self._known_version,
            }

    @property
    def version(self) -> Optional[str]:
        """The trace API version in use: None until known (``version="auto"`` before ``/info`` answers)."""
        return self._known_version

    # -- accounting (callers hold the lock) --------------------------------

    def _drop_totals(self) -> Dict[str, int]:
        # repr(itertools.count()) is "count(N)": N is the next value, the number of next() calls.
        return {reason: n + int(repr(self._write_drops[reason])[6:-1]) for reason, n in self._dropped.items()}

    def _count_dropped(self, count: int, reason: str, error: Optional[BaseException]) -> None:
        self._dropped[reason] += count
        if error is not None:
            self._last_error[reason] = "%s: %s" % (type(error).__name__, error)

    def _drop_summary(self, force: bool) -> Optional[str]:
        # One line per interval at most, however many traces are dropped.
        now = time.monotonic()
        if not force and now - self._last_log < self._log_interval:
            return None
        totals = self._drop_totals()
        unlogged = {reason: totals[reason] - self._logged[reason] for reason in DROP_REASONS}
        unlogged = {reason: n for reason, n in unlogged.items() if n > 0}
        if not unlogged:
            return None
        self._logged = totals
        self._last_log = now
        total = sum(unlogged.values())
        reasons = ", ".join(
            "%d %s%s" % (n, reason, " (%s)" % self._last_error[reason] if reason in self._last_error else "")
            for reason, n in sorted(unlogged.items())
        )
        self._last_error = {}
        return "spanpack.AgentWriter to %s dropped %d trace%s: %s" % (
            self.url,
            total,
            "" if total == 1 else "s",
            reasons,
        )

    def _settle(self, batch: _Batch, group: _Group, outcome: str, error: Optional[BaseException] = None) -> None:
        """Count ``group`` sent, unconfirmed (sent) or dropped for ``outcome``; takes the lock."""
        message = None
        if group.at_agent and outcome != _SENT:
            outcome = _UNCONFIRMED  # an earlier attempt may have reached the agent: never counted dropped
        with self._lock:
            batch.unsettled -= group.count
            batch.sending = 0
            if group.at_agent:
                batch.at_agent -= group.count
            if outcome == _SENT or outcome == _UNCONFIRMED:
                self._sent += group.count
                if outcome == _UNCONFIRMED:
                    self._unconfirmed += group.count
                if group.traces is not None:
                    self._spans_sent += sum(map(len, group.traces))
            else:
                self._count_dropped(group.count, outcome, error)
                message = self._drop_summary(force=False)
        if message:
            log.warning(message)

    def _settle_rest(self, batch: _Batch, groups: Sequence[_Group], reason: str) -> None:
        for group in groups:
            self._settle(batch, group, reason)

    # -- the flush thread -------------------------------------------------

    def _thread_runs(self) -> bool:
        """The flush thread is in _run, or was started too recently to be
        there yet (callers hold the lock)."""
        thread = self._thread
        return thread is not None and (
            self._running is thread or time.monotonic() - self._thread_started_at < _THREAD_CHECK
        )

    def _ensure_thread(self) -> bool:
        """Start a flush thread unless one runs (callers hold the lock); False
        if none could be started."""
        if not self._thread_runs():
            self._thread = None
            self._start_thread()
        return self._thread is not None

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._run, name="spanpack.AgentWriter", daemon=True)
        self._thread = thread
        self._thread_started_at = time.monotonic()
        try:
            thread.start()
        except RuntimeError:
            # Interpreter shutdown forbids new threads (or none can be made
            # now): the buffer waits for the next try, or for stop() (run at
            # exit), which then sends it on its own thread.
            self._thread = None
        # Anything else came from a signal handler, before the thread began
        # or after (threading then raises KeyError, and may kill the new
        # thread before it runs): it stays "the" thread, and one that has
        # not reached _run within _THREAD_CHECK is replaced.

    def _run(self) -> None:
        me = threading.current_thread()
        with self._lock:
            if self._thread is not me:
                return  # replaced before it got here (see _thread_runs)
            self._running = me
            self._thread_starts += 1
        try:
            for _ in range(1 << 62):  # each round one batch, or a wait
                try:
                    if not self._run_once():
                        return
                except BaseException as error:  # the thread must go on
                    self._on_thread_error(error)
        finally:
            self._close_connection()
            with self._lock:
                if self._running is me:
                    self._running = None
                if self._thread is me:
                    self._thread = None
                self._batch_done.notify_all()

    def _on_thread_error(self, error: BaseException) -> None:
        try:
            log.error("spanpack.AgentWriter: unexpected error on the flush thread", exc_info=error)
        except BaseException:
            pass
        with self._lock:
            self._errors += 1
            self._recover_batch()
            if not self._stopped:
                self._work_ready.wait(min(self.flush_interval, 1.0))  # not a busy loop

    def _recover_batch(self) -> None:
        """Settle what a failed round left unsettled (the lock is held)."""
        batch = self._batch
        if batch is None:
            return
        at_agent = batch.sending + batch.at_agent
        if at_agent:
            # A request was under way, or an earlier one went whole unanswered: the agent may have them.
            self._sent += at_agent
            self._unconfirmed += at_agent
            batch.unsettled -= at_agent
            batch.sending = batch.at_agent = 0
        if batch.unsettled:
            self._count_dropped(batch.unsettled, "writer_error", None)
            batch.unsettled = 0
        self._finish_batch(batch)

    def _finish_batch(self, batch: _Batch) -> None:
        if self._batch is batch:
            self._batch = None
            self._batches_done += 1
        self._batch_done.notify_all()

    def _run_once(self) -> bool:
        """Wait for work and send one batch; False when the thread is done."""
        with self._lock:
            self._recover_batch()
            next_flush = time.monotonic() + self.flush_interval
            for _ in range(1 << 62):
                if self._stopped and not len(self._encoder):
                    return False
                if len(self._encoder) and (
                    self._stopped
                    or self._flush_requested
                    or self._wake_at > self.max_buffer_size  # write() found it half a payload
                    or time.monotonic() >= next_flush
                ):
                    break
                wait = next_flush - time.monotonic()
                if wait <= 0:
                    next_flush = time.monotonic() + self.flush_interval
                    wait = self.flush_interval
                self._work_ready.wait(wait)
            batch, groups = self._take_batch()
        self._process_batch(batch, groups)
        return True

    def _take_batch(self) -> Tuple[_Batch, List[_Group]]:
        """Swap the buffer out into payload groups (the lock is held)."""
        encoder = self._encoder
        encoded = encoder.encode()
        kept, self._kept = self._kept, []
        count = sum(n for _, n in encoded)
        objects: Optional[List[Trace]] = kept if len(kept) == count else None
        if objects is None:
            log.warning("spanpack.AgentWriter: %d buffered traces without their objects; they cannot be "
                        "re-encoded", count)
        groups = []
        offset = 0
        for payload, n in encoded:
            traces = None if objects is None else objects[offset : offset + n]
            groups.append(_Group(traces, n, payload, encoder))
            offset += n
        self._wake_at = self._wake_threshold()
        self._flush_requested = False
        batch = self._batch = _Batch(count)
        self._batches_taken += 1
        return batch, groups

    def _take_buffer(self) -> List[_Group]:
        """Take the buffer and count it settled at once (for the write-cost benchmark only)."""
        batch, groups = self._take_batch()
        self._settle_rest(batch, groups, "stopped")
        self._finish_batch(batch)
        return groups

    def _process_batch(self, batch: _Batch, groups: List[_Group]) -> None:
        try:
            self._send_batch(batch, groups)
        finally:
            with self._lock:
                if batch.unsettled == 0:
                    self._finish_batch(batch)
                # else: a failure; _recover_batch settles it

    def _send_batch(self, batch: _Batch, groups: List[_Group]) -> None:
        if not self._negotiated and not self._past_stop_deadline():
            self._negotiate()
        pending = list(reversed(groups))  # a stack: each entry goes as one payload
        for _ in range(1 << 30):  # bounded: every round settles or halves a group
            if not pending:
                return
            group = pending.pop()
            if self._past_stop_deadline():
                self._settle(batch, group, "stopped")
                continue
            encoder = self._encoder
            if group.encoder is not encoder:  # not made yet, or in a version refused since
                if group.traces is None:
                    self._settle(batch, group, "agent_refused", _Note("the traces' objects were not kept"))
                    continue
                try:
                    group.payload, group.encoder = encoder.encode_traces(group.traces), encoder
                except Exception as error:  # a trace mutated after write()
                    if group.count == 1:
                        self._settle(batch, group, "bad_input", error)
                    else:
                        pending.extend(_halves(group))
                    continue
            payload = group.payload
            if payload is None or len(payload) > self.max_payload_size:
                if group.count > 1 and group.traces is not None:
                    pending.extend(_halves(group))
                else:
                    self._settle(batch, group, "trace_too_large")
                continue
            outcome = self._deliver(batch, group, payload)
            if outcome == _SPLIT:
                pending.extend(_halves(group))
            elif outcome == _REENCODE:
                pending.append(group)

    def _past_stop_deadline(self) -> bool:
        return self._stopped and self._stop_deadline is not None and time.monotonic() >= self._stop_deadline

    def _downgrade(self, refused: str) -> bool:
        """Switch below ``refused``; False when there is nothing lower."""
        if self._version != refused:
            return True  # already switched (by /info or an earlier payload)
        lower = [v for v in self._supported if VERSIONS.index(v) > VERSIONS.index(refused)]
        if not lower:
            return False
        log.info("spanpack.AgentWriter: the agent refused %s; sending %s", refused, lower[0])
        self._set_version(lower[0])
        return True

    def _set_version(self, version: str) -> None:
        """Encode in ``version`` from now on, what is buffered included (flush thread)."""
        with self._lock:
            if version == self._version:
                return
            encoder = self._new_encoder(version)
            # The old version's bytes are of no use now; its traces are re-put
            # (they stay counted as buffered throughout: the lock is held).
            old = self._encoder
            count = len(old)
            old.encode()
            kept, self._kept = self._kept, []
            self._encoder, self._version = encoder, version
            self._wake_at = self._wake_threshold()
            lost = count if len(kept) != count else 0
            if lost:
                self._count_dropped(lost, "agent_refused", _Note("the traces' objects were not kept"))
                kept = []
            for trace in kept:
                try:
                    encoder.put(trace)
                except BufferFull:
                    self._count_dropped(1, "buffer_full", None)
                except BufferItemTooLarge:
                    self._count_dropped(1, "trace_too_large", None)
                except Exception as error:
                    self._count_dropped(1, "bad_input", error)
                else:
                    self._kept.append(trace)

    def _negotiate(self) -> None:
        """Ask the agent's /info which trace endpoints it has."""
        try:
            reply = self._request("GET", "/info", None, {})
        except RequestFailed:
            return  # no answer: the payloads go in the current version; ask again next batch
        if reply.status == 200:
            listed = _versions_from_info(reply)
            if listed is None:
                log.warning("spanpack.AgentWriter: the agent's /info reply is unreadable; sending v0.4")
                chosen = "v0.4"
            else:
                chosen = next((v for v in self._supported if v in listed), "v0.4")
        elif reply.status == 404:  # an agent from before /info
            chosen = "v0.4"
        else:
            return
        self._negotiated = True
        self._set_version(chosen)
        self._known_version = chosen

    def _payload_headers(self, count: int) -> Dict[str, str]:
        headers = payload_headers(count)
        headers.update(self._headers)
        # Without it the agent answers 200 even when it drops the payload for load.
        headers["Datadog-Send-Real-Http-Status"] = "true"
        return headers

    def _deliver(self, batch: _Batch, group: _Group, payload: bytes) -> Optional[str]:
        """Send one payload with retries; settle ``group`` unless it is to be split or re-encoded."""
        version = group.encoder.version
        headers = self._payload_headers(group.count)
        path = "/%s/traces" % version
        error: Optional[BaseException] = None
        for attempt in range(self.max_attempts):
            if attempt:
                with self._lock:
                    self._retries += 1
                if not self._sleep_before_retry(attempt):
                    self._settle(batch, group, "stopped", error)
                    return None
            if group.at_agent:
                with self._lock:
                    self._resent += group.count
            else:
                batch.sending = group.count
            try:
                reply = self._request("PUT", path, payload, headers)
            except RequestFailed as failure:
                if failure.body_sent and (failure.timed_out or self.delivery == "at-most-once"):
                    # The agent may have it (a slow agent surely does): not
                    # sent again, not dropped.
                    self._settle(batch, group, _UNCONFIRMED, failure)
                    return None
                if failure.body_sent and not group.at_agent:
                    # Closed, reset or answered with garbage after the whole
                    # body: retried, and never counted dropped from now on.
                    with self._lock:
                        group.at_agent = True
                        batch.at_agent += group.count
                batch.sending = 0
                error = failure
                continue
            batch.sending = 0
            status = reply.status
            if 200 <= status < 300:
                with self._lock:
                    self._payloads_sent += 1
                    self._bytes_sent += len(payload)
                    if self._known_version is None and version == self._version:
                        self._known_version = version
                self._settle(batch, group, _SENT)
                self._report(reply)
                return None
            if status in _DOWNGRADE_STATUSES and version != "v0.4":
                if self._downgrade(version):
                    if self._known_version is not None:
                        self._known_version = self._version
                    return _REENCODE
            if status == 413:
                if group.count > 1 and group.traces is not None:
                    return _SPLIT
                self._settle(batch, group, "trace_too_large", _HTTPStatus(reply))
                return None
            if status >= 500 or status in _RETRY_STATUSES:
                error = _HTTPStatus(reply)
                continue
            self._settle(batch, group, "agent_refused", _HTTPStatus(reply))
            return None
        self._settle(batch, group, "retries_exhausted", error)
        return None

    def _sleep_before_retry(self, attempt: int) -> bool:
        """Back off (doubling, each wait drawn from its upper half); False if stop()'s deadline comes first."""
        delay = self.retry_backoff * (2 ** (attempt - 1))
        end = time.monotonic() + random.uniform(delay / 2, delay)
        with self._lock:
            for _ in range(1 << 30):
                now = time.monotonic()
                deadline = self._stop_deadline if self._stopped else None
                if deadline is not None and end >= deadline:
                    return False
                if now >= end:
                    return True
                # On the condition, so that stop() wakes it to check its deadline.
                self._work_ready.wait(end - now)
        return True

    def _request(self, method: str, path: str, body: Optional[bytes], headers: Mapping[str, str]) -> Any:
        deadline = time.monotonic() + self.timeout
        if self._stopped and self._stop_deadline is not None:
            deadline = min(deadline, self._stop_deadline)
        connection = self._connection
        if connection is None:
            connection = self._connection = AgentConnection(self._address)
        reply = connection.request(method, path, body, headers, deadline)
        if reply.too_large:
            with self._lock:
                self._replies_too_large += 1
        return reply

    def _close_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _report(self, reply: Any) -> None:
        if self.on_response is None or reply.too_large:
            return
        try:
            answer = json.loads(reply.body)
        except Exception:  # not JSON, or nested past the recursion limit
            return
        if not isinstance(answer, dict):
            return
        try:
            self.on_response(answer)
        except BaseException:  # the thread goes on whatever the callback does
            with self._lock:
                self._on_response_errors += 1
            log.exception("spanpack.AgentWriter: on_response raised")


def _written_text(text: str, what: str) -> str:
    """A str option as every version writes it: its text (a subclass's too),
    cut over MAX_TEXT_LEN; a lone surrogate is refused, naming ``what``."""
    text = str.__str__(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("%s: not valid text (a lone surrogate)" % what) from None
    return _truncate(text)


def _carried_tags(options: Mapping[str, Any]) -> Tuple[Dict[str, str], Dict[str, Union[int, float]]]:
    """The default tags (meta, metrics) that carry the v1.0 payload fields in
    ``options`` in v0.4/v0.5 payloads.  Each value is checked here, once,
    and an error names its option: hostname, env, app_version and
    runtime_id are str (empty: left out, as v1.0 leaves it out);
    payload_attributes maps str to str, bool, int (int64) or float."""
    meta: Dict[str, str] = {}
    metrics: Dict[str, Union[int, float]] = {}
    tag_field: Dict[str, str] = {}
    for field, tag in _CARRIED_FIELDS.items():
        value = options.get(field)
        if value is None:
            continue
        if not isinstance(value, str):
            raise TypeError("%s must be str, not %s" % (field, type(value).__name__))
        value = _written_text(value, field)
        if value:
            meta[tag] = value
            tag_field[tag] = field
    attributes = options.get(_ATTRIBUTES)
    if attributes is None:
        return meta, metrics
    if not isinstance(attributes, Mapping):
        raise TypeError("%s must be a mapping, not %s" % (_ATTRIBUTES, type(attributes).__name__))
    for key, value in attributes.items():
        if not isinstance(key, str):
            raise TypeError("%s keys must be str, not %s" % (_ATTRIBUTES, type(key).__name__))
        what = "%s[%r]" % (_ATTRIBUTES, key)
        tag = _written_text(key, what)
        if tag in _ENCODER_META_KEYS:
            raise ValueError("%s: v0.4/v0.5 payloads write the tag %r themselves" % (what, tag))
        if tag in tag_field:
            raise ValueError(
                "%s: v0.4/v0.5 payloads carry %s= as the tag %r, which this attribute would be too"
                % (what, tag_field[tag], tag)
            )
        if tag in meta or tag in metrics:
            raise ValueError("%s: another key is written as the same text (keys over %d characters are cut)"
                             % (what, MAX_TEXT_LEN))
        if isinstance(value, str):
            meta[tag] = _written_text(value, what)
        elif isinstance(value, bool):
            metrics[tag] = int(value)
        elif isinstance(value, int):
            if not _I64_MIN <= value <= _I64_MAX:
                raise ValueError("%s does not fit in int64" % what)
            metrics[tag] = int(value)
        elif isinstance(value, float):
            metrics[tag] = float(value)
        else:
            raise TypeError("%s must be str, bool, int or float, not %s" % (what, type(value).__name__))
    return meta, metrics


def _versions_from_info(reply: Any) -> Optional[List[str]]:
    """The versions an /info reply lists; None when it cannot be read."""
    if reply.too_large or len(reply.body) > MAX_REPLY_SIZE:
        return None
    try:
        info = json.loads(reply.body)
        if not isinstance(info, dict):
            return None
        return agent_versions(info)
    except Exception:  # bad JSON, too deep, odd shapes
        return None


def _halves(group: _Group) -> Tuple[_Group, _Group]:
    """Two groups, the second half first: they are pushed on a stack."""
    traces = group.traces or []
    half = len(traces) // 2
    flag = group.at_agent
    return _Group(traces[half:], len(traces) - half, at_agent=flag), _Group(traces[:half], half, at_agent=flag)


class _Note(Exception):
    """A reason for the drop log."""


class _HTTPStatus(Exception):
    """An agent reply that failed a payload, for the drop log."""

    def __init__(self, reply: Any) -> None:
        body = b"(a reply over 1 MiB)" if reply.too_large else reply.body[:200]
        super().__init__("HTTP %d %s" % (reply.status, body.decode("utf-8", "replace").strip()))
