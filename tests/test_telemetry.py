"""Tracing configuration by the standard OTEL_* variables: off by default, OTLP on demand."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web

from proxy.errors import ConfigurationError
from proxy.telemetry import Telemetry, tracer_provider_from_environment


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
