"""AgentWriter: buffer finished traces and send them to a Datadog trace agent.

The application thread encodes each trace into the encoder's own buffer
(``put``: exact bytes, all-or-nothing) and keeps a reference to the trace; a
background thread takes the buffer as payloads (``encode``) and owns the
network: the kept-alive HTTP connection, version negotiation, retries,
splitting and downgrades.

Every trace passed to ``write()`` ends in exactly one of two counts:
delivered (``traces_sent``) or dropped (``traces_dropped``, with its reason in
``dropped_by_reason``).  Traces are settled through ``_settle`` only, under
the lock, once.

What a buffered trace is kept as: its bytes in the encoder's buffer, and the
trace object itself until its payload is delivered or dropped.  A 413 split
and a version downgrade both re-encode from the objects (CPU, on the writer's
thread, only when they happen).  Keeping per-trace parts (``encode_trace``)
instead would make a split a join without re-encoding, but each part holds a
buffer of at least 4 KiB (10x a small trace's bytes), and keeping thousands of
them alive cost write() 15-30 us a trace in measurements, against ~1 us for
``put``; parts also cannot be turned into another version, so the traces would
be kept anyway.  The objects cost memory: the spans of a trace stay alive
until its payload is settled (one flush interval, plus the send).
"""

from __future__ import annotations

import atexit
import http.client
import json
import logging
import os
import random
import socket
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ._spanpack import BufferFull, BufferItemTooLarge
from .encoder import TraceMsgPackEncoder
from .transport import agent_connection, agent_url_from_env

log = logging.getLogger("spanpack.writer")

#: Trace API versions, best first; "auto" picks the best the agent and the
#: installed encoder both support.
VERSIONS = ("v1.0", "v0.5", "v0.4")

#: Why a trace was dropped (the keys of ``stats["dropped_by_reason"]``).
DROP_REASONS = (
    "buffer_full",  # write() found the buffer at max_buffer_size
    "trace_too_large",  # larger than max_payload_size, or refused with 413 on its own
    "bad_input",  # the encoder raised for this trace
    "agent_refused",  # a 4xx other than 404/413/415/408/429, or a downgrade it could not follow
    "retries_exhausted",  # connection errors, timeouts, 5xx or 429 on every attempt
    "stopped",  # written after stop(), or still unsent when stop()'s timeout ran out
)

DEFAULT_FLUSH_INTERVAL = 1.0
DEFAULT_MAX_BUFFER_SIZE = 20 << 20
DEFAULT_MAX_PAYLOAD_SIZE = 5 << 20
DEFAULT_TIMEOUT = 2.0
DEFAULT_MAX_ATTEMPTS = 4
DEFAULT_RETRY_BACKOFF = 0.1

# Statuses that say "try again later"; 408 is the server giving up on a slow request.
_RETRY_STATUSES = frozenset((408, 429))
# Statuses an agent that does not know this version's endpoint answers.
_DOWNGRADE_STATUSES = frozenset((404, 415))

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
    endpoints = set(advertised_endpoints)
    for version in supported:
        if "/%s/traces" % version in endpoints:
            return version
    return "v0.4"


class _Batch:
    """The traces the flush thread took in one swap of the buffer."""

    __slots__ = ("unsettled", "abandoned")

    def __init__(self, count: int) -> None:
        self.unsettled = count
        self.abandoned = False


class _Group:
    """Traces to go as one payload, and that payload once encoded."""

    __slots__ = ("traces", "payload", "encoder")

    def __init__(self, traces: List[Trace], payload: Optional[bytes] = None, encoder: Any = None) -> None:
        self.traces = traces
        self.payload = payload
        self.encoder = encoder  # the encoder that made ``payload``


_SPLIT = "split"
_REENCODE = "reencode"

_WRITER_SIZES = ("max_size", "max_item_size", "max_payload_size")


class AgentWriter:
    """Send traces to a Datadog trace agent from a background thread.

    ::

        writer = spanpack.AgentWriter()      # the agent from DD_* variables
        writer.write(trace)                  # any thread; never waits on the network
        writer.stop()                        # also run at interpreter exit

    Traces must not be mutated after ``write()``: a split or a downgrade
    re-encodes them from the objects.
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
        **encoder_options: Any,
    ) -> None:
        if flush_interval <= 0 or timeout <= 0:
            raise ValueError("flush_interval and timeout must be positive")
        if max_payload_size <= 0 or max_buffer_size < max_payload_size:
            raise ValueError("need 0 < max_payload_size <= max_buffer_size")
        if max_attempts < 1 or retry_backoff < 0:
            raise ValueError("need max_attempts >= 1 and retry_backoff >= 0")
        clash = [name for name in _WRITER_SIZES if name in encoder_options]
        if clash:
            raise TypeError("AgentWriter sets %s itself (use max_buffer_size / max_payload_size)" % ", ".join(clash))
        self.url = url or agent_url_from_env()
        agent_connection(self.url, timeout)  # reject a bad URL here, not on the thread
        self.flush_interval = float(flush_interval)
        self.max_buffer_size = int(max_buffer_size)
        self.max_payload_size = int(max_payload_size)
        self.timeout = float(timeout)
        self.on_response = on_response
        self.max_attempts = int(max_attempts)
        self.retry_backoff = float(retry_backoff)
        self._encoder_options = encoder_options

        if version == "auto":
            self._supported = supported_versions(**encoder_options)
            if not self._supported:  # only bad options make every version fail
                TraceMsgPackEncoder("v0.4", **encoder_options)
            self._negotiated = False
        elif version in VERSIONS:
            TraceMsgPackEncoder(version, **encoder_options)  # raises if not installed
            self._supported = list(VERSIONS[VERSIONS.index(version) :])
            self._negotiated = True
        else:
            raise ValueError("version must be 'auto' or one of %s, not %r" % (", ".join(VERSIONS), version))
        # Optimistic until /info answers: the best version we can write.
        self._version = self._supported[0]
        self._stopped = False
        self._log_interval = 60.0
        self._init_runtime_state()
        _live_writers.add(self)

    def _new_encoder(self, version: str) -> TraceMsgPackEncoder:
        return TraceMsgPackEncoder(
            version,
            max_size=self.max_buffer_size,
            max_item_size=self.max_payload_size,
            max_payload_size=self.max_payload_size,
            **self._encoder_options,
        )

    def _init_runtime_state(self) -> None:
        """Everything a forked child must not share with its parent."""
        # Reentrant: span code run by put() may itself write a trace.  The
        # inner trace is appended to both the encoder and the list first, so
        # their orders still agree.
        self._lock = threading.RLock()
        self._work_ready = threading.Condition(self._lock)
        self._batch_done = threading.Condition(self._lock)
        self._encoder = self._new_encoder(self._version)
        self._traces: List[Trace] = []  # in the encoder's buffer, in its order
        self._wake_at = max(self.max_payload_size // 2, 1)
        self._flush_requested = False
        self._thread: Optional[threading.Thread] = None
        self._batch: Optional[_Batch] = None
        self._batches_taken = 0
        self._batches_done = 0
        self._stop_deadline: Optional[float] = None
        self._connection: Optional[http.client.HTTPConnection] = None
        self._connection_used = False
        self._traces_written = 0
        self._traces_sent = 0
        self._spans_sent = 0
        self._payloads_sent = 0
        self._bytes_sent = 0
        self._retries = 0
        self._dropped: Dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._unlogged: Dict[str, int] = {}
        self._last_error: Dict[str, str] = {}
        self._last_log = float("-inf")

    def _reset_after_fork(self) -> None:
        # The parent keeps (and sends) what it buffered; the child starts
        # empty, with a new encoder, its own lock (the parent's may have been
        # held by another thread at the fork), thread and connection.
        # Closing the child's copy of the socket leaves the parent's open.
        if self._connection is not None:
            self._connection.close()
        self._init_runtime_state()

    # -- application side -------------------------------------------------

    def write(self, trace: Trace) -> None:
        """Buffer one trace (a list of spans) for sending; never raises for its content."""
        error: Optional[BaseException] = None
        with self._lock:
            self._traces_written += 1
            if self._stopped:
                reason = "stopped"
            else:
                encoder = self._encoder
                try:
                    encoder.put(trace)
                except BufferFull:
                    reason = "buffer_full"
                except BufferItemTooLarge:
                    reason = "trace_too_large"
                except Exception as exc:
                    reason, error = "bad_input", exc
                else:
                    self._traces.append(trace)
                    if self._thread is None:
                        self._start_thread()
                    if encoder.size >= self._wake_at:
                        self._wake_at = self.max_buffer_size + 1  # once per batch
                        self._work_ready.notify()
                    return
            message = self._count_dropped(1, reason, error)
        if message:
            log.warning(message)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Send what is buffered now; True once all of it was delivered or counted dropped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if threading.current_thread() is self._thread:
                return False  # called from on_response: it would wait on itself
            if not self._traces and self._batch is None:
                return True
            if self._thread is None:
                self._start_thread()
                if self._thread is None:
                    return False
            # A swap takes the whole buffer, so the next batch holds everything
            # buffered now; a batch in flight is finished before it.
            target = self._batches_taken + (1 if self._traces else 0)
            self._flush_requested = True
            self._work_ready.notify()
            while self._batches_done < target:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._batch_done.wait(remaining)
            return True

    def stop(self, timeout: Optional[float] = None) -> bool:
        """Flush and stop the thread; later writes are dropped as ``stopped``.

        Returns False when ``timeout`` ran out; what was still unsent is then
        counted as ``stopped``.  Safe to call more than once.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if not self._stopped:
                self._stopped = True
                self._stop_deadline = deadline
            thread = self._thread
            self._work_ready.notify()
        finished = True
        if thread is None:
            self._send_inline(deadline)
        elif thread is not threading.current_thread():
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            finished = not thread.is_alive()
        messages = []
        with self._lock:
            if not finished or thread is None:
                # Whatever the thread has not settled is given up on now; if
                # it does deliver later, that is not counted again.
                if self._batch is not None and not self._batch.abandoned:
                    self._batch.abandoned = True
                    messages.append(self._count_dropped(self._batch.unsettled, "stopped", None))
                if self._traces:
                    messages.append(self._count_dropped(len(self._traces), "stopped", None))
                    self._take_buffer()
                self._batches_done = self._batches_taken
                self._batch_done.notify_all()
            messages.append(self._drop_summary(force=True))
        for message in messages:
            if message:
                log.warning(message)
        if finished and self._connection is not None:
            self._connection.close()
        return finished

    def _send_inline(self, deadline: Optional[float]) -> None:
        """stop() without a flush thread: send the buffer on the caller's thread."""
        while deadline is None or time.monotonic() < deadline:
            with self._lock:
                if not self._traces or self._thread is not None:
                    return
                batch, groups = self._take_batch()
            self._process_batch(batch, groups)

    @property
    def stats(self) -> Dict[str, Any]:
        """A snapshot of the counters (a new dict on every read)."""
        with self._lock:
            return {
                "traces_written": self._traces_written,
                "traces_sent": self._traces_sent,
                "spans_sent": self._spans_sent,
                "payloads_sent": self._payloads_sent,
                "bytes_sent": self._bytes_sent,
                "traces_dropped": sum(self._dropped.values()),
                "dropped_by_reason": {k: v for k, v in self._dropped.items() if v},
                "retries": self._retries,
                "version": self._version,
            }

    @property
    def version(self) -> str:
        """The trace API version payloads are encoded in now."""
        return self._version

    # -- accounting (callers hold the lock unless said otherwise) ----------

    def _count_dropped(self, count: int, reason: str, error: Optional[BaseException]) -> Optional[str]:
        """Count ``count`` traces dropped; return a log line when one is due."""
        if count <= 0:
            return None
        self._dropped[reason] += count
        self._unlogged[reason] = self._unlogged.get(reason, 0) + count
        if error is not None:
            self._last_error[reason] = "%s: %s" % (type(error).__name__, error)
        return self._drop_summary(force=False)

    def _drop_summary(self, force: bool) -> Optional[str]:
        # One line per interval at most, however many traces are dropped.
        now = time.monotonic()
        if not self._unlogged or (not force and now - self._last_log < self._log_interval):
            return None
        total = sum(self._unlogged.values())
        reasons = ", ".join(
            "%d %s%s" % (n, reason, " (%s)" % self._last_error[reason] if reason in self._last_error else "")
            for reason, n in sorted(self._unlogged.items())
        )
        self._unlogged = {}
        self._last_error = {}
        self._last_log = now
        return "spanpack.AgentWriter to %s dropped %d trace%s: %s" % (
            self.url,
            total,
            "" if total == 1 else "s",
            reasons,
        )

    def _settle(
        self, batch: _Batch, traces: Sequence[Trace], reason: Optional[str], error: Optional[BaseException] = None
    ) -> None:
        """Count ``traces`` delivered (reason None) or dropped; takes the lock."""
        if not traces:
            return
        message = None
        with self._lock:
            if batch.abandoned:  # stop() counted them already
                return
            batch.unsettled -= len(traces)
            if reason is None:
                self._traces_sent += len(traces)
                self._spans_sent += sum(map(len, traces))
            else:
                message = self._count_dropped(len(traces), reason, error)
        if message:
            log.warning(message)

    # -- the flush thread -------------------------------------------------

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._run, name="spanpack.AgentWriter", daemon=True)
        try:
            thread.start()
        except RuntimeError:
            # Interpreter shutdown forbids new threads: the buffer waits for
            # stop() (run at exit), which then sends it on its own thread.
            return
        self._thread = thread

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_interval
        while True:
            with self._lock:
                while True:
                    if self._stopped and not self._traces:
                        return
                    if self._traces and (
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
            next_flush = time.monotonic() + self.flush_interval
            self._process_batch(batch, groups)

    def _take_buffer(self) -> List[_Group]:
        """Empty the encoder's buffer into payload groups (the lock is held)."""
        traces, self._traces = self._traces, []
        encoder = self._encoder
        groups = []
        offset = 0
        for payload, count in encoder.encode():
            groups.append(_Group(traces[offset : offset + count], payload, encoder))
            offset += count
        assert offset == len(traces), "the encoder and the trace list disagree"
        self._wake_at = max(self.max_payload_size // 2, 1)
        return groups

    def _take_batch(self) -> Tuple[_Batch, List[_Group]]:
        """Swap the buffer out (the lock is held)."""
        batch = self._batch = _Batch(len(self._traces))
        groups = self._take_buffer()
        self._flush_requested = False
        self._batches_taken += 1
        return batch, groups

    def _process_batch(self, batch: _Batch, groups: List[_Group]) -> None:
        try:
            self._send_batch(batch, groups)
        except Exception as error:  # a bug here must not lose the count
            log.exception("spanpack.AgentWriter: unexpected error while sending")
            self._close_connection()
            message = None
            with self._lock:
                if not batch.abandoned:
                    message = self._count_dropped(batch.unsettled, "retries_exhausted", error)
                    batch.unsettled = 0
            if message:
                log.warning(message)
        with self._lock:
            if self._batch is batch:
                self._batch = None
                self._batches_done += 1
            self._batch_done.notify_all()

    def _send_batch(self, batch: _Batch, groups: List[_Group]) -> None:
        if not self._negotiated:
            self._negotiate()
        pending = list(reversed(groups))  # a stack: each entry goes as one payload
        while pending:
            group = pending.pop()
            encoder = self._encoder
            if group.encoder is not encoder:  # not made yet, or in a version refused since
                try:
                    group.payload, group.encoder = encoder.encode_traces(group.traces), encoder
                except Exception as error:  # a trace mutated after write()
                    if len(group.traces) == 1:
                        self._settle(batch, group.traces, "bad_input", error)
                    else:
                        pending.extend(_halves(group.traces))
                    continue
            assert group.payload is not None
            if len(group.payload) > self.max_payload_size:
                if len(group.traces) == 1:
                    self._settle(batch, group.traces, "trace_too_large")
                else:
                    pending.extend(_halves(group.traces))
                continue
            outcome = self._deliver(batch, group.traces, group.payload)
            if outcome == _SPLIT:
                pending.extend(_halves(group.traces))
            elif outcome == _REENCODE:
                pending.append(group)

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
        """Encode in ``version`` from now on, what is buffered included."""
        if version == self._version:
            return
        encoder = self._new_encoder(version)
        messages = []
        with self._lock:
            # The old version's bytes are of no use now; its traces are re-put
            # (they were counted as written already).
            buffered = [trace for group in self._take_buffer() for trace in group.traces]
            self._encoder, self._version = encoder, version
            for trace in buffered:
                try:
                    encoder.put(trace)
                except BufferFull:
                    messages.append(self._count_dropped(1, "buffer_full", None))
                except BufferItemTooLarge:
                    messages.append(self._count_dropped(1, "trace_too_large", None))
                except Exception as error:
                    messages.append(self._count_dropped(1, "bad_input", error))
                else:
                    self._traces.append(trace)
        for message in messages:
            if message:
                log.warning(message)

    def _negotiate(self) -> None:
        """Ask the agent's /info which trace endpoints it has."""
        try:
            status, body = self._request("GET", "/info", None, {})
        except (OSError, http.client.HTTPException):
            return  # no answer: the payload's own failure is handled; ask again next time
        if status == 200:
            try:
                endpoints = json.loads(body).get("endpoints") or []
            except (ValueError, AttributeError):
                endpoints = []
            self._set_version(choose_version(endpoints, self._supported))
        elif status == 404:  # an agent from before /info
            self._set_version("v0.4")
        else:
            return
        self._negotiated = True

    def _deliver(self, batch: _Batch, group: List[Trace], payload: bytes) -> Optional[str]:
        """Send one payload with retries; settle ``group`` unless it is to be split or re-encoded."""
        version = self._version
        headers = self._encoder.headers(len(group))
        # Without it the agent answers 200 even when it drops the payload for load.
        headers["Datadog-Send-Real-Http-Status"] = "true"
        path = "/%s/traces" % version
        error: Optional[BaseException] = None
        for attempt in range(self.max_attempts):
            if attempt:
                with self._lock:
                    self._retries += 1
                if not self._sleep_before_retry(attempt, error):
                    self._settle(batch, group, "stopped", error)
                    return None
            reused = self._connection_used
            try:
                status, body = self._request("PUT", path, payload, headers)
            except (OSError, http.client.HTTPException) as exc:
                error = exc
                if reused and attempt == 0 and self.max_attempts > 1 and not isinstance(exc, socket.timeout):
                    # A kept-alive connection the agent closed while idle:
                    # the next attempt goes out at once on a new one.
                    error = _StaleConnection(exc)
                continue
            if 200 <= status < 300:
                with self._lock:
                    self._payloads_sent += 1
                    self._bytes_sent += len(payload)
                self._settle(batch, group, None)
                self._report(body)
                return None
            if status in _DOWNGRADE_STATUSES and version != "v0.4":
                if self._downgrade(version):
                    return _REENCODE
            if status == 413:
                if len(group) > 1:
                    return _SPLIT
                self._settle(batch, group, "trace_too_large", _HTTPStatus(status, body))
                return None
            if status >= 500 or status in _RETRY_STATUSES:
                error = _HTTPStatus(status, body)
                continue
            self._settle(batch, group, "agent_refused", _HTTPStatus(status, body))
            return None
        self._settle(batch, group, "retries_exhausted", error)
        return None

    def _sleep_before_retry(self, attempt: int, error: Optional[BaseException]) -> bool:
        """Back off (doubling, each wait drawn from its upper half); False if stop()'s deadline comes first."""
        delay = 0.0 if isinstance(error, _StaleConnection) else self.retry_backoff * (2 ** (attempt - 1))
        end = time.monotonic() + random.uniform(delay / 2, delay)
        with self._lock:
            while True:
                now = time.monotonic()
                deadline = self._stop_deadline if self._stopped else None
                if deadline is not None and end >= deadline:
                    return False
                if now >= end:
                    return True
                # On the condition, so that stop() wakes it to check its deadline.
                self._work_ready.wait(end - now)

    def _request(self, method: str, path: str, body: Optional[bytes], headers: Mapping[str, str]) -> Tuple[int, bytes]:
        timeout = self.timeout
        deadline = self._stop_deadline
        if self._stopped and deadline is not None:
            timeout = max(0.001, min(timeout, deadline - time.monotonic()))
        connection = self._connection
        if connection is None:
            connection = self._connection = agent_connection(self.url, timeout)
            self._connection_used = False
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        try:
            connection.request(method, path, body, dict(headers))
            response = connection.getresponse()
            data = response.read()
        except BaseException:
            self._close_connection()
            raise
        self._connection_used = True
        if response.will_close:
            self._close_connection()
        return response.status, data

    def _close_connection(self) -> None:
        connection, self._connection = self._connection, None
        self._connection_used = False
        if connection is not None:
            connection.close()

    def _report(self, body: bytes) -> None:
        if self.on_response is None:
            return
        try:
            reply = json.loads(body)
        except ValueError:
            return
        if isinstance(reply, dict):
            try:
                self.on_response(reply)
            except Exception:
                log.exception("spanpack.AgentWriter: on_response raised")




def _halves(traces: List[Trace]) -> Tuple[_Group, _Group]:
    """Two groups, the second half first: they are pushed on a stack."""
    half = len(traces) // 2
    return _Group(traces[half:]), _Group(traces[:half])


class _HTTPStatus(Exception):
    """An agent reply that failed a payload, for the drop log."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__("HTTP %d %s" % (status, body[:200].decode("utf-8", "replace").strip()))


class _StaleConnection(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__("%s: %s" % (type(cause).__name__, cause))
