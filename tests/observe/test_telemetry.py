"""Tracing configuration by the standard OTEL_* variables: off by default, OTLP on demand."""

from __future__ import annotations

import asyncio
import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from aiohttp import web
from multidict import CIMultiDict
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from proxy.errors import ConfigurationError, UpstreamNotSent
from proxy.gate.upstream import OutboundRequest, new_client_session, send
from proxy.observe.logs import log_processors
from proxy.observe.telemetry import Telemetry, tracer_provider_from_environment
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import StartOpgate, fault_policy


def test_no_exporter_by_default() -> None:
    """Without OTEL_TRACES_EXPORTER, spans are made but no exporter is attached."""
    provider = tracer_provider_from_environment({})
    assert provider._active_span_processor._span_processors == ()
    with provider.get_tracer("t").start_as_current_span("s") as span:
        assert span.get_span_context().is_valid
    provider.shutdown()


@pytest.mark.parametrize(
    "environ",
    [
        {"OTEL_TRACES_EXPORTER": "zipkin"},
        {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
    ],
    ids=["unknown exporter", "grpc protocol"],
)
def test_an_exporter_opgate_cannot_run_refuses_to_start(environ: dict[str, str]) -> None:
    """A misconfigured exporter stops start-up instead of silently exporting nothing."""
    with pytest.raises(ConfigurationError):
        tracer_provider_from_environment(environ)


async def test_otlp_exporter_sends_spans_to_the_configured_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OTEL_TRACES_EXPORTER=otlp with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: a collector on
    loopback receives the span as OTLP/HTTP protobuf."""
    received: list[tuple[str, bytes]] = []

    async def collect(request: web.Request) -> web.Response:
        received.append((request.content_type, await request.read()))
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/v1/traces", collect)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    try:
        port = sock.getsockname()[1]
        monkeypatch.setenv(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{port}/v1/traces"
        )
        telemetry = Telemetry(tracer_provider_from_environment({"OTEL_TRACES_EXPORTER": "otlp"}))
        with telemetry.tracer.start_as_current_span("opgate.agent_request"):
            pass
        # the exporter posts from its own thread, synchronously: keep this loop serving it
        assert await asyncio.to_thread(telemetry.provider.force_flush)
        await asyncio.to_thread(telemetry.shutdown)
    finally:
        await runner.cleanup()
    [(content_type, body)] = received
    assert content_type == "application/x-protobuf"
    assert b"opgate.agent_request" in body


@pytest.fixture
def log_buffer() -> Iterator[io.StringIO]:
    """opgate's real log processor chain, rendering into a buffer instead of stdout."""
    saved = structlog.get_config()
    buffer = io.StringIO()
    structlog.configure(
        processors=log_processors(),
        logger_factory=structlog.PrintLoggerFactory(buffer),
        cache_logger_on_first_use=False,
    )
    try:
        yield buffer
    finally:
        structlog.configure(**saved)


@pytest.mark.parametrize("sampled", ["01", "00"], ids=["agent samples", "agent does not sample"])
async def test_without_an_exporter_the_agents_trace_still_reaches_the_provider(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    log_buffer: io.StringIO,
    sampled: str,
) -> None:
    """With nothing exporting (spans are not recorded), the provider still gets a traceparent
    in the agent's trace with the agent's sampled flag, and the request's log line carries the
    trace id and a span id."""
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        observability = gate.running.gateway.observability
        assert observability is not None
        assert not observability.telemetry.exporting
        op = await gate.approve()
        status, _, _ = await gate.send(
            "/fault/v1/refunds",
            data="amount=500&currency=usd&charge=ch_1",
            headers={
                "X-Operation-Id": op["operation_id"],
                "traceparent": f"00-{trace_id}-{span_id}-{sampled}",
            },
        )
    assert status == 200
    [received] = fault_provider.requests
    version, sent_trace_id, parent_id, flags = received.headers["traceparent"].split("-")
    assert (version, sent_trace_id, flags) == ("00", trace_id, sampled)
    assert parent_id != span_id  # opgate's own span, a child of the agent's
    [line] = [
        json.loads(text)
        for text in log_buffer.getvalue().splitlines()
        if json.loads(text).get("event") == "request"
    ]
    assert (line["trace_id"], line["span_id"]) == (trace_id, parent_id)


@pytest.mark.parametrize("exporting", [False, True], ids=["nothing exports", "an exporter"])
async def test_a_request_without_a_traceparent_has_a_span_only_while_something_exports(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    log_buffer: io.StringIO,
    exporting: bool,
) -> None:
    """An agent request without a traceparent gets a span only while an exporter is attached:
    then its SERVER span is exported and its trace reaches the provider and the log line;
    with nothing exporting there is no trace to continue or send, so none of them has one."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    exporter = InMemorySpanExporter()
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        observability = gate.running.gateway.observability
        assert observability is not None
        if exporting:
            observability.telemetry.add_span_processor(SimpleSpanProcessor(exporter))
        op = await gate.approve()
        status, _, _ = await gate.send(
            "/fault/v1/refunds",
            data="amount=500&currency=usd&charge=ch_1",
            headers={"X-Operation-Id": op["operation_id"]},
        )
    assert status == 200
    [received] = fault_provider.requests
    [line] = [
        json.loads(text)
        for text in log_buffer.getvalue().splitlines()
        if json.loads(text).get("event") == "request"
    ]
    servers = [s for s in exporter.get_finished_spans() if s.kind.name == "SERVER"]
    if not exporting:
        assert "traceparent" not in received.headers
        assert line["trace_id"] is None  # the record's field: null
        assert "span_id" not in line
        assert servers == []
        return
    [server] = servers
    assert server.context is not None
    trace_id = format(server.context.trace_id, "032x")
    assert received.headers["traceparent"].split("-")[1] == trace_id
    assert (line["trace_id"], line["span_id"]) == (trace_id, format(server.context.span_id, "016x"))


def test_client_spans_use_the_stable_http_conventions_unless_asked_for_both() -> None:
    """OTEL_SEMCONV_STABILITY_OPT_IN has its documented effect: stable by default (opgate's
    choice), both with http/dup. Pins the instrumentation's private mode names."""
    from opentelemetry.instrumentation._semconv import _StabilityMode

    from proxy.observe.telemetry import http_semconv_mode

    assert http_semconv_mode({}) is _StabilityMode.HTTP
    assert http_semconv_mode({"OTEL_SEMCONV_STABILITY_OPT_IN": "http"}) is _StabilityMode.HTTP
    dup = {"OTEL_SEMCONV_STABILITY_OPT_IN": "database, http/dup"}
    assert http_semconv_mode(dup) is _StabilityMode.HTTP_DUP


def _outbound(url: str) -> OutboundRequest:
    return OutboundRequest("GET", url, CIMultiDict(), b"", 5.0, 5.0, 1 << 20)


async def test_provider_calls_carry_no_trace_config_until_something_exports() -> None:
    """An egress session has no aiohttp trace config while nothing exports (each call through
    it is still timed, by origin and outcome, and passes the trace on); once a processor is
    attached, the same session makes a CLIENT span per call."""
    app = web.Application()
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers["traceparent"])
        return web.Response(text="{}")

    app.router.add_get("/v1/x", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    origin = f"http://127.0.0.1:{sock.getsockname()[1]}"
    closed = socket.socket()  # bound, never listening: a connection to it is refused
    closed.bind(("127.0.0.1", 0))
    refused = f"http://127.0.0.1:{closed.getsockname()[1]}/v1/x"
    telemetry = Telemetry(tracer_provider_from_environment({}))
    timed: list[tuple[str, str]] = []
    session = telemetry.instrument(
        new_client_session(), lambda origin, outcome, _s: timed.append((origin, outcome))
    )
    exporter = InMemorySpanExporter()
    try:
        with telemetry.tracer.start_as_current_span("opgate.agent_request"):
            assert (await send(session, _outbound(origin + "/v1/x?q=1"))).status == 200
        with pytest.raises(UpstreamNotSent):
            await send(session, _outbound(refused))
        assert session.trace_configs == []
        telemetry.add_span_processor(SimpleSpanProcessor(exporter))
        assert len(session.trace_configs) == 1
        with telemetry.tracer.start_as_current_span("opgate.agent_request"):
            assert (await send(session, _outbound(origin + "/v1/x"))).status == 200
    finally:
        await session.close()
        await runner.cleanup()
        closed.close()
        telemetry.shutdown()
    assert timed == [
        (origin, "answer"),
        (refused.removesuffix("/v1/x"), "error"),
        (origin, "answer"),
    ]
    kinds = sorted(span.kind.name for span in exporter.get_finished_spans())
    assert kinds == ["CLIENT", "INTERNAL"]
    [client] = [s for s in exporter.get_finished_spans() if s.kind.name == "CLIENT"]
    assert client.context is not None
    assert seen[1].split("-")[2] == format(client.context.span_id, "016x")
    assert len(seen) == 2


@pytest.mark.parametrize(
    "traceparent",
    [
        None,
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
    ],
    ids=["no trace", "unsampled trace", "sampled trace"],
)
def test_a_server_span_is_the_one_the_sdk_would_make(traceparent: str | None) -> None:
    """While nothing exports, the request's span (made without the SDK's sampler when it will
    not be recorded) has the ids, flags, trace state and recording the SDK's own span has."""
    telemetry = Telemetry(tracer_provider_from_environment({}))
    headers = {"tracestate": "vendor=x"}
    if traceparent is not None:
        headers["traceparent"] = traceparent
    parent = telemetry.agent_context(headers)
    sdk_span = telemetry.tracer.start_span("opgate.agent_request", context=parent)
    with telemetry.server_span(parent, lambda: {"url.path": "/"}) as span:
        assert trace.get_current_span() is span
        made, expected = span.get_span_context(), sdk_span.get_span_context()
        assert made.is_valid
        assert span.is_recording() == sdk_span.is_recording()
        assert made.trace_flags == expected.trace_flags
        assert made.trace_state == expected.trace_state
        assert (made.trace_id == expected.trace_id) == (traceparent is not None)
        assert made.span_id != expected.span_id
    sdk_span.end()
    telemetry.shutdown()
