"""spanpack.ddtrace.install(): ddtrace's own writers encode with spanpack.

End to end: a program traced by ddtrace (its tracer API with tags, metrics,
an error, a span link, a trace continued from fixed ids, and ddtrace's own
sqlite3 integration) runs in a child interpreter and sends to the APM test
agent through ddtrace's writer, once as it is and once after install().  The
agent must receive the same traces, with the ids and times the program made.
Each run has its own test session token; both runs of a test share one
service name, unique to the test.

In process: install() is idempotent and uninstall() restores ddtrace; the
encoder takes over what a running writer already buffered; spanpack's limit
errors reach ddtrace's writer as ddtrace's BufferFull / BufferItemTooLarge,
with ddtrace's sizes; a trace spanpack refuses goes to ddtrace's encoder; a
ddtrace that is not as expected gets one warning and is left unchanged.

Whichever ddtrace the interpreter running pytest has is tested: 4.2.3 in the
main suite; CI's ddtrace matrix runs this module with 4.3.2, 4.9.7 and 4.16.0.
ddtrace's Python AgentWriter (4.2 to 4.7, with _DD_TRACE_WRITER_NATIVE=false)
is tested next to the native writer where it exists.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
import uuid
from types import SimpleNamespace
from typing import Any, Dict, List, Tuple

import pytest

pytest.importorskip("ddtrace")

import ddtrace  # noqa: E402
from ddtrace.internal import _encoding  # noqa: E402
from ddtrace.internal import encoding as ddtrace_encoding  # noqa: E402
from ddtrace.internal.writer import writer as writer_module  # noqa: E402
from ddtrace.internal.writer import writer_client  # noqa: E402
from ddtrace.trace import tracer  # noqa: E402

import spanpack  # noqa: E402
import spanpack.ddtrace as spanpack_ddtrace  # noqa: E402

CHILD_TIMEOUT = 120.0
AGENT_WAIT = 20.0
WRITERS = ("native", "python") if hasattr(writer_module, "AgentWriter") else ("native",)

# The traced program.  argv: "plain", "install" (after ddtrace's tracer is
# made) or "install-early" (before ddtrace is imported), the path to write its
# report to.  It records every finished trace as ddtrace's writer gets it
# (a trace filter, run before the writer), flushes the writer synchronously
# (a failed send raises), and reports what it recorded, which writer and
# encoder ddtrace used, and any error ddtrace logged.
CHILD_PROGRAM = r'''
import json
import logging
import sqlite3
import sys

mode, report_path = sys.argv[1], sys.argv[2]

errors = []


class KeepErrors(logging.Handler):
    def emit(self, record):
        errors.append(record.getMessage())


logging.getLogger("ddtrace").addHandler(KeepErrors(level=logging.ERROR))

installed = None
if mode == "install-early":
    # Before ddtrace's tracer (and its writer) exist.
    import spanpack.ddtrace
    installed = spanpack.ddtrace.install()
    assert installed, "install() refused this ddtrace"

import ddtrace
from ddtrace.trace import Context, TraceFilter, tracer

ddtrace.patch(sqlite3=True)
recorded = []


class Record(TraceFilter):
    def process_trace(self, trace):
        recorded.append([[s.name, s.trace_id, s.span_id, s.parent_id or 0, s.start_ns, s.duration_ns]
                         for s in trace])
        return trace


tracer.configure(trace_processors=[Record()])
if mode == "install":
    # The usual order: the tracer and its writer are there already.
    import spanpack.ddtrace
    installed = spanpack.ddtrace.install()
    assert installed, "install() refused this ddtrace"
    assert spanpack.ddtrace.install() is True  # idempotent

# 1. A web request: tags and metrics of each kind, a database step through
#    ddtrace's sqlite3 integration, and a step that fails.
with tracer.trace("web.request", resource="GET /items/{id}", span_type="web") as root:
    root.set_tag("http.method", "GET")
    root.set_tag("http.url", "http://127.0.0.1/items/7")
    root.set_tag("http.status_code", 500)
    root.set_metric("items.count", 3)
    root.set_metric("items.ratio", 0.25)
    with tracer.trace("db.work", resource="load items") as work:
        work.set_tag("db.note", "héllo wörld")
        connection = sqlite3.connect(":memory:")
        connection.execute("create table items (id integer primary key, name text)")
        connection.executemany("insert into items (name) values (?)", [("a",), ("b",), ("c",)])
        rows = connection.execute("select id, name from items order by id").fetchall()
        assert len(rows) == 3
        connection.close()
    try:
        with tracer.trace("render.step", resource="render") as failing:
            failing.set_tag("template", "items.html")
            raise ValueError("template missing")
    except ValueError:
        pass

# 2. A job linked to the request.
with tracer.trace("worker.job", resource="reindex") as job:
    job.link_span(root.context, {"link.kind": "follows_from", "link.count": "1"})
    job.set_tag("job.id", "42")
    job.set_metric("job.attempt", 1)

# 3. A trace continued from fixed ids, as from an incoming request's headers.
tracer.context_provider.activate(Context(trace_id=0x5BA2_C0DE_0000_0001, span_id=0x1234_5678, sampling_priority=1))
with tracer.trace("remote.child", resource="continue") as remote:
    remote.set_tag("peer", "upstream")
tracer.context_provider.activate(None)

writer = tracer._span_aggregator.writer
writer.flush_queue(raise_exc=True)
encoders = [client.encoder for client in writer._clients]
report = {
    "ddtrace": ddtrace.__version__,
    "writer": type(writer).__name__,
    "encoders": [type(e).__module__ + "." + type(e).__name__ for e in encoders],
    "fallback_traces": sum(getattr(e, "fallback_traces", 0) for e in encoders),
    "installed": installed,
    "recorded": recorded,
    "errors": errors,
}
with open(report_path, "w") as f:
    json.dump(report, f)
'''


# ---------------------------------------------------------------------------
# End to end, through the test agent


def _run_child(
    script: str, workdir: str, mode: str, version: str, writer: str, agent: Any, service: str
) -> Tuple[Dict[str, Any], str]:
    token = "ddinstall-%s-%s" % (mode, uuid.uuid4().hex[:16])
    previous_token = agent.session_token
    agent.start_session(token)
    agent.session_token = previous_token  # the shared agent's default, for other tests
    report_path = os.path.join(workdir, "report-%s.json" % token)
    # None of the caller's ddtrace or OpenTelemetry settings reach the program.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DD_", "_DD_", "OTEL_"))}
    spanpack_root = os.path.dirname(os.path.dirname(os.path.abspath(spanpack.__file__)))
    env.update(
        {
            # The spanpack this test imports, in the child too.
            "PYTHONPATH": os.pathsep.join(p for p in (spanpack_root, env.get("PYTHONPATH", "")) if p),
            "DD_TRACE_AGENT_URL": agent.base_url,
            "DD_TRACE_API_VERSION": version,
            "DD_SERVICE": service,
            "DD_ENV": "spanpack-test",
            "DD_VERSION": "1.0",
            "_DD_TRACE_WRITER_ADDITIONAL_HEADERS": "X-Datadog-Test-Session-Token:%s" % token,
            "_DD_TRACE_WRITER_NATIVE": "true" if writer == "native" else "false",
            # Nothing but traces, and only to the test agent.
            "DD_REMOTE_CONFIGURATION_ENABLED": "false",
            "DD_INSTRUMENTATION_TELEMETRY_ENABLED": "false",
            "DD_TRACE_STATS_COMPUTATION_ENABLED": "false",
            "DD_TRACE_STARTUP_LOGS": "false",
            "DD_RUNTIME_METRICS_ENABLED": "false",
            "DD_TRACE_HEALTH_METRICS_ENABLED": "false",
            "DD_DATA_STREAMS_ENABLED": "false",
            "DD_PROFILING_ENABLED": "false",
            # One writer interval longer than the run: only the program's own
            # flush sends, so each run is one payload.
            "DD_TRACE_WRITER_INTERVAL_SECONDS": "60",
        }
    )
    proc = subprocess.run(
        [sys.executable, script, mode, report_path],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    assert proc.returncode == 0, "traced program (%s) failed:\n%s\n%s" % (mode, proc.stdout, proc.stderr)
    with open(report_path) as f:
        return json.load(f), token


def _received(agent, token: str, expected_spans: int) -> List[List[Dict[str, Any]]]:
    """The session's traces, once the agent holds every span (it stores a
    payload as it answers, so they are there when the flush returned)."""
    deadline = time.monotonic() + AGENT_WAIT
    while True:
        traces = agent.traces(token)
        if sum(len(t) for t in traces) >= expected_spans or time.monotonic() > deadline:
            return traces
        time.sleep(0.1)


_U64 = (1 << 64) - 1


def _labels(recorded: List[List[list]]) -> Tuple[Dict[int, str], Dict[str, str]]:
    """Names for the ids and times the program made, the same in every run:
    {int as the agent shows it: label}, {hex text: label}."""
    numbers: Dict[int, str] = {}
    texts: Dict[str, str] = {}
    for t, trace in enumerate(recorded):
        trace_id = trace[0][1]
        numbers[trace_id & _U64] = "T%d" % t
        numbers[trace_id] = "T%d" % t
        texts["%032x" % trace_id] = "T%d" % t
        texts["%016x" % (trace_id & _U64)] = "T%d.lo" % t
        if trace_id >> 64:
            # The high half is the second the trace began in: traces made in
            # the same second share it, so it is one label for all
            # (_check_ids checks each trace's).
            numbers[trace_id >> 64] = "<trace id high bits>"
            texts["%016x" % (trace_id >> 64)] = "<trace id high bits>"
        for i, (_name, _tid, span_id, _parent, start, duration) in enumerate(trace):
            numbers[span_id] = "S%d.%d" % (t, i)
            texts["%016x" % span_id] = "S%d.%d" % (t, i)
            numbers[start] = "start%d.%d" % (t, i)
            numbers[duration] = "duration%d.%d" % (t, i)
    numbers[0x1234_5678] = "remote-parent"
    return numbers, texts


# Per process, not per trace: differ between any two runs.
_PER_PROCESS_META = ("runtime-id",)
_PER_PROCESS_METRICS = ("process_id",)


def _normalized(traces: List[List[Dict[str, Any]]], recorded: List[List[list]]) -> List[List[Dict[str, Any]]]:
    numbers, texts = _labels(recorded)
    hex_token = re.compile(r"[0-9a-f]{16,32}")
    otel_random_value = re.compile(r"\brv:[0-9a-f]{14}\b")

    def relabel(value: Any) -> Any:
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return numbers.get(value, value)
        if isinstance(value, str) and value[:2] in ('[{', '{"'):
            # JSON in a tag (v0.5's _dd.span_links): compared decoded, as
            # ddtrace 4.9's native links keep their attributes in an order
            # that differs from one process to the next.
            try:
                return {"<json>": relabel(json.loads(value))}
            except ValueError:
                pass
        if isinstance(value, str):
            # W3C tracestate's OpenTelemetry random value (newer ddtrace),
            # a hash of the trace id, which is checked itself.
            value = otel_random_value.sub("rv:<of the trace id>", value)
            return hex_token.sub(lambda m: texts.get(m.group(0), m.group(0)), value)
        if isinstance(value, list):
            return [relabel(v) for v in value]
        if isinstance(value, dict):
            return {k: relabel(v) for k, v in value.items()}
        return value

    result = []
    for trace in traces:
        spans = []
        for span in trace:
            span = relabel(span)
            for key in _PER_PROCESS_META:
                if key in span.get("meta", {}):
                    span["meta"][key] = "<per process>"
            for key in _PER_PROCESS_METRICS:
                if key in span.get("metrics", {}):
                    span["metrics"][key] = "<per process>"
            spans.append(span)
        result.append(sorted(spans, key=lambda s: str(s["span_id"])))
    return sorted(result, key=lambda t: str(t[0]["trace_id"]))


def _check_ids(received: List[List[Dict[str, Any]]], recorded: List[List[list]]) -> None:
    """The agent has exactly the spans the program made, with their ids and times."""
    made = {}
    high_bits = {}
    for trace in recorded:
        for name, trace_id, span_id, parent_id, start, duration in trace:
            made[span_id] = (name, trace_id & _U64, parent_id, start, duration)
            if trace_id >> 64:
                high_bits[trace_id & _U64] = "%016x" % (trace_id >> 64)
    got = {}
    for trace in received:
        for span in trace:
            got[span["span_id"]] = (
                span["name"], span["trace_id"], span.get("parent_id", 0), span["start"], span["duration"])
            if "_dd.p.tid" in span.get("meta", {}):
                assert span["meta"]["_dd.p.tid"] == high_bits[span["trace_id"]], span
    assert got == made
    assert high_bits, "ddtrace made no 128-bit trace id"


@pytest.fixture(scope="module")
def traced_program(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("ddtrace-install"))
    script = os.path.join(workdir, "traced_program.py")
    with open(script, "w") as f:
        f.write(CHILD_PROGRAM)
    return script, workdir


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
def test_agent_receives_the_same_traces_with_and_without_install(test_agent, traced_program, version, writer):
    script, workdir = traced_program
    service = "spanpack-ddinstall-%s" % uuid.uuid4().hex[:10]
    runs = {}
    for mode in ("plain", "install", "install-early"):
        report, token = _run_child(script, workdir, mode, version, writer, test_agent, service)
        assert report["errors"] == [], report["errors"]
        assert report["ddtrace"] == ddtrace.__version__
        expected_writer = "NativeWriter" if writer == "native" else "AgentWriter"
        assert report["writer"] == expected_writer
        recorded = report["recorded"]
        assert [len(t) for t in recorded][1:] == [1, 1], recorded  # the job, the remote child
        assert len(recorded[0]) >= 5, recorded  # web.request, db.work, sqlite queries, render.step
        assert any(span[0] == "sqlite.query" for span in recorded[0]), recorded
        if mode != "plain":
            assert report["installed"] is True
            assert report["encoders"] == ["spanpack.ddtrace.DdtraceWriterEncoder"]
            assert report["fallback_traces"] == 0
        else:
            assert report["encoders"] == [
                "ddtrace.internal._encoding.MsgpackEncoderV0%s" % version[-1]
            ]
        expected_spans = sum(len(t) for t in recorded)
        received = _received(test_agent, token, expected_spans)
        assert sum(len(t) for t in received) == expected_spans, received
        _check_ids(received, recorded)
        runs[mode] = (received, recorded)

    plain = _normalized(*runs["plain"])
    # What the test covers reached the agent: an error with its stack, the
    # link, the sqlite3 integration's spans.
    spans = {s["name"]: s for t in plain for s in t}
    assert spans["render.step"]["error"] == 1 and "error.stack" in spans["render.step"]["meta"]
    assert spans["sqlite.query"]["meta"].get("component") == "sqlite"
    if version == "v0.4":
        assert spans["worker.job"]["span_links"][0]["span_id"] == spans["web.request"]["span_id"]
    else:
        assert "_dd.span_links" in spans["worker.job"]["meta"]
    assert spans["remote.child"].get("parent_id") == "remote-parent"
    for mode in ("install", "install-early"):
        assert _differences(_normalized(*runs[mode]), plain) == [], mode


def _differences(got: Any, expected: Any, where: str = "") -> List[str]:
    """Where two decoded structures differ (readable where == alone is not)."""
    if isinstance(got, dict) and isinstance(expected, dict):
        found = []
        for key in sorted(set(got) | set(expected), key=str):
            if key not in got or key not in expected:
                found.append("%s[%r]: %r != %r" % (where, key, got.get(key, "<absent>"), expected.get(key, "<absent>")))
            else:
                found += _differences(got[key], expected[key], "%s[%r]" % (where, key))
        return found
    if isinstance(got, list) and isinstance(expected, list) and len(got) == len(expected):
        return [d for i, (g, e) in enumerate(zip(got, expected)) for d in _differences(g, e, "%s[%d]" % (where, i))]
    return [] if got == expected else ["%s: %r != %r" % (where, got, expected)]


# ---------------------------------------------------------------------------
# In process


def _ddtrace_trace(name: str = "op", tags: int = 3) -> list:
    from ddtrace._trace.span import Span

    root = Span(name, service="svc", resource="res", trace_id=0xABC, span_id=0x1, parent_id=None, start=1)
    for i in range(tags):
        root.set_tag("tag.%d" % i, "value %d" % i)
    root.set_metric("metric", 1.5)
    child = Span(name + ".child", service="svc", trace_id=0xABC, span_id=0x2, parent_id=0x1, start=1)
    child.finish(2)
    root.finish(3)
    return [root, child]


class _FakeClient:
    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder


@pytest.fixture
def live_writer(monkeypatch):
    """Stands in for the global tracer's writer while a test installs: a
    writer whose client holds ddtrace's own v0.5 encoder."""
    encoder = _encoding.MsgpackEncoderV05(max_size=1 << 20, max_item_size=1 << 20)
    writer = SimpleNamespace(_clients=[_FakeClient(encoder)])
    monkeypatch.setattr(tracer._span_aggregator, "writer", writer)
    yield writer
    spanpack_ddtrace.uninstall()


def test_install_is_idempotent_and_uninstall_restores(live_writer):
    original = writer_client.MSGPACK_ENCODERS
    assert not spanpack_ddtrace.installed()
    assert spanpack_ddtrace.install() is True
    assert spanpack_ddtrace.installed()
    replaced = writer_client.MSGPACK_ENCODERS
    assert replaced is not original
    assert spanpack_ddtrace.install() is True
    assert writer_client.MSGPACK_ENCODERS is replaced
    # ddtrace's own registry is not changed; writer clients made now are ours.
    assert ddtrace_encoding.MSGPACK_ENCODERS["v0.4"] is _encoding.MsgpackEncoderV04
    for client_class in (writer_client.AgentWriterClientV4, writer_client.AgentWriterClientV5):
        assert isinstance(client_class(1 << 20, 1 << 20).encoder, spanpack_ddtrace.DdtraceWriterEncoder)

    assert spanpack_ddtrace.uninstall() is True
    assert spanpack_ddtrace.uninstall() is False
    assert writer_client.MSGPACK_ENCODERS is original
    assert type(writer_client.AgentWriterClientV5(1 << 20, 1 << 20).encoder) is _encoding.MsgpackEncoderV05
    # The live writer keeps its spanpack encoder, now passing traces to ddtrace's.
    encoder = live_writer._clients[0].encoder
    assert isinstance(encoder, spanpack_ddtrace.DdtraceWriterEncoder) and encoder.passthrough
    encoder.put(_ddtrace_trace())
    assert len(encoder._spanpack) == 0 and len(encoder) == 1
    assert spanpack_ddtrace.install() is True
    assert not encoder.passthrough


def test_live_writer_keeps_what_it_had_buffered(live_writer):
    before = live_writer._clients[0].encoder
    before.put(_ddtrace_trace("before"))
    assert spanpack_ddtrace.install() is True
    encoder = live_writer._clients[0].encoder
    assert isinstance(encoder, spanpack_ddtrace.DdtraceWriterEncoder)
    assert encoder.max_size == before.max_size and encoder.max_item_size == before.max_item_size
    encoder.put(_ddtrace_trace("after"))
    assert len(encoder) == 2
    payloads = encoder.encode()
    assert [count for _, count in payloads] == [1, 1]
    # Each payload stands alone: ddtrace's encoder's bytes for its trace.
    for (payload, _), name in zip(payloads, ("after", "before")):
        reference = _encoding.MsgpackEncoderV05(max_size=1 << 20, max_item_size=1 << 20)
        reference.put(_ddtrace_trace(name))
        assert payload == reference.encode()[0][0]
    assert len(encoder) == 0 and encoder.encode() == []


@pytest.mark.parametrize("version", ["v0.4", "v0.5"])
def test_limit_errors_are_ddtraces_with_ddtraces_sizes(live_writer, version):
    assert spanpack_ddtrace.install() is True
    make_ours = writer_client.MSGPACK_ENCODERS[version]
    make_theirs = ddtrace_encoding.MSGPACK_ENCODERS[version]
    trace = _ddtrace_trace(tags=40)
    one = make_theirs(max_size=1 << 20, max_item_size=1 << 20)
    one.put(list(trace))
    one_trace = one.size

    def outcome(encoder) -> Tuple[str, Any]:
        try:
            encoder.put(list(trace))
        except Exception as error:  # noqa: BLE001 - the exception is what is compared
            return type(error).__module__ + "." + type(error).__name__, error.args[0]
        return "accepted", None

    # (max_size, max_item_size, traces put first): a trace larger than an
    # item may be; a buffer too full for a second copy; room enough.
    cases = ((1 << 20, 100, 0), (one_trace + 10, one_trace + 10, 1), (1 << 20, 1 << 20, 1))
    for max_size, max_item_size, preload in cases:
        ours = make_ours(max_size=max_size, max_item_size=max_item_size)
        theirs = make_theirs(max_size=max_size, max_item_size=max_item_size)
        for _ in range(preload):
            ours.put(list(trace))
            theirs.put(list(trace))
        assert outcome(ours) == outcome(theirs)
        assert (ours.size, len(ours), ours.max_size, ours.max_item_size) == (
            theirs.size, len(theirs), theirs.max_size, theirs.max_item_size)
        assert ours.encode() == theirs.encode()
    # The classes ddtrace's writer catches (writer.py imports them by name).
    with pytest.raises(writer_module.BufferItemTooLarge):
        make_ours(max_size=1 << 20, max_item_size=100).put(list(trace))
    full = make_ours(max_size=one_trace + 10, max_item_size=one_trace + 10)
    full.put(list(trace))
    with pytest.raises(writer_module.BufferFull):
        full.put(list(trace))


def test_a_trace_spanpack_refuses_goes_to_ddtraces_encoder(live_writer, monkeypatch):
    assert spanpack_ddtrace.install() is True
    encoder = writer_client.MSGPACK_ENCODERS["v0.4"](max_size=1 << 20, max_item_size=1 << 20)

    def refuse(trace):
        raise TypeError("a span layout spanpack does not know")

    monkeypatch.setattr(encoder, "_spanpack_put", refuse)
    encoder.put(_ddtrace_trace())
    assert encoder.fallback_traces == 1 and len(encoder) == 1
    reference = _encoding.MsgpackEncoderV04(max_size=1 << 20, max_item_size=1 << 20)
    reference.put(_ddtrace_trace())
    assert encoder.encode() == reference.encode()


def test_unknown_ddtrace_gets_one_warning_and_is_untouched(live_writer, monkeypatch, caplog):
    original = writer_client.MSGPACK_ENCODERS
    live_encoder = live_writer._clients[0].encoder
    caplog.set_level(logging.WARNING, logger="spanpack.ddtrace")

    monkeypatch.setattr(ddtrace, "__version__", "99.1.0")
    assert spanpack_ddtrace.install() is False
    monkeypatch.undo()
    monkeypatch.setattr(tracer._span_aggregator, "writer", live_writer)

    # A release spanpack knows, but with a writer client registry someone changed.
    changed = dict(original, **{"v0.4": type("OtherEncoder", (), {})})
    monkeypatch.setattr(writer_client, "MSGPACK_ENCODERS", changed)
    assert spanpack_ddtrace.install() is False
    monkeypatch.setattr(writer_client, "MSGPACK_ENCODERS", original)

    records = [r for r in caplog.records if r.name == "spanpack.ddtrace"]
    assert [r.levelno for r in records] == [logging.WARNING, logging.WARNING]
    assert "99.1.0" in records[0].getMessage()
    assert "MSGPACK_ENCODERS" in records[1].getMessage()
    assert not spanpack_ddtrace.installed()
    assert writer_client.MSGPACK_ENCODERS is original
    assert live_writer._clients[0].encoder is live_encoder


def test_no_trace_lost_while_install_and_uninstall_come_and_go(live_writer):
    """Application threads put through client.encoder (looked up at each
    trace, as ddtrace's writer does), a flusher encodes, and install() and
    uninstall() alternate meanwhile: every trace is in exactly one payload."""
    import threading

    import msgpack

    client = live_writer._clients[0]  # ddtrace's v0.5 encoder, until install()
    toggles_wanted, minimum_per_thread = 40, 200
    flushed: List[int] = []
    put_by_thread = [0] * 4
    toggling_done = threading.Event()
    flushing_done = threading.Event()

    def flush() -> None:
        for payload, traces in client.encoder.encode():
            assert len(msgpack.unpackb(payload, strict_map_key=False)[1]) == traces  # [strings, traces]
            flushed.append(traces)

    def flusher() -> None:
        while not flushing_done.is_set():
            flush()
            time.sleep(0.0005)

    def application(index: int) -> None:
        while not toggling_done.is_set() or put_by_thread[index] < minimum_per_thread:
            try:
                client.encoder.put(_ddtrace_trace("t%d.%d" % (index, put_by_thread[index]), tags=2))
            except writer_module.BufferFull:
                # The flusher fell behind (a loaded machine): the trace was not
                # taken (ddtrace's writer drops it); this one tries again.
                time.sleep(0.001)
                continue
            put_by_thread[index] += 1

    threads = [threading.Thread(target=application, args=(n,)) for n in range(len(put_by_thread))]
    threads.append(threading.Thread(target=flusher))
    for thread in threads:
        thread.start()
    try:
        for toggle in range(toggles_wanted):
            assert (spanpack_ddtrace.uninstall() if toggle % 2 else spanpack_ddtrace.install()) is True
            time.sleep(0.0005)
    finally:
        toggling_done.set()
        for thread in threads[:-1]:
            thread.join(timeout=60)
        flushing_done.set()
        threads[-1].join(timeout=60)
    flush()
    assert sum(flushed) == sum(put_by_thread)
    assert min(put_by_thread) >= minimum_per_thread


def test_install_never_raises(live_writer, monkeypatch, caplog):
    original = writer_client.MSGPACK_ENCODERS
    live_encoder = live_writer._clients[0].encoder
    caplog.set_level(logging.WARNING, logger="spanpack.ddtrace")

    def fail(*args: Any) -> None:
        raise RuntimeError("something unforeseen")

    monkeypatch.setattr(spanpack_ddtrace, "_replace_live_encoders", fail)
    assert spanpack_ddtrace.install() is False
    monkeypatch.setattr(spanpack_ddtrace, "_inspect_ddtrace", fail)
    assert spanpack_ddtrace.install() is False
    messages = [r.getMessage() for r in caplog.records if r.name == "spanpack.ddtrace"]
    assert len(messages) == 2 and all("something unforeseen" in m for m in messages), messages
    assert not spanpack_ddtrace.installed()
    assert writer_client.MSGPACK_ENCODERS is original
    assert live_writer._clients[0].encoder is live_encoder


def test_spanpack_does_not_import_ddtrace():
    code = (
        "import sys, spanpack, spanpack.ddtrace\n"
        "assert 'ddtrace' not in sys.modules, sorted(m for m in sys.modules if m.startswith('ddtrace'))\n"
    )
    spanpack_root = os.path.dirname(os.path.dirname(os.path.abspath(spanpack.__file__)))
    env = dict(os.environ, PYTHONPATH=spanpack_root)
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
