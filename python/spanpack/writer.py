"""AgentWriter: buffer finished traces and send them to a Datadog trace agent.

The application thread only encodes (``encode_trace``) and appends to a list;
a background thread joins the encoded traces into payloads and owns the
network: the kept-alive HTTP connection, version negotiation, retries,
splitting and downgrades.

Every trace passed to ``write()`` ends in exactly one of two counts:
delivered (``traces_sent``) or dropped (``traces_dropped``, with its reason in
``dropped_by_reason``).  A trace is settled through ``_settle`` only, under the
lock, once.

What a buffered trace is kept as: its encoded part (an ``EncodedTrace``), and
also the trace itself until the agent has accepted a payload in the current
version.  A split after a 413 needs only the parts (``join_encoded`` on
halves); a version downgrade after a 404/415 needs the traces, since parts of
one version cannot be turned into another.  Keeping every trace would keep all
span objects alive until delivery, several times the memory of their encoded
bytes that ``max_buffer_size`` bounds; re-encoding at flush time instead would
move encoding (and bad-input errors) off the caller and leave the buffer's
size unknown when ``write()`` decides whether a trace fits.  A downgrade
happens when a writer meets an agent older than it assumed, which is known
after the first accepted payload; from then on only parts are kept.  If an
agent that accepted a version later refuses it (replaced by an older agent),
the parts buffered meanwhile cannot be re-encoded and are counted as
``agent_refused``; later traces are sent in the lower version.
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

# A buffered trace: (encoded part, the trace or None, span count, the encoder
# that encoded it).  A tuple: it is built on the application thread.
_Record = Tuple[Any, Any, int, TraceMsgPackEncoder]

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
    """The trace API versions the installed encoder can write, best first."""
    found = []
    for version in VERSIONS:
        try:
            TraceMsgPackEncoder(version, **encoder_options)
        except ValueError:
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
    """The records the flush thread took in one swap of the buffer."""

    __slots__ = ("unsettled", "abandoned")

    def __init__(self, count: int) -> None:
        self.unsettled = count
        self.abandoned = False


class _Outcome:
    SENT = "sent"
    SPLIT = "split"
    DOWNGRADE = "downgrade"


class AgentWriter:
    """Send traces to a Datadog trace agent from a background thread.

    ::

        writer = spanpack.AgentWriter()      # the agent from DD_* variables
        writer.write(trace)                  # any thread; never waits on the network
        writer.stop()                        # also run at interpreter exit

    Traces must not be mutated after ``write()``: until the agent first
    accepts a payload, a downgrade re-encodes them from the objects.
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
        self._encoder = TraceMsgPackEncoder(self._supported[0], **encoder_options)
        # Until the agent accepts a payload in this version, keep the traces too.
        self._confirmed = False

        self._init_runtime_state()
        self._stopped = False
        self._log_interval = 60.0
        _live_writers.add(self)

    def _init_runtime_state(self) -> None:
        """Everything a forked child must not share with its parent."""
        self._lock = threading.Lock()
        self._work_ready = threading.Condition(self._lock)
        self._batch_done = threading.Condition(self._lock)
        self._buffer: List[_Record] = []
        self._buffered_bytes = 0
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
        # empty, with its own lock (the parent's may have been held by another
        # thread at the fork) and its own thread and connection.  Closing the
        # child's copy of the socket leaves the parent's connection open.
        if self._connection is not None:
            self._connection.close()
        self._init_runtime_state()

    # -- application side -------------------------------------------------

    def write(self, trace: Sequence[Any]) -> None:
        """Buffer one trace (a list of spans) for sending; never raises for its content."""
        encoder = self._encoder
        try:
            part = encoder.encode_trace(trace)
            spans = len(trace)
        except Exception as error:
            self._drop_one("bad_input", error)
            return
        size = len(part)
        with self._lock:
            self._traces_written += 1
            if self._stopped:
                reason = "stopped"
            elif size > self.max_payload_size:
                reason = "trace_too_large"
            elif self._buffered_bytes + size > self.max_buffer_size:
                reason = "buffer_full"
            else:
                self._buffer.append((part, None if self._confirmed else trace, spans, encoder))
                self._buffered_bytes += size
                if self._thread is None:
                    self._start_thread()
                if self._buffered_bytes >= self._wake_at:
                    self._wake_at = self.max_buffer_size + 1  # once per batch
                    self._work_ready.notify()
                return
            message = self._count_dropped(1, reason, None)
        if message:
            log.warning(message)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Send what is buffered now; True once all of it was delivered or counted dropped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if threading.current_thread() is self._thread:
                return False  # called from on_response: it would wait on itself
            if not self._buffer and self._batch is None:
                return True
            if self._thread is None and self._stopped:
                return False
            # A swap takes the whole buffer, so the next batch holds everything
            # buffered now; a batch in flight is finished before it.
            target = self._batches_taken + (1 if self._buffer else 0)
            if self._thread is None:
                self._start_thread()
                if self._thread is None:
                    return False
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
            first = not self._stopped
            self._stopped = True
            if first:
                self._stop_deadline = deadline
            thread = self._thread
            self._work_ready.notify()
        finished = True
        if thread is None:
            self._send_inline(deadline)
        elif thread is not threading.current_thread():
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            finished = not thread.is_alive()
        with self._lock:
            messages = []
            if not finished or thread is None:
                # Whatever the thread has not settled is given up on now; if
                # it does deliver later, that is not counted again.
                if self._batch is not None and not self._batch.abandoned:
                    self._batch.abandoned = True
                    messages.append(self._count_dropped(self._batch.unsettled, "stopped", None))
                if self._buffer:
                    messages.append(self._count_dropped(len(self._buffer), "stopped", None))
                    self._buffer = []
                    self._buffered_bytes = 0
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
                if not self._buffer or self._thread is not None:
                    return
                batch, records = self._take_batch()
            self._process_batch(batch, records)

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
                "version": self._encoder.version,
            }

    @property
    def version(self) -> str:
        """The trace API version payloads are encoded in now."""
        return self._encoder.version

    # -- accounting (callers hold the lock unless said otherwise) ----------

    def _drop_one(self, reason: str, error: Optional[BaseException]) -> None:
        with self._lock:
            self._traces_written += 1
            message = self._count_dropped(1, reason, error)
        if message:
            log.warning(message)

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

    def _settle(self, batch: _Batch, records: Sequence[_Record], reason: Optional[str], error=None) -> None:
        """Count ``records`` delivered (reason None) or dropped; takes the lock."""
        if not records:
            return
        message = None
        with self._lock:
            if batch.abandoned:  # stop() counted them already
                return
            batch.unsettled -= len(records)
            if reason is None:
                self._traces_sent += len(records)
                self._spans_sent += sum(r[2] for r in records)
            else:
                message = self._count_dropped(len(records), reason, error)
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
                    if self._stopped and not self._buffer:
                        return
                    if self._buffer and (
                        self._stopped
                        or self._flush_requested
                        or self._buffered_bytes >= self.max_payload_size // 2
                        or time.monotonic() >= next_flush
                    ):
                        break
                    wait = next_flush - time.monotonic()
                    if wait <= 0:
                        next_flush = time.monotonic() + self.flush_interval
                        wait = self.flush_interval
                    self._work_ready.wait(wait)
                batch, records = self._take_batch()
            next_flush = time.monotonic() + self.flush_interval
            self._process_batch(batch, records)

    def _take_batch(self) -> Tuple[_Batch, List[_Record]]:
        """Swap the buffer out (the lock is held)."""
        records = self._buffer
        self._buffer = []
        self._buffered_bytes = 0
        self._wake_at = max(self.max_payload_size // 2, 1)
        self._flush_requested = False
        batch = self._batch = _Batch(len(records))
        self._batches_taken += 1
        return batch, records

    def _process_batch(self, batch: _Batch, records: List[_Record]) -> None:
        try:
            self._send_batch(batch, records)
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

    def _send_batch(self, batch: _Batch, records: List[_Record]) -> None:
        if not self._negotiated:
            self._negotiate()
        pending = [records]  # a stack of record lists, each to go as one payload
        first = True
        while pending:
            group = self._in_current_version(batch, pending.pop())
            if not group:
                continue
            if first:
                first = False
                pending.extend(reversed(self._chunks(group)))
                continue
            payload = self._encoder.join_encoded([r[0] for r in group])
            if len(payload) > self.max_payload_size:
                # v0.5 string tables make joined sizes exceed the parts' sum estimate.
                if len(group) == 1:
                    self._settle(batch, group, "trace_too_large")
                else:
                    half = len(group) // 2
                    pending.extend((group[half:], group[:half]))
                continue
            outcome = self._deliver(batch, group, payload)
            if outcome == _Outcome.SPLIT:
                half = len(group) // 2
                pending.extend((group[half:], group[:half]))
            elif outcome == _Outcome.DOWNGRADE:
                pending.append(group)  # re-encoded by _in_current_version

    def _chunks(self, records: List[_Record]) -> List[List[_Record]]:
        """Consecutive runs whose parts add up to at most max_payload_size."""
        chunks: List[List[_Record]] = []
        current: List[_Record] = []
        size = 16  # the array header and, for v0.5, the string table's overhead
        for record in records:
            part_size = len(record[0])
            if current and size + part_size > self.max_payload_size:
                chunks.append(current)
                current, size = [], 16
            current.append(record)
            size += part_size
        if current:
            chunks.append(current)
        return chunks

    def _in_current_version(self, batch: _Batch, records: List[_Record]) -> List[_Record]:
        """``records`` with any part of another version re-encoded from its trace."""
        encoder = self._encoder
        if all(r[3] is encoder for r in records):
            return records
        kept = []
        for record in records:
            part, trace, spans, made_by = record
            if made_by is encoder:
                kept.append(record)
            elif trace is None:
                self._settle(batch, [record], "agent_refused")
            else:
                try:
                    kept.append((encoder.encode_trace(trace), trace, spans, encoder))
                except Exception as error:  # mutated after write(), or changed behaviour
                    self._settle(batch, [record], "bad_input", error)
        return kept

    def _downgrade(self, refused: str) -> bool:
        """Switch below ``refused``; False when there is nothing lower."""
        lower = [v for v in self._supported if VERSIONS.index(v) > VERSIONS.index(refused)]
        if self._encoder.version != refused:
            return True  # already switched (by /info or an earlier payload)
        if not lower:
            return False
        log.info("spanpack.AgentWriter: the agent refused %s; sending %s", refused, lower[0])
        self._set_version(lower[0])
        return True

    def _set_version(self, version: str) -> None:
        if version == self._encoder.version:
            return
        encoder = TraceMsgPackEncoder(version, **self._encoder_options)
        with self._lock:
            self._encoder = encoder
            self._confirmed = False

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

    def _deliver(self, batch: _Batch, group: List[_Record], payload: bytes) -> Optional[str]:
        """Send one payload with retries; settle the group unless it is to be split or re-encoded."""
        version = self._encoder.version
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
                    self._confirmed = True
                self._settle(batch, group, None)
                self._report(body)
                return _Outcome.SENT
            if status in _DOWNGRADE_STATUSES and version != "v0.4":
                if self._downgrade(version):
                    return _Outcome.DOWNGRADE
            if status == 413:
                if len(group) > 1:
                    return _Outcome.SPLIT
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
        """Back off (exponential, full jitter); False if stop()'s deadline comes first."""
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


class _HTTPStatus(Exception):
    """An agent reply that failed a payload, for the drop log."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__("HTTP %d %s" % (status, body[:200].decode("utf-8", "replace").strip()))


class _StaleConnection(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__("%s: %s" % (type(cause).__name__, cause))
