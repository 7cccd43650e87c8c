"""Soak: 8 producer threads write through an AgentWriter while the fault
server answers each payload with the next fault of a fixed cycle.

Every thousandth trace of a producer raises KeyboardInterrupt from span code,
and every fifth on_response call raises SystemExit.  The cycle holds every
fault the writer must survive: 5xx, 429, 408, 413
(split), resets before and after the body, a reply that never comes, one
trickled a byte at a time, garbage, a truncated status line, an endless
body, JSON nested 100,000 deep, and plain 200s in between.  Whatever the
timing, at the end:

- the ledger: ``traces_written`` is the number of ``write()`` calls, and
  ``sent + dropped == written`` with nothing left buffered;
- nothing counted sent on a confirmation that the server did not accept,
  and nothing the server may have kept (read whole, not refused) counted
  dropped;
- the agent holds a trace more than once only within ``traces_resent``
  (at-least-once; never at-most-once, which resends nothing that went out
  whole).

Each version runs in both delivery modes.  ``SPANPACK_SOAK_SECONDS`` sets how
long the producers run (default 8 s per version and mode).  ``python -m tests.integration.test_writer_soak`` prints the figures.
"""

import itertools
import os
import threading
import time

import pytest

from spanpack.writer import AgentWriter, supported_versions

from tests.integration import chained_trace
from tests.integration.fault_server import FaultServer

SOAK_SECONDS = float(os.environ.get("SPANPACK_SOAK_SECONDS", "8"))
PRODUCERS = 8
FAULTS = [
    "ok",
    ("status", 500),
    "reset_after_body",
    ("status", 429),
    "close_after_body",
    "ok",
    ("status", 413),
    "garbage",
    ("status", 503),
    "slow",
    "ok",
    "reset_before_body",
    "truncated",
    ("status", 408),
    "trickle",
    "ok",
    "huge",
    "deep_json",
    "ok",
]


def _trace(trace_id, spans):
    return chained_trace(trace_id, spans, 10, service="soak", resource="r%d" % (trace_id % 13),
                         meta={"k": "v%d" % (trace_id % 5)}, metrics={"m": 0.5})


class _InterruptingSpan:
    """A span whose ``service`` raises KeyboardInterrupt, as a Ctrl-C landing in span code."""

    trace_id, span_id, parent_id, name, start_ns, duration_ns = 1, 1, 0, "op", 0, 1

    @property
    def service(self):
        raise KeyboardInterrupt


def run_soak(version, delivery, seconds=SOAK_SECONDS):
    """Run one soak; return the writer's stats and what the server saw."""
    with FaultServer(["/v0.4/traces", "/v0.5/traces", "/v1.0/traces"]) as server:
        # A script (taken before the body is read, so resets can come first),
        # longer than any soak's requests; plain 200s after it.
        server.script.extend(FAULTS * 20_000)
        replies = []

        def on_response(reply):
            replies.append(reply)
            if len(replies) % 5 == 0:
                raise SystemExit("a callback that exits")  # the thread must go on
        writer = AgentWriter(
            server.url,
            version=version,
            flush_interval=0.05,
            timeout=0.3,
            max_attempts=3,
            retry_backoff=0.01,
            max_payload_size=16 << 10,
            max_buffer_size=8 * (256 << 10),
            on_response=on_response,
            delivery=delivery,
        )
        calls = [0] * PRODUCERS
        stop_at = time.monotonic() + seconds

        def produce(n):
            ids = itertools.count(n * 10_000_000 + 1)
            for i in range(2_000_000):  # bounded in count as well as in time
                if i % 32 == 0:
                    if time.monotonic() >= stop_at:
                        return
                    time.sleep(0.002)  # a service's pace, not a busy loop
                if i % 1000 == 999:
                    try:
                        writer.write([_InterruptingSpan()])
                    except KeyboardInterrupt:
                        pass
                else:
                    writer.write(_trace(next(ids), 1 + i % 3))
                calls[n] += 1

        threads = [threading.Thread(target=produce, args=(n,)) for n in range(PRODUCERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(seconds + 30)
        assert not any(thread.is_alive() for thread in threads)
        stopped = writer.stop(timeout=30)
        server.release()
        stats = writer.stats
        accepted = server.accepted_ids()
        kept_all = [tid for p in server.kept for tid in p.trace_ids]
        kept = set(kept_all)
        return {
            "stopped": stopped,
            "calls": sum(calls),
            "stats": stats,
            "accepted": len(accepted),
            "accepted_distinct": len(set(accepted)),
            "kept_distinct": len(kept),
            "kept_duplicates": len(kept_all) - len(kept),
            "received": len(server.received_ids()),
            "payload_requests": len(server.requests),
            "errors": list(server.errors),
            "accepted_ids_valid": all(tid % 10_000_000 and tid // 10_000_000 < PRODUCERS for tid in accepted),
        }


VERSIONS = [v for v in ("v0.4", "v0.5", "v1.0") if v in supported_versions()]


@pytest.mark.parametrize("delivery", ["at-least-once", "at-most-once"])
@pytest.mark.parametrize("version", VERSIONS)
def test_soak_against_every_fault(version, delivery):
    result = run_soak(version, delivery)
    stats = result["stats"]
    assert result["stopped"], result
    # The ledger: every write() counted once, nothing left in between.
    assert stats["traces_written"] == result["calls"] > 0, result
    assert stats["traces_buffered"] == 0, result
    assert stats["traces_sent"] + stats["traces_dropped"] == stats["traces_written"], result
    assert sum(stats["dropped_by_reason"].values()) == stats["traces_dropped"]
    assert stats["writer_errors"] == 0 and stats["thread_starts"] == 1, result
    # Nothing counted sent on a confirmation the server did not give.
    confirmed = stats["traces_sent"] - stats["traces_sent_unconfirmed"]
    assert confirmed <= result["accepted_distinct"] <= stats["traces_sent"], result
    # Nothing the server may have kept was counted dropped.
    assert result["kept_distinct"] <= stats["traces_sent"], result
    # Duplicates at the agent (anything it read whole and did not refuse)
    # only among the resent traces; at-most-once resends nothing.
    assert result["kept_duplicates"] <= stats["traces_resent"], result
    if delivery == "at-most-once":
        assert stats["traces_resent"] == 0, result
    else:
        assert stats["traces_resent"] > 0, result
    assert result["accepted_ids_valid"] and not result["errors"], result
    # Every kind of fault was met, and the writer survived them all.
    assert result["payload_requests"] >= len(FAULTS), result
    assert stats["version"] == version
    assert stats["dropped_by_reason"]["interrupted"] >= PRODUCERS and stats["on_response_errors"] >= 1
    assert stats["dropped_by_reason"]["trace_too_large"] + stats["traces_sent_unconfirmed"] > 0


if __name__ == "__main__":
    import json

    for version in VERSIONS:
        for delivery in ("at-least-once", "at-most-once"):
            figures = run_soak(version, delivery)
            print(version, delivery, json.dumps(figures, indent=1, sort_keys=True))
