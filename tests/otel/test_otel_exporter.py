"""DatadogSpanExporter: spans made by the OpenTelemetry SDK's own tracer,
through the exporter, to Datadog's APM test agent and to the fault server;
what export(), force_flush() and shutdown() answer, and how long they take."""

from __future__ import annotations

import time
from typing import Any, Dict, List

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import Link, SpanKind, Status, StatusCode  # noqa: E402

from spanpack import AgentWriter, otel  # noqa: E402
from tests.integration.fault_server import FaultServer, refusing_url  # noqa: E402
from tests.otel.spans import decode_v04  # noqa: E402

RESOURCE = {"service.name": "checkout", "service.version": "2.1", "deployment.environment.name": "staging",
            "container.id": "c0ffee"}


def _make_spans(tracer) -> None:
    """Two traces as an instrumented web app makes them: a request with a DB
    call and a failed outgoing call, and a consumer span with a link."""
    with tracer.start_as_current_span("GET /cart/{id}", kind=SpanKind.SERVER, attributes={
        "http.request.method": "GET", "http.route": "/cart/{id}", "http.response.status_code": 200,
        "url.full": "https://shop/cart/7", "client.address": "10.0.0.1", "user_agent.original": "curl/8",
        "server.port": 443, "retry": False, "tags": ["a", "b"],
    }) as request:
        with tracer.start_as_current_span("SELECT carts", kind=SpanKind.CLIENT, attributes={
            "db.system": "postgresql", "db.statement": "SELECT * FROM carts WHERE id = $1", "db.name": "shop",
        }):
            pass
        with tracer.start_as_current_span("POST", kind=SpanKind.CLIENT,
                                          attributes={"http.request.method": "POST"}) as call:
            try:
                raise TimeoutError("upstream timed out")
            except TimeoutError as error:
                call.record_exception(error)
                call.set_status(Status(StatusCode.ERROR, "timeout"))
        request.add_event("cache.miss", {"key": "cart:7", "size": 3})
    with tracer.start_as_current_span("orders process", kind=SpanKind.CONSUMER,
                                      links=[Link(request.get_span_context(), {"reason": "enqueued"})],
                                      attributes={"messaging.system": "kafka", "messaging.operation": "process",
                                                  "messaging.destination.name": "orders"}):
        pass


def _sdk_spans() -> List[Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(RESOURCE))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    _make_spans(provider.get_tracer("shop.instrumentation", "0.9"))
    provider.shutdown()
    return list(memory.get_finished_spans())


def _by_span_id(traces: List[List[Dict[str, Any]]]) -> Dict[int, Dict[str, Any]]:
    return {span["span_id"]: span for trace in traces for span in trace}


def test_sdk_spans_map_as_the_rules_say():
    spans = _sdk_spans()
    got = _by_span_id(decode_v04(otel.encode_spans(spans)))
    named = {span["resource"]: span for span in got.values()}
    request = named["GET /cart/{id}"]
    assert (request["name"], request["service"], request["type"]) == ("http.server.request", "checkout", "web")
    assert request["meta"]["http.url"] == "https://shop/cart/7" and request["meta"]["http.client_ip"] == "10.0.0.1"
    assert request["meta"]["http.status_code"] == "200" and request["metrics"]["http.status_code"] == 200.0
    assert (request["meta"]["env"], request["meta"]["version"], request["meta"]["container.id"]) == (
        "staging", "2.1", "c0ffee")
    assert request["meta"]["retry"] == "false" and request["meta"]["tags"] == '["a","b"]'
    assert request["metrics"]["server.port"] == 443.0
    assert request["span_events"][0]["name"] == "cache.miss"
    db = named["SELECT * FROM carts WHERE id = $1"]
    assert (db["name"], db["type"], db["parent_id"]) == ("postgresql.query", "sql", request["span_id"])
    call = named["POST"]
    assert call["error"] == 1 and call["meta"]["error.type"] == "TimeoutError"
    assert call["meta"]["error.message"] == "upstream timed out" and "TimeoutError" in call["meta"]["error.stack"]
    assert call["meta"]["otel.status_description"] == "timeout"
    consumer = named["process orders"]
    assert (consumer["name"], consumer["type"]) == ("kafka.process", "custom")
    assert consumer["span_links"][0]["span_id"] == request["span_id"]
    # The SDK's trace ids are 128-bit: the high half on each trace's first span.
    assert all(span["meta"]["otel.trace_id"].endswith("%016x" % span["trace_id"]) for span in got.values())


@pytest.fixture
def exporters():
    made = []

    def make(*args, **options):
        exporter = otel.DatadogSpanExporter(*args, **options)
        made.append(exporter)
        return exporter

    yield make
    for exporter in made:
        exporter.shutdown()


@pytest.mark.parametrize("version", ["v0.4", "v0.5", "v1.0"])
def test_round_trip_through_the_apm_test_agent(agent_session, exporters, version):
    exporter = exporters(url=agent_session.base_url, version=version, flush_interval=60.0, timeout=5.0)
    memory = InMemorySpanExporter()  # the same spans, kept to map them here
    provider = TracerProvider(resource=Resource.create(RESOURCE))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    _make_spans(provider.get_tracer("shop.instrumentation", "0.9"))
    assert provider.force_flush(10_000)  # the batch processor exports what it holds
    assert exporter.force_flush(10_000)  # the writer sends it
    stats = exporter.writer.stats
    assert (stats["traces_sent"], stats["traces_dropped"]) == (2, 0), stats

    # The agent got, span for span, what the mapping gives for the same spans.
    spans = memory.get_finished_spans()
    received = _by_span_id(agent_session.traces())
    assert len(received) == 4
    expected = _by_span_id(decode_v04(otel.encode_spans(spans)))
    for span_id, want in expected.items():
        got = received[span_id]
        for field in ("trace_id", "service", "name", "resource", "type", "start", "duration"):
            assert got.get(field) == want.get(field), (field, want["resource"])
        # (v1.0 leaves out a parent id and error of 0)
        assert (got.get("parent_id") or 0, got.get("error") or 0) == (want["parent_id"], want.get("error", 0))
        for key, value in want["meta"].items():
            assert got["meta"].get(key) == value, (key, want["resource"])
        for key, value in want.get("metrics", {}).items():
            assert got["metrics"].get(key) == value, (key, want["resource"])
    provider.shutdown()


def test_export_success_means_the_writer_took_every_trace(exporters):
    with FaultServer() as server:
        exporter = exporters(url=server.url, version="v0.4", flush_interval=60.0)
        spans = _sdk_spans()
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        assert exporter.writer.stats["traces_buffered"] == 2
        assert exporter.force_flush(10_000) is True
        assert exporter.writer.stats["traces_sent"] == 2


def test_export_failure_when_the_writer_refuses_a_trace(exporters):
    sock, url = refusing_url()
    try:
        # Room for about one trace: the second of a batch is refused (buffer_full).
        writer = AgentWriter(url, version="v0.4", flush_interval=60.0, max_buffer_size=8 * 1200,
                             max_payload_size=1024, native_span_events=True)
        exporter = exporters(writer)
        assert exporter.export(_sdk_spans()) is SpanExportResult.FAILURE
        assert writer.stats["traces_dropped"] >= 1
        # and after shutdown every export fails, without a word to the writer
        exporter.shutdown()
        written = writer.stats["traces_written"]
        assert exporter.export(_sdk_spans()) is SpanExportResult.FAILURE
        assert writer.stats["traces_written"] == written
    finally:
        sock.close()


def test_force_flush_and_shutdown_are_bounded(exporters):
    with FaultServer() as server:
        server.rule = lambda path, payload: "slow"  # never answers (until released)
        exporter = exporters(url=server.url, version="v0.4", flush_interval=60.0, timeout=5.0,
                             shutdown_timeout=0.3)
        assert exporter.export(_sdk_spans()) is SpanExportResult.SUCCESS
        began = time.monotonic()
        assert exporter.force_flush(timeout_millis=200) is False
        assert time.monotonic() - began < 1.5
        began = time.monotonic()
        exporter.shutdown()
        assert time.monotonic() - began < 1.5
        server.release()


def test_exporter_options():
    with pytest.raises(TypeError):
        otel.DatadogSpanExporter(AgentWriter("http://127.0.0.1:1"), version="v0.4")
    with pytest.raises(TypeError):
        otel.DatadogSpanExporter(url="http://127.0.0.1:1", no_such_option=1)


def test_a_batch_that_cannot_be_mapped_fails_with_a_log_line(exporters, caplog):
    exporter = exporters(url="http://127.0.0.1:1", version="v0.4", flush_interval=60.0)

    class NotASpan:
        name = "x"

    assert exporter.export([NotASpan()]) is SpanExportResult.FAILURE
    assert "1 spans not exported" in caplog.text
    assert exporter.writer.stats["traces_written"] == 0
