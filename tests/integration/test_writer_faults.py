"""AgentWriter regressions from issue 19, each against the fault-injecting server.

Each test failed on the writer before the issue was fixed: a signal handler
between two steps of write(), BaseExceptions from span code and from
on_response, unbounded and trickled replies, /info of odd shapes, v1.0 payload
fields with an older agent (dropped, then left out: now carried as tags), a
slow agent, DD_* values.
"""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import msgpack
import pytest

from spanpack.writer import DROP_REASONS, AgentWriter, supported_versions

from tests.integration.fault_server import FaultServer
from tests.integration import test_writer
from tests.integration.test_writer import ROOT, _write_n, drops, ledger_balances, make_trace
from tests.support import resolved_traces

writers = test_writer.writers  # the fixture: writers made here are stopped at the end of each test

HAS_V1 = "v1.0" in supported_versions()


@pytest.fixture
def server():
    with FaultServer() as srv:
        yield srv


class Interrupt(Exception):
    pass


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")
def test_a_signal_handler_raising_inside_write_keeps_the_ledger(server, writers):
    """An exception from a signal handler, at whatever point of write() the
    timer fires, leaves every trace in exactly one count and the thread alive."""
    fired = []
    armed = [False]  # the handler raises only while armed: never outside the try block below

    def on_alarm(signum, frame):
        fired.append(1)
        if armed[0]:
            armed[0] = False
            raise Interrupt()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    writer = writers(server.url, version="v0.4", flush_interval=0.05, timeout=20.0)
    big = [
        {"trace_id": 1, "span_id": i + 1, "name": "n", "service": "s", "start_ns": i, "meta": {"k": "v%d" % i}}
        for i in range(3000)
    ]
    raised = []
    try:
        import time

        started = time.perf_counter()
        for _ in range(3):
            writer.write(big)
        per_write = (time.perf_counter() - started) / 3
        assert writer.flush(timeout=10)
        for attempt in range(60):  # the timer lands at a different point each time
            # One try holds the write and the wait for a late alarm: between
            # two try blocks the interpreter checks for signals, so a raise
            # there would escape the test.  The handler raises once an arming.
            armed[0] = True
            returned = False
            try:
                signal.setitimer(signal.ITIMER_REAL, per_write * (0.1 + 0.9 * (attempt % 11) / 11))
                writer.write(big)
                returned = True
                for _ in range(5000):  # a late alarm fires here, outside write() (at most 5 s)
                    if not armed[0]:
                        break
                    time.sleep(0.001)
                armed[0] = False
            except Interrupt:
                if not returned:  # (or raised just after it returned: the bound below allows both)
                    raised.append(attempt)
            signal.setitimer(signal.ITIMER_REAL, 0)
        assert fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    ids = _write_n(writer, 20)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["writer_errors"] == 0 and stats["thread_starts"] == 1
    taken = stats["traces_written"]
    # Each write() is counted once; only one the handler interrupted before
    # the trace reached the encoder may be in no count (it raised).
    assert 3 + 60 + 20 - len(raised) <= taken <= 3 + 60 + 20, stats
    # Every trace counted sent arrived; the 20 ordinary ones among them.
    assert stats["traces_sent"] == len(server.accepted_ids()) and stats["traces_sent_unconfirmed"] == 0
    assert set(ids) <= set(server.accepted_ids())


#: Raises of the random-offset signal test; scale down under emulation (.ci/run).
SIGNAL_RAISES = int(os.environ.get("SPANPACK_SIGNAL_RAISES", "3000"))


def _until_alarm(armed, call):
    # (a loop of its own: CPython 3.13.0 let a signal's exception raised at
    # the back edge of a loop ending a try body escape that try)
    while armed[0]:
        call()


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")
def test_signal_handlers_raising_at_random_offsets_in_every_public_method(server, writers):
    """A one-shot timer fires at a random offset (seeded) while write(),
    flush(), stats or stop() runs in a loop, and its handler raises: a few
    thousand raises, each landing somewhere inside one of those calls.  The
    application side holds no lock and counts in the same C call that takes
    the trace, so whatever the offset: every completed write() is counted
    once (one that raised at most once), a reader on another thread never
    sees a count go backwards (no trace in two counts, or none, half-way
    through a move), flush() still settles everything, the same flush thread
    runs throughout, and stop() still stops it."""
    assert threading.current_thread() is threading.main_thread()
    rng = random.Random(32)
    writer = writers(server.url, version="v0.4", flush_interval=0.005, max_payload_size=64 << 10)
    small = make_trace(1)
    big = make_trace(40)  # a put long enough for the alarm to fall due inside it
    armed = [False]
    counts = {"started": 0, "completed": 0}

    def on_alarm(signum, frame):
        if armed[0]:
            armed[0] = False
            raise Interrupt()

    def write():
        counts["started"] += 1
        writer.write(small if counts["started"] % 4 else big)
        counts["completed"] += 1

    backwards = []
    reading = [True]

    def read_stats():  # another thread: each snapshot whole, the monotonic counts never going back
        last = writer.stats
        for _ in range(10_000_000):
            if not reading[0]:
                return
            now = writer.stats
            for key in ("traces_written", "traces_sent", "traces_dropped"):
                if now[key] < last[key]:
                    backwards.append((key, last[key], now[key]))
            if now["traces_written"] != now["traces_sent"] + now["traces_dropped"] + now["traces_buffered"]:
                backwards.append(("identity", now))
            last = now
            time.sleep(0.0005)

    calls = [write, write, write, lambda: writer.stats, lambda: writer.flush(timeout=0.02)]
    write()  # the flush thread starts
    assert writer.flush(timeout=20)
    thread = writer._thread
    reader = threading.Thread(target=read_stats)
    # A handler that runs inside a finalizer (a garbage collection during a
    # call can run one, on any object's behalf) raises there, and Python
    # reports that as unraisable instead: such a raise reaches no caller.
    finalizer_raises = []
    previous_hook = sys.unraisablehook

    def unraisable(report):
        if report.exc_type is Interrupt:
            finalizer_raises.append(report)
        else:
            previous_hook(report)  # anything else as pytest reports it

    sys.unraisablehook = unraisable
    previous = signal.signal(signal.SIGALRM, on_alarm)
    raised = other = returned = 0
    reader.start()
    try:
        for attempt in range(SIGNAL_RAISES + SIGNAL_RAISES // 10):
            call = rng.choice(calls) if attempt < SIGNAL_RAISES else (lambda: writer.stop(timeout=10))
            try:
                armed[0] = True
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.000002, 0.00008))
                _until_alarm(armed, call)
                returned += 1  # the handler ran, and its raise did not come back
            except Interrupt:
                raised += 1
            except Exception:  # what a raise inside threading's own code makes of it
                other += 1
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            if attempt == SIGNAL_RAISES - 1:  # before the stop() rounds: the thread still runs and delivers
                assert writer.flush(timeout=30), writer.stats
                assert writer._thread is thread and writer._running is thread
                fresh = _write_n(writer, 20)
                assert writer.flush(timeout=30)
                assert set(fresh) <= set(server.accepted_ids())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sys.unraisablehook = previous_hook
        reading[0] = False
        reader.join(30)
    # Every raise came back to its caller, but those a finalizer took (no
    # call of the writer's ever swallows one).
    assert returned == len(finalizer_raises), (returned, finalizer_raises)
    assert raised + other + returned == SIGNAL_RAISES + SIGNAL_RAISES // 10, (raised, other, returned)
    assert other + returned <= raised // 10, (raised, other, returned)
    assert writer.stop(timeout=30)
    assert not backwards, backwards[:5]
    stats = ledger_balances(writer)
    # A write() the handler interrupted is counted if its trace was taken, else not.
    assert counts["completed"] + 20 <= stats["traces_written"] <= counts["started"] + 20, (counts, stats)
    assert stats["writer_errors"] == 0 and stats["thread_starts"] == 1, stats
    # Everything written before stop() was sent (the server answers every
    # request), and what the server accepted is exactly what was counted sent.
    assert stats["traces_sent"] == len(server.accepted_ids()) and stats["traces_sent_unconfirmed"] == 0
    assert drops(stats).keys() <= {"stopped", "buffer_full"}, stats  # (writes outpace the thread now and then)
    assert writer._running is None


def test_no_lock_is_taken_on_the_application_side(server, writers, monkeypatch):
    """write(), flush(), stats and stop() never acquire a Python lock on the
    calling thread (a signal handler raising there could leave it held):
    every lock made while the writer exists is watched."""
    acquired = []
    real_lock, real_rlock = threading.Lock, threading.RLock

    class Watched:
        def __init__(self, lock):
            self._inner = lock

        def acquire(self, *args, **kwargs):
            if threading.current_thread() is threading.main_thread():
                acquired.append(self)
            return self._inner.acquire(*args, **kwargs)

        def release(self):
            return self._inner.release()

        __enter__ = acquire

        def __exit__(self, *exc_info):
            self._inner.release()

        def locked(self):
            return self._inner.locked()

    monkeypatch.setattr(threading, "Lock", lambda: Watched(real_lock()))
    monkeypatch.setattr(threading, "RLock", lambda: Watched(real_rlock()))
    writer = writers(server.url, version="v0.4")
    monkeypatch.undo()  # (the fixture and the server make locks of their own)
    ids = _write_n(writer, 5)
    writer.stats
    assert writer.flush(timeout=10)
    assert writer.stop(timeout=10)
    writer.write(make_trace())  # refused: stopped
    assert acquired == []
    assert sorted(server.accepted_ids()) == ids


class _Span:
    def __init__(self, interrupt):
        self.trace_id, self.span_id, self.name, self.start_ns = 7, 1, "n", 0
        self.interrupt = interrupt

    @property
    def service(self):
        if self.interrupt:
            raise self.interrupt
        return "svc"


@pytest.mark.parametrize("exception", [KeyboardInterrupt, SystemExit])
def test_a_base_exception_from_span_code_is_counted_and_propagates(server, writers, exception):
    writer = writers(server.url, version="v0.4")
    writer.write([_Span(None)])
    with pytest.raises(exception):
        writer.write([_Span(exception)])
    writer.write([_Span(None)])
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["traces_written"] == 3 and stats["traces_sent"] == 2
    assert drops(stats) == {"interrupted": 1}


@pytest.mark.parametrize("exception", [SystemExit, KeyboardInterrupt, RecursionError])
def test_on_response_raising_anything_leaves_the_batch_sent(server, writers, exception):
    def on_response(reply):
        raise exception()

    writer = writers(server.url, version="v0.4", on_response=on_response, max_payload_size=400)
    ids = _write_n(writer, 12)  # several payloads in one batch
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == 12 and stats["payloads_sent"] > 1
    assert stats["on_response_errors"] == stats["payloads_sent"]
    assert sorted(server.accepted_ids()) == ids
    later = _write_n(writer, 2)
    assert writer.flush(timeout=10)
    assert set(later) <= set(server.accepted_ids()) and writer.stats["thread_starts"] == 1


def test_deeply_nested_json_in_a_reply_leaves_the_batch_sent(server, writers):
    replies = []
    server.rule = lambda path, payload: "deep_json"
    writer = writers(server.url, version="v0.4", on_response=replies.append, max_payload_size=400)
    ids = _write_n(writer, 12)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == 12 and stats["payloads_sent"] > 1 and replies == []
    assert sorted(server.accepted_ids()) == ids


@pytest.mark.parametrize("where", ["traces", "info"])
def test_an_endless_reply_is_refused_after_the_cap(server, writers, where):
    if where == "info":
        server.info_body = b"[" * (2 << 20)  # over 1 MiB: no information
        writer = writers(server.url)  # auto: asks /info
    else:
        server.rule = lambda path, payload: "huge"
        writer = writers(server.url, version="v0.4")
    ids = _write_n(writer, 3)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == 3 and stats["replies_too_large"] == 1
    assert stats["version"] == "v0.4"
    assert sorted(server.accepted_ids()) == ids


def test_a_trickled_reply_ends_at_the_request_deadline(server, writers):
    server.script.append("trickle")
    writer = writers(server.url, version="v0.4", timeout=0.5, max_attempts=2)
    ids = _write_n(writer, 2)
    # The request ends at its deadline however the bytes come, so flush()
    # returns; before, each byte renewed the per-read timeout and it hung.
    assert writer.flush(timeout=20)
    server.release()
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == stats["traces_sent_unconfirmed"] == 2
    later = _write_n(writer, 2)
    assert writer.flush(timeout=10)
    assert sorted(server.accepted_ids()) == later and sorted(server.received_ids()) == ids + later


@pytest.mark.parametrize(
    "info_body",
    [b'{"endpoints": 5}', b'{"endpoints": [["/v0.4/traces"]]}', b"[" * 100000 + b"]" * 100000, b"\xff\xfe",
     b'"just a string"', b'{"endpoints": {"a": []}}'],
)
def test_info_of_any_shape_is_at_worst_no_information(server, writers, info_body, caplog):
    server.info_body = info_body
    writer = writers(server.url)
    assert writer.version is None  # not known before /info answers
    for _ in range(3):
        writer.write(make_trace())
        assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == 3 and stats["version"] == "v0.4"
    assert set(server.requests) == {"/v0.4/traces"} and len(server.accepted_ids()) == 3


def test_version_is_none_until_known_and_stays_none_against_a_dead_agent(writers):
    from tests.integration.fault_server import refusing_url

    holder, url = refusing_url()
    with holder:
        writer = writers(url, max_attempts=1)
        assert writer.version is None and writer.stats["version"] is None
        writer.write(make_trace())
        assert writer.flush(timeout=10)
        assert writer.version is None
    assert writers  # the fixture stops it


V10_FIELDS = {
    "hostname": "web-1",
    "env": "prod",
    "app_version": "1.2.3",
    "runtime_id": "rt-42",
    "payload_attributes": {"_dd.git.commit.sha": "abc", "n": 7, "ratio": 0.5, "on": True, "off": False},
}
# What v0.4/v0.5 payloads carry them as: tags on every span.
CARRIED_META = {"_dd.hostname": "web-1", "env": "prod", "version": "1.2.3", "runtime-id": "rt-42",
                "_dd.git.commit.sha": "abc"}
CARRIED_METRICS = {"n": 7, "ratio": 0.5, "on": 1, "off": 0}


def span_tags(payload):
    """(meta, metrics) of every span of a v0.4 or v0.5 payload."""
    version = "v0.5" if payload.path == "/v0.5/traces" else "v0.4"
    traces = resolved_traces(version, payload.body)
    if version == "v0.4":
        return [(s.get("meta", {}), s.get("metrics", {})) for trace in traces for s in trace]
    return [(s[9], s[10]) for trace in traces for s in trace]


def assert_carried(payloads):
    spans = [tags for payload in payloads for tags in span_tags(payload)]
    assert spans
    for meta, metrics in spans:
        assert {k: meta.get(k) for k in CARRIED_META} == CARRIED_META
        assert {k: metrics.get(k) for k in CARRIED_METRICS} == CARRIED_METRICS
        assert meta["k"] == "v" and metrics["m"] == 1.5  # the spans' own tags, as written


@pytest.mark.skipif(not HAS_V1, reason="the installed encoder has no v1.0")
@pytest.mark.parametrize("endpoints, expected", [(["/v0.4/traces", "/v0.5/traces"], "v0.5"), (["/v0.4/traces"], "v0.4")])
def test_v1_0_fields_with_an_agent_without_v1_0(writers, endpoints, expected):
    """An auto writer with every v1.0 payload field, against an agent whose
    /info lists no v1.0: every trace is sent in the version the agent takes,
    the header fields as headers, the others as tags on every span."""
    with FaultServer(endpoints) as server:
        server.keep_bodies = True
        writer = writers(server.url, tracer_version="9.9.9", container_id="c-1", **V10_FIELDS)
        ids = []
        for _ in range(3):  # one batch at a time, as the reproducer did
            ids += _write_n(writer, 1, spans=2)
            assert writer.flush(timeout=10)
        stats = ledger_balances(writer)
        assert stats["version"] == expected and stats["traces_sent"] == 3 and not drops(stats)
        assert sorted(server.accepted_ids()) == ids
        assert server.requests == ["/%s/traces" % expected] * 3
        headers = server.accepted[0].headers
        assert headers["datadog-meta-tracer-version"] == "9.9.9" and headers["datadog-container-id"] == "c-1"
        assert_carried(server.accepted)


@pytest.mark.skipif(not HAS_V1, reason="the installed encoder has no v1.0")
def test_v1_0_fields_carried_after_a_404_for_v1_0(writers):
    """An agent that lists v1.0 but refuses it: the batch is re-encoded as
    v0.5, with the fields as tags."""
    with FaultServer(["/v0.4/traces", "/v0.5/traces", "/v1.0/traces"]) as server:
        server.keep_bodies = True
        server.rule = lambda path, payload: ("status", 404) if path == "/v1.0/traces" else None
        writer = writers(server.url, **V10_FIELDS)
        ids = _write_n(writer, 4, spans=2)
        assert writer.flush(timeout=10)
        stats = ledger_balances(writer)
        assert stats["version"] == "v0.5" and stats["traces_sent"] == 4
        assert server.requests == ["/v1.0/traces", "/v0.5/traces"]
        assert sorted(server.accepted_ids()) == ids
        assert_carried(server.accepted)


@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
def test_a_writer_fixed_to_v0_4_or_v0_5_carries_the_v1_0_fields(writers, version):
    with FaultServer() as server:
        server.keep_bodies = True
        writer = writers(server.url, version=version, **V10_FIELDS)
        ids = _write_n(writer, 2)
        assert writer.flush(timeout=10)
        assert ledger_balances(writer)["traces_sent"] == 2
        assert sorted(server.accepted_ids()) == ids
        assert_carried(server.accepted)


def test_empty_fields_are_left_out_as_v1_0_leaves_them_out():
    writer = AgentWriter("http://127.0.0.1:1", version="v0.4", hostname="", env="prod", flush_interval=60)
    try:
        encoder = writer._new_encoder("v0.4")
        (span,), = msgpack.unpackb(encoder.encode_traces([make_trace()]))
        assert "_dd.hostname" not in span["meta"] and span["meta"]["env"] == "prod"
    finally:
        writer.stop(timeout=1)


BAD_FIELDS = [
    ({"hostname": 5}, TypeError, r"^hostname must be str, not int"),
    ({"env": b"prod"}, TypeError, r"^env must be str, not bytes"),
    ({"runtime_id": "\ud800"}, ValueError, r"^runtime_id: not valid text"),
    ({"payload_attributes": ["x"]}, TypeError, r"^payload_attributes must be a mapping"),
    ({"payload_attributes": {1: "x"}}, TypeError, r"^payload_attributes keys must be str, not int"),
    ({"payload_attributes": {"x": [1]}}, TypeError, r"^payload_attributes\['x'\] must be str, bool, int or float"),
    ({"payload_attributes": {"x": 1 << 63}}, ValueError, r"^payload_attributes\['x'\] does not fit in int64"),
    ({"payload_attributes": {"x": "\udfff"}}, ValueError, r"^payload_attributes\['x'\]: not valid text"),
    ({"payload_attributes": {"_dd.origin": "x"}}, ValueError, r"^payload_attributes\['_dd.origin'\]: v0.4/v0.5 payloads write"),
    ({"env": "prod", "payload_attributes": {"env": "x"}}, ValueError,
     r"^payload_attributes\['env'\]: v0.4/v0.5 payloads carry env= as the tag 'env'"),
    ({"hostname": "h", "payload_attributes": {"_dd.hostname": "x"}}, ValueError,
     r"^payload_attributes\['_dd.hostname'\]: v0.4/v0.5 payloads carry hostname="),
    ({"default_meta": {"a": "b"}}, TypeError, r"^AgentWriter sets default_meta itself"),
    ({"default_metrics": {"a": 1}}, TypeError, r"^AgentWriter sets default_metrics itself"),
]


@pytest.mark.parametrize("version", ["auto", "v0.4", "v0.5"] + (["v1.0"] if HAS_V1 else []))
@pytest.mark.parametrize("options, error, message", BAD_FIELDS)
def test_bad_v1_0_field_values_fail_at_construction_naming_the_option(version, options, error, message):
    with pytest.raises(error, match=message):
        AgentWriter("http://127.0.0.1:1", version=version, **options)


@pytest.mark.skipif(not HAS_V1, reason="the installed encoder has no v1.0")
def test_the_tracer_version_goes_in_the_header_and_the_v1_0_payload(writers):
    from tests.v10_decoder import decode

    with FaultServer(["/v0.4/traces", "/v1.0/traces"]) as server:
        bodies = []
        server.rule = lambda path, payload: bodies.append(path) and None
        writer = writers(server.url, version="v1.0", tracer_version="1.2.3")
        writer.write(make_trace())
        assert writer.flush(timeout=10)
        assert server.accepted[0].headers["datadog-meta-tracer-version"] == "1.2.3"
    encoder = writer._new_encoder("v1.0")
    encoder.put(make_trace())
    (payload, _), = encoder.encode()
    assert decode(payload)[5] == "1.2.3"


def test_a_misspelt_option_is_a_type_error_from_agent_writer():
    with pytest.raises(TypeError, match="AgentWriter.*flush_intervall"):
        AgentWriter("http://127.0.0.1:1", flush_intervall=1.0)


def test_a_slow_agent_gets_the_payload_once_and_it_is_not_counted_dropped(server, writers):
    server.script.append("slow")
    writer = writers(server.url, version="v0.4", timeout=0.3)
    ids = _write_n(writer, 1)
    assert writer.flush(timeout=10)
    server.release()
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == stats["traces_sent_unconfirmed"] == 1 and stats["traces_dropped"] == 0
    assert server.received_ids() == ids and stats["retries"] == 0


def test_stop_without_timeout_is_bounded_against_a_hung_agent(server, writers):
    server.rule = lambda path, payload: "slow"
    writer = writers(server.url, version="v0.4", timeout=0.3, max_attempts=2, retry_backoff=0.01)
    _write_n(writer, 3)
    writer.flush(timeout=0)
    done = threading.Event()
    result = []
    stopper = threading.Thread(target=lambda: (result.append(writer.stop()), done.set()))
    stopper.start()
    # The bound docs/agent-writer.md states: max_attempts x timeout plus the backoffs (0.6 s and change).
    assert done.wait(10)
    server.release()
    stats = ledger_balances(writer)
    assert stats["traces_sent_unconfirmed"] == 3


def test_the_thread_is_restarted_by_the_next_write(server, writers, monkeypatch):
    writer = writers(server.url, version="v0.4")
    _write_n(writer, 2)
    assert writer.flush(timeout=10)

    def fatal(*args):  # end it the way an error the thread cannot survive would: from inside
        raise SystemExit("fatal")

    monkeypatch.setattr(writer, "_run_once", fatal)
    monkeypatch.setattr(writer, "_on_thread_error", fatal)
    _write_n(writer, 1)
    assert writer.flush(timeout=10)  # the round under way sends it; the next one fails
    for _ in range(1000):  # (at most 10 s)
        if writer._running is None:
            break
        time.sleep(0.01)
    assert writer._running is None
    monkeypatch.undo()
    ids = _write_n(writer, 3)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["thread_starts"] == 2 and stats["traces_sent"] == 6
    assert set(ids) <= set(server.accepted_ids())


def test_an_unexpected_error_on_the_thread_is_counted_and_the_thread_goes_on(server, writers, monkeypatch):
    writer = writers(server.url, version="v0.4")
    calls = []
    real = writer._payload_headers

    def failing(count):
        calls.append(count)
        if len(calls) == 1:
            raise MemoryError("simulated")
        return real(count)

    monkeypatch.setattr(writer, "_payload_headers", failing)
    _write_n(writer, 2)
    assert writer.flush(timeout=10)
    ids = _write_n(writer, 3)
    assert writer.flush(timeout=10)
    stats = ledger_balances(writer)
    assert stats["writer_errors"] == 1 and drops(stats) == {"writer_error": 2}
    assert stats["thread_starts"] == 1 and sorted(server.accepted_ids()) == ids


def test_every_drop_reason_is_always_present(writers):
    writer = writers("http://127.0.0.1:1", version="v0.4")
    assert writer.stats["dropped_by_reason"] == dict.fromkeys(DROP_REASONS, 0)
    assert writer.stats["dropped_by_reason"]["buffer_full"] == 0


# -- configuration --------------------------------------------------------------


def _writer_from_env(env):
    code = textwrap.dedent(
        """
        import json, spanpack
        try:
            writer = spanpack.AgentWriter()
        except Exception as error:
            print(json.dumps(["error", type(error).__name__, str(error)]))
        else:
            print(json.dumps(["url", writer.url]))
        """
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DD_")}
    clean.update(env)
    clean["PYTHONPATH"] = ROOT + os.pathsep + clean.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "env, named",
    [
        ({"DD_TRACE_AGENT_PORT": "abc"}, "DD_TRACE_AGENT_PORT='abc'"),
        ({"DD_TRACE_AGENT_PORT": "99999"}, "DD_TRACE_AGENT_PORT='99999'"),
        ({"DD_AGENT_HOST": "agent:8126"}, "DD_AGENT_HOST='agent:8126'"),
        ({"DD_AGENT_HOST": "localhost/"}, "DD_AGENT_HOST='localhost/'"),
        ({"DD_TRACE_AGENT_URL": "ftp://agent"}, "DD_TRACE_AGENT_URL"),
        ({"DD_TRACE_AGENT_URL": "http://agent:notaport"}, "DD_TRACE_AGENT_URL"),
    ],
)
def test_bad_dd_values_name_the_variable_and_the_value(env, named):
    kind, *rest = _writer_from_env(env)
    assert kind == "error" and rest[0] == "ValueError" and named in rest[1], rest


def test_a_url_without_a_port_goes_to_8126_and_a_path_is_a_prefix(writers):
    from spanpack.transport import parse_agent_url

    assert parse_agent_url("http://agent").port == 8126
    assert parse_agent_url("http://agent/").base_path == ""
    with FaultServer() as server:
        # The fault server takes only the paths it knows: a prefix it does not is refused with 404.
        writer = writers(server.url + "/proxy", version="v0.4", max_attempts=1)
        writer.write(make_trace())
        assert writer.flush(timeout=10)
        assert server.requests == ["/proxy/v0.4/traces"]
        assert drops(ledger_balances(writer)) == {"agent_refused": 1}


# -- spanpack.send(): the same bounds ---------------------------------------------


@pytest.mark.parametrize("failure", ["huge", "trickle"])
def test_send_is_bounded_in_size_and_time(server, failure):
    import spanpack
    from spanpack.transport import ReplyTooLarge, RequestFailed

    server.script.append(failure)
    encoder = spanpack.TraceMsgPackEncoder("v0.4")
    payload = encoder.encode_traces([make_trace()])
    expected = ReplyTooLarge if failure == "huge" else RequestFailed
    with pytest.raises(expected) as raised:
        spanpack.send(payload, 1, server.url + "/v0.4/traces", timeout=0.5)
    server.release()
    assert isinstance(raised.value, OSError)
    if failure == "trickle":
        assert raised.value.body_sent  # the payload went out whole: the agent may have it
    status, body = spanpack.send(payload, 1, server.url + "/v0.4/traces", timeout=5)
    assert status == 200 and json.loads(body)["rate_by_service"]


@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
def test_the_tracer_version_header_is_settable_for_every_version(server, writers, version):
    writer = writers(server.url, version=version, tracer_version="my-tracer 2.0", language_name="python")
    writer.write(make_trace())
    assert writer.flush(timeout=10)
    headers = server.accepted[0].headers
    assert headers["datadog-meta-tracer-version"] == "my-tracer 2.0"
    assert headers["datadog-meta-lang"] == "python"


def test_a_header_option_with_a_line_break_is_refused_at_construction():
    with pytest.raises(ValueError, match="tracer_version"):
        AgentWriter("http://127.0.0.1:1", version="v0.4", tracer_version="1.0\r\nX-Evil: 1")


def test_a_connection_the_agent_closed_while_idle_is_not_used(server, writers):
    # Nothing may be sent into a connection the agent has closed: the payload
    # would be lost as "unconfirmed".  The writer sees the close and reconnects.
    server.script.extend(["ok_then_close", "ok_then_close"])
    writer = writers(server.url, version="v0.4")
    ids = []
    import select

    for round_ in range(3):
        ids += _write_n(writer, 2)
        assert writer.flush(timeout=10)
        if round_ < 2:  # let the close reach the writer's socket before the next payload
            sock = writer._connection._sock
            assert sock is not None and select.select([sock], [], [], 10)[0]
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == 6 and stats["traces_sent_unconfirmed"] == 0 and stats["retries"] == 0
    assert sorted(server.accepted_ids()) == ids and server.connections == 3


def test_a_host_name_lookup_that_hangs_ends_at_the_request_deadline(server, writers, monkeypatch):
    """getaddrinfo() has no timeout: a resolver that never answers held the
    flush thread for as long as its retries lasted.  The lookup now ends at
    the request's deadline, one lookup thread at a time, and its answer,
    once it comes, is used."""
    import socket

    real_getaddrinfo = socket.getaddrinfo
    answer = threading.Event()
    asked = []

    def hanging_getaddrinfo(host, port, *args, **kwargs):
        if host == "agent.example.invalid":
            asked.append(host)
            answer.wait(60)
            host = "127.0.0.1"
        return real_getaddrinfo(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hanging_getaddrinfo)
    url = server.url.replace("127.0.0.1", "agent.example.invalid")
    assert url != server.url
    writer = writers(url, version="v0.4", timeout=0.3, max_attempts=2, retry_backoff=0.01)
    first = _write_n(writer, 2)
    # Each attempt waits for the same lookup until its own deadline, then fails.
    assert writer.flush(timeout=20)
    assert drops(writer.stats) == {"retries_exhausted": 2}
    assert len(asked) == 1, "a second lookup thread started while the first hung"
    answer.set()
    later = _write_n(writer, 3)
    assert writer.flush(timeout=20)
    stats = ledger_balances(writer)
    assert stats["traces_sent"] == 3 and sorted(server.accepted_ids()) == later
    assert not set(first) & set(server.received_ids())


@pytest.mark.parametrize("failure", ["refused", "lookup"])
def test_a_failed_connect_leaves_no_reference_cycle(monkeypatch, failure):
    """A failed connect's exception must not sit in a cycle with the frames
    that raised it: the cycle kept each failed request's payload alive until
    a garbage collection (RSS grew to twice its bound against a dead agent)."""
    import gc
    import socket
    import time

    from spanpack.transport import AgentConnection, RequestFailed, parse_agent_url
    from tests.integration.fault_server import refusing_url

    holder, url = refusing_url()
    if failure == "lookup":
        def failing_getaddrinfo(host, *args, **kwargs):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

        monkeypatch.setattr(socket, "getaddrinfo", failing_getaddrinfo)
        url = "http://agent.example.invalid:8126"
    connection = AgentConnection(parse_agent_url(url))
    bodies = [bytes(100_000) for _ in range(3)]  # the payloads, each its own object
    try:
        gc.collect()
        gc.disable()
        try:
            for body in bodies:
                with pytest.raises(RequestFailed):
                    connection.request("PUT", "/v0.4/traces", body, {}, time.monotonic() + 5)
            del body
            # What only a collection frees, kept to be looked at: whatever
            # holds a request's payload (what the cycle kept alive), not
            # what other threads of the test process (an earlier test's
            # writer winding down) leave meanwhile.
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            holding = [repr(o)[:120] for o in gc.garbage
                       if any(any(r is b for b in bodies) for r in gc.get_referents(o))]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert not holding, "a failed request's payload lived on in objects only a collection frees: %s" % holding
    finally:
        holder.close()


# -- at-least-once delivery through a transient fault -------------------------------


def _write_from_eight_threads(writer, per_thread):
    ids = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def produce(n):
        start.wait(10)
        for _ in range(per_thread):
            ids[n] += _write_n(writer, 1, spans=1 + len(ids[n]) % 3)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    return [tid for mine in ids for tid in mine]


@pytest.mark.parametrize("delivery", ["at-least-once", "at-most-once"])
def test_a_proxy_that_drops_the_first_requests_after_reading_them(server, writers, delivery):
    """As a proxy whose upstream is briefly gone: the first five trace
    requests are read whole and the connection closed or reset with no
    reply; then everything is answered.  At-least-once (the default)
    delivers every trace, and the server holds a trace twice only if it was
    resent; at-most-once counts the five payloads unconfirmed and resends
    none of them.  Six attempts a payload: five faults in a row may all fall
    on one payload (with the default four its traces would end unconfirmed)."""
    server.script.extend(["close_after_body", "reset_after_body"] * 2 + ["close_after_body"])
    writer = writers(server.url, version="v0.4", flush_interval=0.01, delivery=delivery, max_attempts=6,
                     max_payload_size=16 << 10)  # some twenty payloads
    ids = _write_from_eight_threads(writer, 150)
    assert writer.stop(timeout=30)
    stats = ledger_balances(writer)
    assert stats["traces_written"] == len(ids) == 1200 and not drops(stats)
    assert len(server.requests) > 5 and not server.script and not server.errors
    accepted = server.accepted_ids()
    received = server.received_ids()
    assert set(accepted) <= set(ids)
    assert len(received) - len(set(received)) <= stats["traces_resent"]
    if delivery == "at-least-once":
        assert sorted(set(accepted)) == sorted(ids)  # every trace arrived
        assert len(accepted) == len(set(accepted))  # answered once each
        assert stats["traces_sent_unconfirmed"] == 0 and stats["traces_resent"] > 0
    else:
        assert stats["traces_resent"] == 0 and len(received) == len(set(received))
        lost = len(ids) - len(set(accepted))
        assert lost == stats["traces_sent_unconfirmed"] > 0


def test_the_agent_gets_every_trace_through_a_proxy_that_drops_the_first_requests(agent_session, writers):
    """The same proxy in front of the APM test agent: the agent gets all
    1,200 traces, and holds one twice only if the writer counted it
    resent (the agent joins a trace's spans by trace id, so a copy doubles
    its span count)."""
    with FaultServer(upstream=agent_session.base_url) as proxy:
        proxy.script.extend(["close_after_body", "reset_after_body"] * 2 + ["close_after_body"])
        writer = writers(proxy.url, version="v0.4", flush_interval=0.01, max_attempts=6, max_payload_size=16 << 10)
        ids = _write_from_eight_threads(writer, 150)
        assert writer.stop(timeout=60)
        assert not proxy.script and not proxy.errors
    stats = ledger_balances(writer)
    assert stats["traces_written"] == stats["traces_sent"] == 1200 and stats["traces_sent_unconfirmed"] == 0
    assert stats["traces_resent"] > 0
    spans = {}
    for trace in agent_session.traces():
        spans[trace[0]["trace_id"]] = spans.get(trace[0]["trace_id"], 0) + len(trace)
    assert sorted(spans) == sorted(ids)  # every trace arrived
    sizes = {tid: count for payload in proxy.received for tid, count in payload.traces}  # spans per trace
    copies = sum(spans[tid] // sizes[tid] - 1 for tid in spans)
    assert all(spans[tid] % sizes[tid] == 0 for tid in spans)
    assert copies <= stats["traces_resent"], (copies, stats["traces_resent"])
