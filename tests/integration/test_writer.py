"""spanpack.AgentWriter against the APM test agent and a fault-injecting server.

Every scenario ends with the writer's own ledger checked against what the
server holds: each written trace is delivered (and then accepted by the
server exactly once) or counted dropped with a reason, never both.
"""

import itertools
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import spanpack
from spanpack import transport
from spanpack.writer import DROP_REASONS, AgentWriter, choose_version, supported_versions

from tests.integration import chained_trace
from tests.integration.fault_server import FaultServer, refusing_url

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_V1 = "v1.0" in supported_versions()
_ids = itertools.count(1)


def make_trace(spans=1):
    trace_id = next(_ids)
    return chained_trace(trace_id, spans, 100, service="svc", resource="res-%d" % (trace_id % 7),
                         meta={"k": "v"}, metrics={"m": 1.5})


def ledger_balances(writer):
    stats = writer.stats
    assert set(stats["dropped_by_reason"]) == set(DROP_REASONS)
    assert sum(stats["dropped_by_reason"].values()) == stats["traces_dropped"]
    assert stats["traces_buffered"] == 0, stats
    assert stats["traces_sent"] + stats["traces_dropped"] == stats["traces_written"], stats
    return stats


def drops(stats):
    """The drop reasons that counted something (every reason is always present)."""
    return {reason: n for reason, n in stats["dropped_by_reason"].items() if n}


def delivered_exactly_once(server, writer, written_ids):
    """The server accepted each delivered trace once and nothing else."""
    accepted = server.accepted_ids()
    stats = writer.stats
    assert len(accepted) == len(set(accepted)), "a trace was accepted twice"
    assert set(accepted) <= set(written_ids)
    # Every confirmed trace was accepted; an unconfirmed one may have been.
    confirmed = stats["traces_sent"] - stats["traces_sent_unconfirmed"]
    assert confirmed <= len(accepted) <= stats["traces_sent"]
    # Nothing the server may have kept was counted dropped.
    assert len({tid for p in server.kept for tid in p.trace_ids}) <= stats["traces_sent"]
    assert not server.errors


@pytest.fixture
def writers():
    """Make writers that are stopped (and so never outlive the test)."""
    made = []

    def make(url, **options):
        options.setdefault("flush_interval", 60.0)  # tests flush explicitly
        options.setdefault("timeout", 5.0)  # a busy CI machine must not turn a reply into "unconfirmed"
        options.setdefault("retry_backoff", 0.01)
        writer = AgentWriter(url, **options)
        made.append(writer)
        return writer

    yield make
    for writer in made:
        writer.stop(timeout=5)


@pytest.fixture
def server():
    with FaultServer() as srv:
        yield srv


# -- the APM test agent -------------------------------------------------------


def _write_from_threads(writer, threads=16, per_thread=40, flusher=True):
    written = {}
    lock = threading.Lock()
    start = threading.Barrier(threads + (1 if flusher else 0))
    done = threading.Event()

    def produce(n):
        start.wait(10)
        for i in range(per_thread):
            trace = make_trace(1 + (i + n) % 3)
            with lock:
                written[trace[0]["trace_id"]] = len(trace)
            writer.write(trace)

    def flush_meanwhile():
        start.wait(10)
        for _ in range(1000):  # bounded: ends when the producers do
            if done.is_set():
                return
            writer.flush(timeout=5)

    workers = [threading.Thread(target=produce, args=(n,)) for n in range(threads)]
    flush_thread = threading.Thread(target=flush_meanwhile) if flusher else None
    for t in workers + ([flush_thread] if flush_thread else []):
        t.start()
    for t in workers:
        t.join(30)
    done.set()
    if flush_thread:
        flush_thread.join(30)
    return written


@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
@pytest.mark.parametrize("over", ["tcp", "uds"])
def test_sixteen_threads_arrive_exactly_once(agent_session, writers, version, over):
    if over == "uds":
        if not agent_session.uds_path:
            pytest.skip("the agent in use was not started with a Unix socket")
        url = "unix://" + agent_session.uds_path
    else:
        url = agent_session.base_url
    replies = []
    writer = writers(url, version=version, flush_interval=0.05, on_response=replies.append)
    written = _write_from_threads(writer)
    assert writer.stop(timeout=20)
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == len(written) == 640, stats
    assert stats["spans_sent"] == sum(written.values())
    assert stats["version"] == version
    received = agent_session.traces()
    # The agent groups spans by trace id: a duplicate would double a trace's spans.
    got = {trace[0]["trace_id"]: len(trace) for trace in received}
    assert got == written
    assert replies and all("rate_by_service" in reply for reply in replies)


def test_auto_negotiates_the_best_common_version_with_the_agent(agent_session, writers):
    writer = writers(agent_session.base_url)
    traces = [make_trace(2) for _ in range(5)]
    for trace in traces:
        writer.write(trace)
    assert writer.flush(timeout=10)
    # The agent lists /v1.0/traces: used once the encoder can write it.
    assert writer.stats["version"] == ("v1.0" if HAS_V1 else "v0.5")
    got = {trace[0]["trace_id"] for trace in agent_session.traces()}
    assert got == {trace[0]["trace_id"] for trace in traces}


@pytest.mark.skipif(not HAS_V1, reason="the installed encoder has no v1.0")
def test_v1_0_to_the_agent(agent_session, writers):
    writer = writers(agent_session.base_url, version="v1.0")
    traces = [make_trace(3) for _ in range(20)]
    for trace in traces:
        writer.write(trace)
    assert writer.flush(timeout=10)
    assert ledger_balances(writer)["traces_sent"] == 20
    got = {trace[0]["trace_id"]: len(trace) for trace in agent_session.traces()}
    assert got == {trace[0]["trace_id"]: 3 for trace in traces}


# -- version selection ----------------------------------------------------------


def test_choose_version():
    everything = ["v1.0", "v0.5", "v0.4"]
    assert choose_version(["/v0.4/traces", "/v0.5/traces", "/v1.0/traces"], everything) == "v1.0"
    assert choose_version(["/v0.4/traces", "/v0.5/traces", "/v1.0/traces"], ["v0.5", "v0.4"]) == "v0.5"
    assert choose_version(["/v0.4/traces", "/v0.7/traces"], everything) == "v0.4"
    assert choose_version([], everything) == "v0.4"


@pytest.mark.parametrize(
    "endpoints, info_status, expected",
    [
        (["/v0.4/traces", "/v0.5/traces"], 200, "v0.5"),
        (["/v0.4/traces"], 200, "v0.4"),
        (["/v0.4/traces", "/v0.5/traces", "/v1.0/traces"], 200, "v1.0" if HAS_V1 else "v0.5"),
        ([], 404, "v0.4"),  # an agent from before /info
    ],
)
def test_auto_version_from_info(writers, endpoints, info_status, expected):
    with FaultServer(endpoints) as server:
        server.info_status = info_status
        writer = writers(server.url)
        written = [make_trace() for _ in range(10)]
        for trace in written:
            writer.write(trace)
        assert writer.flush(timeout=10)
        stats = ledger_balances(writer)
        assert stats["version"] == expected
        if expected != "v1.0":
            assert stats["traces_sent"] == 10
            assert set(server.requests) == {"/%s/traces" % expected}
            delivered_exactly_once(server, writer, [t[0]["trace_id"] for t in written])


def test_fixed_version_not_installed_is_refused():
    if HAS_V1:
        pytest.skip("the installed encoder writes v1.0")
    with pytest.raises(ValueError):
        AgentWriter("http://127.0.0.1:1", version="v1.0")
    with pytest.raises(ValueError):
        AgentWriter("http://127.0.0.1:1", version="v0.6")


# -- transport ------------------------------------------------------------------


def test_headers_and_a_kept_alive_connection(server, writers):
    writer = writers(server.url, version="v0.4")
    for _ in range(3):
        writer.write(make_trace())
        writer.write(make_trace())
        assert writer.flush(timeout=10)
    assert server.connections == 1  # three payloads, one connection
    assert [len(p.traces) for p in server.accepted] == [2, 2, 2]
    headers = server.accepted[0].headers
    assert headers["content-type"] == "application/msgpack"
    assert headers["x-datadog-trace-count"] == "2"
    assert headers["datadog-meta-lang"] == "python"
    assert headers["datadog-meta-lang-version"]
    assert headers["datadog-meta-lang-interpreter"]
    assert headers["datadog-meta-tracer-version"] == "spanpack-" + spanpack.__version__
    stats = ledger_balances(writer)
    assert stats["payloads_sent"] == 3
    assert stats["bytes_sent"] == sum(p.size for p in server.accepted)


def test_agent_url_from_env(tmp_path, monkeypatch):
    env = transport.agent_url_from_env
    assert env({"DD_TRACE_AGENT_URL": "unix:///x.sock", "DD_AGENT_HOST": "h"}) == "unix:///x.sock"
    assert env({"DD_AGENT_HOST": "agent"}) == "http://agent:8126"
    assert env({"DD_TRACE_AGENT_PORT": "9000"}) == "http://localhost:9000"
    assert env({"DD_AGENT_HOST": "::1", "DD_TRACE_AGENT_PORT": "1"}) == "http://[::1]:1"
    sock = tmp_path / "apm.socket"
    sock.write_bytes(b"")
    monkeypatch.setattr(transport, "DEFAULT_AGENT_SOCKET", str(sock))
    assert env({}) == "unix://" + str(sock)
    monkeypatch.setattr(transport, "DEFAULT_AGENT_SOCKET", str(tmp_path / "absent"))
    assert env({}) == "http://localhost:8126"
    with pytest.raises(ValueError):
        AgentWriter("ftp://127.0.0.1:1")


# -- faults -----------------------------------------------------------------------


def _write_n(writer, n, spans=1):
    traces = [make_trace(spans) for _ in range(n)]
    for trace in traces:
        writer.write(trace)
    return [trace[0]["trace_id"] for trace in traces]


def test_refused_connections_are_retried_then_counted(writers):
    holder, url = refusing_url()
    with holder:
        writer = writers(url, version="v0.4", max_attempts=3)
        _write_n(writer, 7)
        started = time.monotonic()
        assert writer.flush(timeout=10)
        assert time.monotonic() - started < 5
    stats = ledger_balances(writer)
    assert drops(stats) == {"retries_exhausted": 7}
    assert stats["retries"] == 2


@pytest.mark.parametrize("failure", [("status", 500), ("status", 503), ("status", 429), ("status", 408)])
def test_failures_before_acceptance_are_retried_without_duplicates(server, writers, failure):
    server.script.extend([failure, failure])
    writer = writers(server.url, version="v0.5")
    ids = _write_n(writer, 10)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == 10 and stats["retries"] == 2
    assert stats["traces_sent_unconfirmed"] == 0
    assert sorted(server.accepted_ids()) == ids
    delivered_exactly_once(server, writer, ids)


def test_a_reset_before_the_body_is_read_is_retried_or_unconfirmed(server, writers):
    # Whether the reset comes before the client has handed the whole body to
    # its kernel depends on timing: either way the ledger says which it was.
    server.script.append("reset_before_body")
    writer = writers(server.url, version="v0.4")
    ids = _write_n(writer, 5)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == 5 and server.received_ids() == sorted(server.accepted_ids())
    if stats["traces_sent_unconfirmed"]:
        assert stats["traces_sent_unconfirmed"] == 5 and stats["retries"] == 0 and server.accepted == []
    else:
        assert stats["retries"] == 1 and sorted(server.accepted_ids()) == ids
    delivered_exactly_once(server, writer, ids)


NO_REPLY = ["reset_after_body", "close_after_body", "slow", "garbage", "truncated", "trickle"]
#: Of those, the ones that end at the request's deadline: the agent is still
#: reading or answering, so a resend would give it a second copy.
TIMED_OUT = {"slow", "trickle"}


@pytest.mark.parametrize("failure", NO_REPLY)
def test_at_most_once_no_reply_after_the_whole_body_is_unconfirmed_and_not_resent(server, writers, failure):
    # Once the whole request is out, the agent may have it whatever comes
    # back: it is counted sent (unconfirmed), never dropped and never resent.
    server.script.append(failure)
    writer = writers(server.url, version="v0.4", timeout=0.5, delivery="at-most-once")
    ids = _write_n(writer, 5)
    assert writer.flush(timeout=10)
    server.release()
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == stats["traces_sent_unconfirmed"] == 5
    assert stats["retries"] == 0 and stats["traces_resent"] == 0 and server.requests == ["/v0.4/traces"]
    assert sorted(server.received_ids()) == ids  # once
    later = _write_n(writer, 2)  # the writer goes on with a new connection
    assert writer.flush(timeout=10)
    assert sorted(server.accepted_ids()) == sorted(later)
    assert ledger_balances(writer)["traces_sent"] == 7


@pytest.mark.parametrize("failure", NO_REPLY)
def test_at_least_once_resends_what_got_no_reply_unless_the_deadline_ended_it(server, writers, failure):
    server.script.append(failure)
    writer = writers(server.url, version="v0.4", timeout=0.5)  # at-least-once: the default
    ids = _write_n(writer, 5)
    assert writer.flush(timeout=10)
    server.release()
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == 5 and not drops(stats)
    if failure in TIMED_OUT:  # as at-most-once
        assert stats["traces_sent_unconfirmed"] == 5 and stats["traces_resent"] == 0
        assert stats["retries"] == 0 and sorted(server.received_ids()) == ids and server.accepted == []
    else:  # read whole twice, answered the second time
        assert stats["traces_sent_unconfirmed"] == 0 and stats["traces_resent"] == 5 and stats["retries"] == 1
        assert sorted(server.received_ids()) == sorted(ids * 2) and sorted(server.accepted_ids()) == ids
        assert server.requests == ["/v0.4/traces"] * 2


def test_at_least_once_gives_up_after_max_attempts_and_counts_unconfirmed(server, writers):
    """Every attempt read whole and closed: the traces may be at the agent
    (several times), so they end unconfirmed, not dropped."""
    server.rule = lambda path, payload: "close_after_body"
    writer = writers(server.url, version="v0.4", max_attempts=3)
    ids = _write_n(writer, 4)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == stats["traces_sent_unconfirmed"] == 4 and not drops(stats)
    assert stats["traces_resent"] == 8 and stats["retries"] == 2
    assert sorted(server.received_ids()) == sorted(ids * 3)


def test_at_least_once_a_refusal_after_an_unanswered_attempt_is_not_a_drop(server, writers):
    """The first copy may be at the agent, so a 500s on the resends do not
    make the traces dropped; a 413 on the resend splits, and the halves are
    resends too."""
    server.script.extend(["reset_after_body", ("status", 413)])
    writer = writers(server.url, version="v0.5")
    ids = _write_n(writer, 6)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == 6 and stats["traces_sent_unconfirmed"] == 0 and not drops(stats)
    assert stats["traces_resent"] == 6 + 6  # the whole payload once, then its two halves
    assert sorted(server.accepted_ids()) == ids and len(server.accepted) == 2
    server.rule = lambda path, payload: ("status", 503)
    server.script.append("close_after_body")
    later = _write_n(writer, 3)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["traces_sent_unconfirmed"] == 3 and not drops(stats)
    assert sorted(server.received_ids()).count(later[0]) == writer.max_attempts


def test_delivery_is_checked():
    with pytest.raises(ValueError, match="delivery must be"):
        AgentWriter("http://127.0.0.1:1", delivery="exactly-once")


def test_retries_are_bounded(server, writers):
    server.rule = lambda path, payload: ("status", 500)
    writer = writers(server.url, version="v0.4", max_attempts=3)
    _write_n(writer, 4)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert drops(stats) == {"retries_exhausted": 4}
    assert len(server.requests) == 3 and stats["retries"] == 2


@pytest.mark.parametrize("status", [400, 403])
def test_other_client_errors_are_not_retried(server, writers, status):
    server.script.append(("status", status))
    writer = writers(server.url, version="v0.4")
    _write_n(writer, 3)
    assert writer.flush(timeout=10)
    ids = _write_n(writer, 2)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert drops(stats) == {"agent_refused": 3}
    assert stats["retries"] == 0 and len(server.requests) == 2
    assert sorted(server.accepted_ids()) == ids


def test_413_splits_the_payload(server, writers):
    # More than 3 traces is too large; one trace of 4 spans on its own is too.
    def rule(path, payload):
        if len(payload.traces) > 3 or any(spans == 4 for _, spans in payload.traces):
            return ("status", 413)
        return None

    server.rule = rule
    writer = writers(server.url, version="v0.5")
    ids = _write_n(writer, 10)
    too_large = _write_n(writer, 1, spans=4)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == 10
    assert drops(stats) == {"trace_too_large": 1}
    assert all(len(p.traces) <= 3 for p in server.accepted)
    assert too_large[0] not in server.accepted_ids()
    delivered_exactly_once(server, writer, ids)


@pytest.mark.parametrize("status", [404, 415])
def test_refused_version_downgrades_and_reencodes(writers, status):
    with FaultServer(["/v0.4/traces", "/v0.5/traces"]) as server:
        server.rule = lambda path, payload: ("status", status) if path == "/v0.5/traces" else None
        writer = writers(server.url, version="v0.5")
        ids = _write_n(writer, 12, spans=2)
        assert writer.flush(timeout=10)
        stats = ledger_balances(writer)
        assert stats["version"] == "v0.4" and stats["traces_sent"] == 12
        assert server.requests == ["/v0.5/traces", "/v0.4/traces"]
        assert sorted(server.accepted_ids()) == ids
        delivered_exactly_once(server, writer, ids)


def test_a_downgrade_reencodes_what_was_buffered_meanwhile(server, writers):
    refused, release = threading.Event(), threading.Event()

    def rule(path, payload):
        if path == "/v0.5/traces":
            refused.set()
            release.wait(10)  # hold the answer while the test writes more
            return ("status", 404)
        return None

    server.rule = rule
    writer = writers(server.url, version="v0.5")
    in_flight = _write_n(writer, 3)
    writer.flush(timeout=0)
    assert refused.wait(10)
    buffered = _write_n(writer, 4)  # encoded as v0.5 while that payload is out
    release.set()
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["version"] == "v0.4" and stats["traces_sent"] == 7
    assert server.requests == ["/v0.5/traces", "/v0.4/traces", "/v0.4/traces"]
    assert sorted(server.accepted_ids()) == in_flight + buffered
    delivered_exactly_once(server, writer, in_flight + buffered)


def test_a_refusal_after_acceptance_still_downgrades(server, writers):
    writer = writers(server.url, version="v0.5")
    first = _write_n(writer, 3)
    assert writer.flush(timeout=10)
    server.rule = lambda path, payload: ("status", 404) if path == "/v0.5/traces" else None
    later = _write_n(writer, 4)  # the agent was replaced by one without v0.5
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["version"] == "v0.4" and stats["traces_sent"] == 7
    assert server.requests == ["/v0.5/traces", "/v0.5/traces", "/v0.4/traces"]
    delivered_exactly_once(server, writer, first + later)


def test_server_stopped_and_restarted_mid_run(server, writers):
    writer = writers(server.url, version="v0.4", flush_interval=0.02, max_attempts=2)
    before = _write_n(writer, 20)
    assert writer.flush(timeout=10)
    server.stop()
    during = _write_n(writer, 20)
    assert writer.flush(timeout=10)  # refused twice: counted
    server.start()
    after = _write_n(writer, 20)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == 40, stats
    assert drops(stats) == {"retries_exhausted": 20}
    assert sorted(server.accepted_ids()) == before + after
    assert not set(during) & set(server.received_ids())
    delivered_exactly_once(server, writer, before + during + after)


def test_writes_keep_flowing_while_the_server_restarts(server, writers):
    """Producers never stop; whatever the timing, the ledger balances."""
    writer = writers(server.url, version="v0.5", flush_interval=0.01, max_attempts=3)
    written = []
    stop = threading.Event()

    def produce():
        for _ in range(100_000):  # bounded; stopped by the event
            if stop.is_set():
                return
            written.extend(_write_n(writer, 1))
            time.sleep(0.0005)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        assert server.wait_for(lambda: len(server.accepted) >= 3)
        server.stop()
        time.sleep(0.05)  # producers run on while nothing listens
        server.start()
        count = len(server.accepted)
        assert server.wait_for(lambda: len(server.accepted) >= count + 3)
    finally:
        stop.set()
        producer.join(10)
    assert writer.stop(timeout=10)
    stats = ledger_balances(writer)
    assert stats["traces_written"] == len(written)
    delivered_exactly_once(server, writer, written)


# -- accounting at write() --------------------------------------------------------


def test_drops_at_write_are_counted_and_logged_once_per_interval(server, writers, caplog):
    caplog.set_level(logging.WARNING, logger="spanpack.writer")
    server.script.append("slow")
    # The encoder's bytes get 1/8 of max_buffer_size (the rest is for the kept objects).
    writer = writers(server.url, version="v0.4", timeout=0.3, max_payload_size=600, max_buffer_size=8 * 1500)
    writer._log_interval = 3600.0
    written = _write_n(writer, 1)
    writer.flush(timeout=0)
    # The first payload hangs at the server, so nothing drains the buffer meanwhile.
    assert server.wait_for(lambda: len(server.requests) == 1)
    written += _write_n(writer, 15)  # ~100 bytes each: the buffer takes about 14
    written += _write_n(writer, 1, spans=8)  # over max_payload_size
    writer.write([{"trace_id": "nope"}])  # bad_input
    writer.write(None)  # bad_input
    reasons = writer.stats["dropped_by_reason"]
    assert reasons["trace_too_large"] == 1 and reasons["bad_input"] == 2
    assert reasons["buffer_full"] >= 1

    def lines():
        return [r.getMessage() for r in caplog.records if r.name == "spanpack.writer"]

    # The flush thread logs (write() does not: logging takes locks), once the
    # hung request has ended: one line, then nothing until the interval or stop().
    for _ in range(1000):  # (at most 10 s)
        if lines():
            break
        time.sleep(0.01)
    assert len(lines()) == 1 and "bad_input" in lines()[0]
    writer.write([{"trace_id": 1.5}])  # bad_input, held back
    assert writer.stop(timeout=10)
    server.release()
    stats = ledger_balances(writer)
    assert stats["traces_written"] == 20
    assert stats["traces_sent"] + reasons["buffer_full"] == 16
    assert stats["traces_sent_unconfirmed"] == 1  # the first payload: sent, never answered
    assert len(lines()) == 2  # stop() says what the interval held back
    assert "1 bad_input" in lines()[1] and "TypeError" in lines()[1]
    total_logged = sum(int(line.split(" dropped ")[1].split(" ")[0]) for line in lines())
    assert total_logged == stats["traces_dropped"]
    writer.write(make_trace())
    assert ledger_balances(writer)["dropped_by_reason"]["stopped"] == 1
    delivered_exactly_once(server, writer, written)


def test_flush_timeout_and_stop_with_a_hung_agent(server, writers):
    server.rule = lambda path, payload: "slow"
    writer = writers(server.url, version="v0.4", timeout=5.0)
    _write_n(writer, 6)
    assert writer.flush(timeout=0.2) is False
    started = time.monotonic()
    assert writer.stop(timeout=0.5) in (True, False)  # the request ends at stop()'s deadline too
    assert time.monotonic() - started < 1.5
    server.release()
    # The thread gives up on the released request later: that must not count again.
    for _ in range(1000):  # (at most 10 s)
        if writer._running is None:
            break
        time.sleep(0.01)
    assert writer._running is None
    stats = ledger_balances(writer)
    # The payload went out whole: it may have arrived, so it is not "stopped".
    assert stats["traces_sent"] == stats["traces_sent_unconfirmed"] == 6
    assert drops(stats) == {}
    assert server.accepted_ids() == [] and len(server.received_ids()) == 6


def test_flush_with_nothing_written_is_immediate(writers):
    holder, url = refusing_url()
    with holder:
        writer = writers(url)
        assert writer.flush(timeout=0) is True
        assert writer.stop(timeout=0) is True
        assert writer.stats["traces_written"] == 0


# -- processes ---------------------------------------------------------------------


def _run_python(code, timeout=60):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_fork_child_starts_empty_and_nothing_is_sent_twice(server):
    code = """
        import json, os, sys, spanpack
        from tests.integration.test_writer import make_trace
        import tests.integration.test_writer as test_writer, itertools
        writer = spanpack.AgentWriter(%r, version="v0.4", flush_interval=60.0)
        def write(first, n):
            test_writer._ids = itertools.count(first)
            for _ in range(n):
                writer.write(make_trace())
        write(1, 5)
        writer.flush(10)            # the thread and connection exist before the fork
        write(100, 7)               # buffered in the parent at the fork
        pid = os.fork()
        if pid == 0:
            write(1000, 3)
            ok = writer.stop(10)
            print(json.dumps(["child", ok, writer.stats]), flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        write(200, 2)
        ok = writer.stop(10)
        print(json.dumps(["parent", ok, writer.stats, status]), flush=True)
    """ % (server.url,)
    result = _run_python(code)
    assert result.returncode == 0, result.stderr
    reports = {line[0]: line for line in map(json.loads, result.stdout.splitlines())}
    _, child_ok, child = reports["child"]
    _, parent_ok, parent, status = reports["parent"]
    assert child_ok and parent_ok and status == 0
    assert child["traces_written"] == child["traces_sent"] == 3
    assert parent["traces_written"] == parent["traces_sent"] == 14
    accepted = server.accepted_ids()
    assert sorted(accepted) == [1, 2, 3, 4, 5, 100, 101, 102, 103, 104, 105, 106, 200, 201, 1000, 1001, 1002]
    assert not server.errors


def test_exit_flushes_without_stop(agent_session):
    code = """
        import spanpack
        from tests.integration.test_writer import make_trace
        writer = spanpack.AgentWriter(%r, version="v0.5", flush_interval=60.0)
        for _ in range(25):
            writer.write(make_trace(2))
    """ % (agent_session.base_url,)
    result = _run_python(code)
    assert result.returncode == 0, result.stderr
    received = agent_session.traces()
    assert sorted(trace[0]["trace_id"] for trace in received) == list(range(1, 26))
    assert all(len(trace) == 2 for trace in received)


@pytest.mark.parametrize("agent", ["refused", "hung"])
def test_exit_with_the_agent_down_is_bounded(server, agent):
    holder, refused = refusing_url()
    if agent == "hung":
        server.rule = lambda path, payload: "slow"
    url = refused if agent == "refused" else server.url
    code = """
        import atexit, json, time
        started = []
        # Registered before spanpack is imported, so it runs after spanpack's exit hook.
        atexit.register(lambda: print(json.dumps([time.monotonic() - started[0], writer.stats])))
        import spanpack
        from tests.integration.test_writer import make_trace
        writer = spanpack.AgentWriter(%r, version="v0.4", timeout=0.5, max_attempts=10)
        for _ in range(10):
            writer.write(make_trace())
        started.append(time.monotonic())
    """ % (url,)
    with holder:
        begun = time.monotonic()
        result = _run_python(code)
        elapsed = time.monotonic() - begun
    server.release()
    assert result.returncode == 0, result.stderr
    exit_time, stats = json.loads(result.stdout)
    assert exit_time < 0.5 + 1.0  # the writer's timeout, and a margin for a busy machine
    assert stats["traces_written"] == 10 and stats["traces_buffered"] == 0
    if agent == "refused":
        assert stats["traces_sent"] == 0 and stats["traces_dropped"] == 10
        assert set(drops(stats)) <= {"stopped", "retries_exhausted"}
        assert "dropped 10 traces" in result.stderr
    else:  # the hung agent read the payload: it may have it
        assert stats["traces_sent"] == stats["traces_sent_unconfirmed"] == 10
    assert elapsed < 30


def test_the_public_surface_is_typed_inline():
    """spanpack.writer has no stub: type checkers read writer.py itself (py.typed),
    so every public function and method must be annotated in full."""
    import inspect

    import spanpack.writer as module

    assert not os.path.exists(os.path.join(os.path.dirname(spanpack.__file__), "writer.pyi"))
    functions = {"AgentWriter." + name: member for name, member in vars(AgentWriter).items()
                 if not name.startswith("_") or name == "__init__"}
    functions.update({name: member for name, member in vars(module).items()
                      if inspect.isfunction(member) and not name.startswith("_")
                      and member.__module__ == module.__name__})
    assert "AgentWriter.write" in functions and "supported_versions" in functions
    for name, member in functions.items():
        function = member.fget if isinstance(member, property) else member
        signature = inspect.signature(function)
        unannotated = [p.name for p in list(signature.parameters.values())[int("." in name):]
                       if p.annotation is inspect.Parameter.empty]
        assert not unannotated, (name, unannotated)
        assert signature.return_annotation is not inspect.Signature.empty, name
    assert "AgentWriter" in spanpack.__all__ and spanpack.AgentWriter is AgentWriter


# -- the intake: what write() is, in C ------------------------------------------------


class _WritesWhileRead:
    """A span whose ``service`` getter writes another trace into the same intake."""

    trace_id, span_id, name, start_ns = 1, 1, "op", 0

    def __init__(self, intake, nested):
        self.intake, self.nested = intake, nested

    @property
    def service(self):
        if self.nested:
            self.nested.pop()
            self.intake._put_counted([{"trace_id": 2, "span_id": 1, "name": "inner", "start_ns": 0,
                                       "service": "s" * 60}])
        return "s" * 60


@pytest.mark.parametrize("version", ["v0.4", "v0.5"] + (["v1.0"] if HAS_V1 else []))
def test_the_intake_keeps_each_trace_object_with_its_payload_and_counts_every_outcome(version):
    intake = spanpack.TraceMsgPackEncoder(version, max_size=4000, max_payload_size=600)
    intake._start_intake(300)
    traces = [make_trace(1 + i % 2) for i in range(40)]
    answers = [intake._put_counted(trace) for trace in traces]
    taken = [trace for trace, answer in zip(traces, answers) if answer in (0, 1)]
    assert answers.count(1) == 1 and set(answers) <= {0, 1, 2}  # woken once; then buffer_full
    assert intake._put_counted(None) == 4 and intake._put_counted([{"trace_id": "x"}]) == 4  # bad input
    assert "TypeError" in intake._take_last_error() and intake._take_last_error() is None
    with pytest.raises(KeyboardInterrupt):
        intake._put_counted([_InterruptingSpan()])
    assert intake._intake_counts() == (len(taken), answers.count(2), 0, 2, 1, 0)
    payloads = intake.encode()
    assert [trace for _, _, kept in payloads for trace in kept] == taken  # the objects, in order
    assert all(len(kept) == n for _, n, kept in payloads) and len(payloads) > 1
    for payload, _, kept in payloads:  # each payload is its traces' encoding
        assert payload == intake.encode_traces(kept)
    assert intake._intake_counts()[0] == 0 and intake._intake_counts()[1:] == (answers.count(2), 0, 2, 1, 0)
    # Span code that writes into the same intake while its trace is encoded.
    nested = [1, 1, 1]
    for _ in range(4):
        assert intake._put_counted([_WritesWhileRead(intake, nested)]) in (0, 1)
    kept = [trace for _, n, kept in intake.encode() for trace in kept]
    assert len(kept) == 7 and intake._intake_counts()[0] == 0
    intake._close_intake()
    assert intake._put_counted(make_trace()) == 6 and intake._intake_counts()[5] == 1 and len(intake) == 0


def test_an_intake_is_made_only_of_an_empty_encoder():
    encoder = spanpack.TraceMsgPackEncoder("v0.4")
    with pytest.raises(TypeError, match="_start_intake"):
        encoder._put_counted(make_trace())
    encoder.put(make_trace())
    with pytest.raises(ValueError, match="traces buffered"):
        encoder._start_intake(0)
    assert [len(entry) for entry in encoder.encode()] == [2]  # a plain encoder's encode() is unchanged


class _InterruptingSpan:
    trace_id, span_id, name, start_ns = 1, 1, "op", 0

    @property
    def service(self):
        raise KeyboardInterrupt
