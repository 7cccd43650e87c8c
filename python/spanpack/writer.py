"""AgentWriter: buffer finished traces and send them to a Datadog trace agent.

The application thread encodes each trace into an intake encoder's buffer
(``_put_counted``: exact bytes, all-or-nothing, the trace object kept beside
them); a background thread takes the buffer as payloads (``encode``) and owns
the network: the kept-alive connection, version negotiation, retries,
splitting and downgrades.

No lock on the application side.  ``write()``, ``flush()``, ``stop()`` and
``stats`` take no Python lock, so an exception a signal handler raises
anywhere in them (handlers run on the main thread, between two bytecodes)
leaves nothing held and nothing half-done:

- ``write()`` is one C call, ``_put_counted`` (ext/trace_encoder.c,
  ``WriterIntake``): it encodes the trace, then in one step that runs no
  Python code appends the bytes and the trace object and counts the trace
  buffered, or counts it refused (bad input, a limit, stopped).  A handler's
  exception before that call leaves the trace untaken and uncounted; after
  it, the trace is counted already.  The flush thread is woken through a
  ``queue.SimpleQueue`` (its ``put`` is one C call too), and started with
  ``_thread.start_new_thread`` (no Event to wait on, as ``Thread.start``
  has).
- ``flush()`` and ``stop()`` post a request on that queue and wait for the
  answer on a queue of their own; ``stop()`` closes the intakes first (C),
  after which every ``write()`` is refused and counted ``stopped``.
- ``stats`` reads the counts under a sequence count (``_Ledger``, a
  seqlock): the flush thread, the only one that moves traces between
  counts, makes the count odd while it does; a reader retries until it
  sees the same even count before and after.

The flush thread holds the only Python lock (``_flush_lock``, so that two
flush threads never run at once: one that a replacement overtook leaves),
and signal handlers never run there.

The ledger.  At every moment ``traces_written == traces_sent +
traces_dropped + traces_buffered``, each trace in exactly one count:
buffered is what the intakes hold (counted by C in the call that took the
trace) plus the unsettled traces of the batch being sent; dropped is the
intakes' refusals (C) plus what the flush thread settled as dropped; sent
is the flush thread's.  ``traces_written`` is the sum, not a counter of its
own.

Delivery.  A payload whose request went out whole with no reply is resent
when the connection was closed, reset or answered with garbage
(``delivery="at-least-once"``, the default; counted ``traces_resent``) and
never when the request ran into its deadline (a slow agent would get a copy
per attempt) or with ``delivery="at-most-once"``.  Traces an attempt may
have delivered are never counted dropped: they end sent, confirmed by a
later 2xx or else unconfirmed.

What a buffered trace is kept as: its bytes in the intake's buffer, and the
trace object itself until its payload is settled, for re-encoding after a
413 (split) or a version downgrade.  The objects count against
``max_buffer_size``: the encoder may hold ``max_buffer_size // 8`` bytes,
the rest is left for the objects (a trace's objects take 2-7x its encoded
size in measurements).  A version change makes a new intake the current
one; what the old one holds (and what a write() that had already looked it
up puts there) goes with the next batch, re-encoded.
"""

from __future__ import annotations

import _thread
import atexit
import inspect
import json
import logging
import os
import queue
import random
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypedDict, Union

from ._extras import _I64_MAX, _I64_MIN, _truncate
from ._spanpack import (
    MAX_TEXT_LEN,
    ORIGIN_KEY,
    SPAN_EVENTS_KEY,
    SPAN_LINKS_KEY,
    TRACE_ID_HIGH_KEY,
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

    def __init__(self, traces: List[Trace], count: int, payload: Optional[bytes] = None, encoder: Any = None,
                 at_agent: bool = False):
        self.traces = traces  # the trace objects, for re-encoding
        self.count = count
        self.payload = payload
        self.encoder = encoder  # the encoder that made ``payload``
        # An attempt went out whole and got no reply: the agent may hold
        # these traces, so they are never counted dropped, and each later
        # attempt is a resend.
        self.at_agent = at_agent


class _Batch:
    """What the flush thread took in one swap of the buffer."""

    __slots__ = ("unsettled", "sending", "at_agent", "answer")

    def __init__(self, count: int) -> None:
        self.answer: List[Any] = []  # flush()/stop() replies to answer once this batch is settled
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


# How long a flush thread may take to begin running before it is taken for
# dead and replaced; also how often flush() and stop() look again while
# they wait.
_THREAD_CHECK = 1.0
# How often ``stats`` reads again while the flush thread is moving traces
# between counts (see _Ledger).
_STATS_TRIES = 1000

# What the intake's _put_counted answers (ext/trace_encoder.c): taken; taken,
# and half a payload is buffered; refused, 2 + the index in _INTAKE_REASONS.
_PUT_TAKEN, _PUT_TAKEN_WAKE = 0, 1
_INTAKE_REASONS = ("buffer_full", "trace_too_large", "bad_input", "interrupted", "stopped")
_PUT_CLOSED = 2 + _INTAKE_REASONS.index("stopped")


class _FlushThread:
    """Stands for one flush thread started (see AgentWriter._thread)."""

    __slots__ = ()


class _Ledger:
    """A sequence count around the flush thread's updates that move traces
    between counts (a seqlock): odd while one is under way.  Only the flush
    thread writes; ``stats`` reads until it sees the same even count before
    and after, so it takes no lock and never sees a trace in two counts or
    in none.  (Nested sections count once.)"""

    __slots__ = ("seq", "depth")

    def __init__(self) -> None:
        self.seq = 0
        self.depth = 0

    def __enter__(self) -> None:
        self.depth += 1
        if self.depth == 1:
            self.seq += 1

    def __exit__(self, *exc_info: Any) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.seq += 1


class AgentWriter:
    """Send traces to a Datadog trace agent from a background thread.

    ::

        writer = spanpack.AgentWriter()      # the agent from DD_* variables
        writer.write(trace)                  # any thread; never waits on the network
        writer.stop()                        # also run at interpreter exit

    Traces must not be mutated after ``write()``: a split or a downgrade
    re-encodes them from the objects.  See docs/agent-writer.md for the bounds and
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
        # The intakes: one encoder per version used, each counting in C what
        # it takes and refuses and keeping the trace objects (WriterIntake in
        # ext/trace_encoder.c).  write() puts into the current one; a version
        # change leaves the old one as it is, and what is in it goes with the
        # next batch, re-encoded.
        self._intakes: Dict[str, TraceMsgPackEncoder] = {}
        self._ledger = _Ledger()
        self._encoder = self._intake(self._version)
        # Requests to the flush thread, each put() one C call: None wakes it
        # (half a payload is buffered, or stop()); a SimpleQueue asks for an
        # answer once everything buffered now is settled (flush(), stop()).
        self._requests: "queue.SimpleQueue[Optional[queue.SimpleQueue[bool]]]" = queue.SimpleQueue()
        self._waiting: List["queue.SimpleQueue[bool]"] = []  # (flush thread) answered after the next batch
        self._woken = False  # (flush thread) a wake-up came: send now
        # The only Python lock: held by a flush thread for as long as it runs,
        # so that two never run at once; no application thread takes it.
        self._flush_lock = threading.Lock()
        # The flush thread (a token per thread started), the one now running
        # _run (and its thread ident), and the last to leave it.  Started with
        # _thread.start_new_thread, one C call, rather than Thread.start(),
        # which waits on an Event (a lock) on the caller's thread; and judged
        # alive by these, never by Thread.is_alive() or join() (up to 3.12 a
        # signal handler raising inside either marks a running thread
        # stopped for good).
        self._thread: Optional[_FlushThread] = None
        self._running: Optional[_FlushThread] = None
        self._running_ident = 0
        self._ended: Optional[_FlushThread] = None
        self._thread_started_at = 0.0
        self._batch: Optional[_Batch] = None
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
        self._dropped: Dict[str, int] = dict.fromkeys(DROP_REASONS, 0)  # after write(): the flush thread's
        self._logged: Dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._last_error: Dict[str, str] = {}  # (flush thread) the last error per reason, for the log
        self._last_log = float("-inf")

    def _intake(self, version: str) -> TraceMsgPackEncoder:
        """The intake encoder for ``version``, made on first use."""
        intake = self._intakes.get(version)
        if intake is None:
            intake = self._new_encoder(version)
            intake._start_intake(max(min(self.max_payload_size, intake.max_size) // 2, 1))
            with self._ledger:
                self._intakes[version] = intake
            if self._stopped:  # (stop() sets _stopped, then closes the intakes it finds)
                intake._close_intake()
        return intake

    def _buffered(self) -> int:
        return sum(len(intake) for intake in list(self._intakes.values()))

    def _reset_after_fork(self) -> None:
        # The parent keeps (and sends) what it buffered; the child starts
        # empty, with new intakes, its own thread and connection.  Closing
        # the child's copy of the socket leaves the parent's open.
        if self._connection is not None:
            self._connection.close()
        self._init_runtime_state()

    # -- application side: no lock taken ------------------------------------

    def write(self, trace: Trace) -> None:
        """Buffer one trace (a list of spans) for sending; never raises for its content.

        Only a ``BaseException`` raised by span code (counted
        ``interrupted``) or by a signal handler gets out of it (but a
        handler's ``Exception`` that lands while span code runs is taken
        for the span's: the trace is counted ``bad_input``).
        """
        # One C call takes the trace with its object, or refuses it (bad
        # input, a limit, stopped), and counts which, running no Python code
        # once the trace is encoded: there is no second step to miss.
        answer = self._encoder._put_counted(trace)
        if answer == _PUT_TAKEN_WAKE:
            self._requests.put(None)
        if self._running is None and answer != _PUT_CLOSED:
            # (none yet, one just started, or one that ended: see _ensure_thread)
            self._ensure_thread()

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Send what is buffered now; True once all of it is settled (sent or dropped)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._on_flush_thread():
            return False  # called from on_response: it would wait on itself
        reply: "queue.SimpleQueue[bool]" = queue.SimpleQueue()
        for _ in range(1 << 62):
            if not self._buffered() and self._batch is None:
                return True
            self._requests.put(reply)
            if not self._ensure_thread():
                return False
            # Answered True once everything buffered when the request was
            # taken is settled, False by a thread that ended (then ask again).
            for _ in range(1 << 62):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                try:
                    if reply.get(timeout=_THREAD_CHECK if remaining is None else min(remaining, _THREAD_CHECK)):
                        return True
                    break
                except queue.Empty:  # (looked at once a second: the thread may have ended)
                    if not self._thread_runs():
                        break
        return False

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
        if self._stop_deadline is None:
            self._stop_deadline = deadline
        else:
            deadline = min(deadline, self._stop_deadline)
        self._stopped = True
        for intake in list(self._intakes.values()):
            intake._close_intake()  # from now on each write() is refused, counted "stopped"
        if self._on_flush_thread():
            return True  # called from on_response: the thread ends after this batch
        reply: "queue.SimpleQueue[bool]" = queue.SimpleQueue()
        self._requests.put(None)
        for _ in range(1 << 62):
            if not self._thread_runs():
                if not self._buffered() and self._batch is None:
                    return True
                if not self._ensure_thread():  # no thread can start (interpreter shutdown)
                    return self._send_inline(deadline)
            remaining = deadline + 0.05 - time.monotonic()
            if remaining <= 0:
                return False
            self._requests.put(reply)
            try:
                reply.get(timeout=min(remaining, _THREAD_CHECK))
            except queue.Empty:
                pass
        return False

    def _stop_bound(self) -> float:
        backoffs = sum(self.retry_backoff * (2 ** (attempt - 1)) for attempt in range(1, self.max_attempts))
        return self.max_attempts * self.timeout + backoffs

    def _send_inline(self, deadline: float) -> bool:
        """stop() when no flush thread can be started (interpreter shutdown):
        the caller does the flush thread's work, taking its lock without
        waiting, as the flush thread would (no other thread can need it then)."""
        if not self._flush_lock.acquire(blocking=False):
            return False  # a flush thread still holds it
        try:
            for _ in range(1000):  # each round takes the whole buffer; bounded regardless
                self._recover_batch()
                if not self._buffered():
                    break
                batch, groups = self._take_batch()
                try:
                    self._process_batch(batch, groups)
                except Exception as error:
                    self._errors += 1
                    self._recover_batch()
                    log.error("spanpack.AgentWriter: unexpected error while sending", exc_info=error)
            self._log_drops(force=True)
        finally:
            self._flush_lock.release()
        return True

    @property
    def stats(self) -> WriterStats:
        """A snapshot of the counters (a new dict on every read; see ``WriterStats``)."""
        ledger = self._ledger
        for attempt in range(_STATS_TRIES):
            seq = ledger.seq
            if not seq & 1:
                snapshot = self._read_stats()
                if ledger.seq == seq:
                    return snapshot
            # The flush thread is half-way through moving traces between
            # counts (a few bytecodes): let it finish.
            time.sleep(0 if attempt < 8 else 0.001)
        return self._read_stats()  # (not reached in practice)

    def _read_stats(self) -> WriterStats:
        dropped = self._drop_totals()
        batch = self._batch
        buffered = self._intake_totals()[0] + (batch.unsettled if batch is not None else 0)
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

    # -- accounting -----------------------------------------------------------

    def _intake_totals(self) -> List[int]:
        """[buffered, then refused by each of _INTAKE_REASONS], over every intake."""
        totals = [0] * (1 + len(_INTAKE_REASONS))
        for intake in list(self._intakes.values()):
            for i, n in enumerate(intake._intake_counts()):
                totals[i] += n
        return totals

    def _drop_totals(self) -> Dict[str, int]:
        totals = dict(self._dropped)
        for reason, n in zip(_INTAKE_REASONS, self._intake_totals()[1:]):
            totals[reason] += n
        return totals

    def _count_dropped(self, count: int, reason: str, error: Optional[BaseException]) -> None:
        self._dropped[reason] += count
        if error is not None:
            self._last_error[reason] = "%s: %s" % (type(error).__name__, error)

    def _log_drops(self, force: bool) -> None:
        """(flush thread) One log line per interval at most, however many traces are dropped."""
        now = time.monotonic()
        if not force and now - self._last_log < self._log_interval:
            return
        totals = self._drop_totals()
        unlogged = {reason: totals[reason] - self._logged[reason] for reason in DROP_REASONS}
        unlogged = {reason: n for reason, n in unlogged.items() if n > 0}
        if not unlogged:
            return
        self._logged = totals
        self._last_log = now
        total = sum(unlogged.values())
        errors, self._last_error = self._last_error, {}
        for intake in list(self._intakes.values()):
            text = intake._take_last_error()
            if text is not None:
                errors["bad_input"] = text
        reasons = ", ".join(
            "%d %s%s" % (n, reason, " (%s)" % errors[reason] if reason in errors else "")
            for reason, n in sorted(unlogged.items())
        )
        log.warning(
            "spanpack.AgentWriter to %s dropped %d trace%s: %s", self.url, total, "" if total == 1 else "s", reasons
        )

    def _settle(self, batch: _Batch, group: _Group, outcome: str, error: Optional[BaseException] = None) -> None:
        """Count ``group`` sent, unconfirmed (sent) or dropped for ``outcome``."""
        if group.at_agent and outcome != _SENT:
            outcome = _UNCONFIRMED  # an earlier attempt may have reached the agent: never counted dropped
        with self._ledger:
            batch.unsettled -= group.count
            batch.sending = 0
            if group.at_agent:
                batch.at_agent -= group.count
            if outcome == _SENT or outcome == _UNCONFIRMED:
                self._sent += group.count
                if outcome == _UNCONFIRMED:
                    self._unconfirmed += group.count
                self._spans_sent += sum(map(len, group.traces))
            else:
                self._count_dropped(group.count, outcome, error)
        if outcome not in (_SENT, _UNCONFIRMED):
            self._log_drops(force=False)

    def _settle_rest(self, batch: _Batch, groups: Sequence[_Group], reason: str) -> None:
        for group in groups:
            self._settle(batch, group, reason)

    # -- the flush thread -------------------------------------------------

    def _thread_runs(self) -> bool:
        """The flush thread is in _run, or was started too recently to be there yet."""
        thread = self._thread
        return (
            thread is not None
            and self._ended is not thread
            and (self._running is thread or time.monotonic() - self._thread_started_at < _THREAD_CHECK)
        )

    def _on_flush_thread(self) -> bool:
        return self._running is not None and _thread.get_ident() == self._running_ident

    def _ensure_thread(self) -> bool:
        """Start a flush thread unless one runs; False if none could be started.

        No lock: two callers may both start one; the one that is not
        ``_thread`` when it gets to _run leaves at once."""
        if self._thread_runs():
            return True
        token = _FlushThread()
        self._thread_started_at = time.monotonic()
        self._thread = token
        try:
            _thread.start_new_thread(self._run, (token,))
        except RuntimeError:
            # Interpreter shutdown forbids new threads (or none can be made
            # now): the buffer waits for the next try, or for stop() (run at
            # exit), which then sends it on its own thread.
            self._ended = token
            return False
        # (A signal handler's exception that lands here, after the one C
        # call, leaves a thread that runs; one that lands before it leaves
        # a token with no thread, replaced after _THREAD_CHECK.)
        return True

    def _run(self, me: "_FlushThread") -> None:
        for _ in range(1 << 62):  # a thread replaced meanwhile leaves; otherwise waits its turn
            if self._thread is not me:
                return
            if self._flush_lock.acquire(timeout=_THREAD_CHECK):
                break
        try:
            if self._thread is not me:
                return
            self._running_ident = _thread.get_ident()
            self._running = me
            self._thread_starts += 1
            for _ in range(1 << 62):  # each round one batch, or a wait
                try:
                    if not self._run_once():
                        return
                except BaseException as error:  # the thread must go on
                    self._on_thread_error(error)
        finally:
            try:
                self._close_connection()
                if self._stopped:
                    self._log_drops(force=True)
            except BaseException:
                pass
            finally:
                if self._running is me:
                    self._running = None
                self._ended = me
                self._flush_lock.release()
                self._answer_all(False)  # whoever waits asks again (and starts a thread if need be)

    def _answer_all(self, settled: bool) -> None:
        waiting, self._waiting = self._waiting, []
        batch = self._batch
        if batch is not None:
            waiting += batch.answer
        for _ in range(1 << 20):
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                break
            if request is not None:
                waiting.append(request)
        for reply in waiting:
            reply.put(settled)

    def _on_thread_error(self, error: BaseException) -> None:
        try:
            log.error("spanpack.AgentWriter: unexpected error on the flush thread", exc_info=error)
        except BaseException:
            pass
        self._errors += 1
        self._recover_batch()
        if not self._stopped:
            self._wait_for_requests(min(self.flush_interval, 1.0))  # not a busy loop

    def _recover_batch(self) -> None:
        """Settle what a failed round left unsettled."""
        batch = self._batch
        if batch is None:
            return
        with self._ledger:
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
        with self._ledger:
            if self._batch is batch:
                self._batch = None
        for reply in batch.answer:
            reply.put(True)
        batch.answer = []

    def _wait_for_requests(self, timeout: float) -> None:
        """Wait up to ``timeout`` for a request; take every one queued."""
        try:
            request = self._requests.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return
        for _ in range(1 << 20):
            if request is None:
                self._woken = True
            else:
                self._waiting.append(request)
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                return

    def _run_once(self) -> bool:
        """Wait for work and send one batch; False when the thread is done."""
        self._recover_batch()
        next_flush = time.monotonic() + self.flush_interval
        for _ in range(1 << 62):
            self._log_drops(force=False)
            if self._stopped:
                for intake in list(self._intakes.values()):
                    intake._close_intake()  # (a stop() interrupted half-way left some open)
            buffered = self._buffered()
            if self._stopped and not buffered:
                return False
            if buffered and (self._stopped or self._waiting or self._woken or time.monotonic() >= next_flush):
                break
            if self._waiting:  # a flush() with nothing left to send
                self._answer_waiting_now()
            wait = next_flush - time.monotonic()
            if wait <= 0:
                next_flush = time.monotonic() + self.flush_interval
                wait = self.flush_interval
            self._wait_for_requests(wait)
        batch, groups = self._take_batch()
        self._process_batch(batch, groups)
        return True

    def _answer_waiting_now(self) -> None:
        waiting, self._waiting = self._waiting, []
        for reply in waiting:
            reply.put(True)

    def _take_batch(self) -> Tuple[_Batch, List[_Group]]:
        """Take every intake's buffer as payload groups."""
        with self._ledger:
            groups = []
            for intake in list(self._intakes.values()):
                if len(intake):
                    entries: List[Any] = intake.encode()  # an intake's: (payload, count, traces)
                    groups += [_Group(traces, n, payload, intake) for payload, n, traces in entries]
            batch = self._batch = _Batch(sum(group.count for group in groups))
            batch.answer, self._waiting = self._waiting, []
            self._woken = False
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
                if group.count > 1:
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
        """Encode in ``version`` from now on (flush thread).  What the old
        intake holds stays there and goes with the next batch, re-encoded."""
        if version != self._version:
            self._encoder = self._intake(version)
            self._version = version

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
                self._retries += 1
                if not self._sleep_before_retry(attempt):
                    self._settle(batch, group, "stopped", error)
                    return None
            if group.at_agent:
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
                    with self._ledger:
                        group.at_agent = True
                        batch.at_agent += group.count
                batch.sending = 0
                error = failure
                continue
            batch.sending = 0
            status = reply.status
            if 200 <= status < 300:
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
                if group.count > 1:
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
        for _ in range(1 << 30):
            now = time.monotonic()
            deadline = self._stop_deadline if self._stopped else None
            if deadline is not None and end >= deadline:
                return False
            if now >= end:
                return True
            # On the request queue, so that stop() wakes it to check its deadline.
            self._wait_for_requests(end - now)
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
    traces = group.traces
    half = len(traces) // 2
    flag = group.at_agent
    return _Group(traces[half:], len(traces) - half, at_agent=flag), _Group(traces[:half], half, at_agent=flag)


class _HTTPStatus(Exception):
    """An agent reply that failed a payload, for the drop log."""

    def __init__(self, reply: Any) -> None:
        body = b"(a reply over 1 MiB)" if reply.too_large else reply.body[:200]
        super().__init__("HTTP %d %s" % (reply.status, body.decode("utf-8", "replace").strip()))
