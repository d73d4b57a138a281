"""OpenTelemetry tracing: one server span per agent request, a client span per provider call.

Off by default: spans are made (so that log lines carry trace and span ids, and the provider
receives a child ``traceparent``) but exported nowhere until ``OTEL_TRACES_EXPORTER`` names an
exporter: ``console``, or ``otlp`` (HTTP/protobuf, configured by the standard
``OTEL_EXPORTER_OTLP_*`` variables; needs the ``opgate[otlp]`` extra). Each opgate instance has
its own ``TracerProvider``; nothing is set globally, so in-process instances (tests) stay apart.

Only W3C ``traceparent``/``tracestate`` are read from the agent: baggage is not, so an agent
cannot smuggle headers to the provider through the instrumentation's propagation.
"""

from __future__ import annotations

import os
import time
import types
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import yarl
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.aiohttp_client import create_trace_config
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy.errors import ConfigurationError

TRACER_NAME = "opgate"
_AGENT_PROPAGATOR = TraceContextTextMapPropagator()


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    if name == "otlp":
        protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        if protocol != "http/protobuf":
            raise ConfigurationError(f"OTLP protocol {protocol!r}: opgate exports http/protobuf")
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigurationError(
                "OTEL_TRACES_EXPORTER=otlp needs the OTLP exporter: pip install 'opgate[otlp]'"
            ) from exc
        return OTLPSpanExporter()
    raise ConfigurationError(f"OTEL_TRACES_EXPORTER: unknown exporter {name!r}")


def tracer_provider_from_environment(environ: Mapping[str, str] | None = None) -> TracerProvider:
    """A provider with the exporters ``OTEL_TRACES_EXPORTER`` names (none by default).
    Sampling follows ``OTEL_TRACES_SAMPLER`` (default: parent-based, always on)."""
    env = os.environ if environ is None else environ
    service = env.get("OTEL_SERVICE_NAME") or "opgate"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "none").split(",") if n.strip()]
    for name in names:
        if name != "none":
            provider.add_span_processor(BatchSpanProcessor(_exporter(name, env)))
    return provider


def _without_query(url: yarl.URL) -> str:
    # A read's query string may carry customer data: spans get the path only.
    return str(url.with_query(None).with_fragment(None))


class Telemetry:
    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(TRACER_NAME)

    def add_span_processor(self, processor: SpanProcessor) -> None:
        """Tests attach an in-memory exporter here."""
        self.provider.add_span_processor(processor)

    def client_trace_configs(
        self, on_upstream_done: Callable[[str, str, float], None]
    ) -> list[aiohttp.TraceConfig]:
        """The aiohttp client instrumentation (a CLIENT span per provider call, its own
        ``traceparent`` injected) and a timer for the upstream latency histogram."""
        instrumentation = create_trace_config(
            url_filter=_without_query, request_hook=_tag_operation, tracer_provider=self.provider
        )
        return [instrumentation, _latency_trace_config(on_upstream_done)]

    def agent_context(self, headers: Mapping[str, str]) -> otel_context.Context:
        """The agent's trace context from its traceparent/tracestate, if it sent a valid one."""
        return _AGENT_PROPAGATOR.extract(headers)

    def shutdown(self) -> None:
        self.provider.shutdown()


def _tag_operation(span: trace.Span, params: aiohttp.TraceRequestStartParams) -> None:
    operation_id = params.headers.get("X-Operation-Id")
    if operation_id and span.is_recording():
        span.set_attribute("opgate.operation_id", operation_id)


def _latency_trace_config(on_done: Callable[[str, str, float], None]) -> aiohttp.TraceConfig:
    config = aiohttp.TraceConfig()

    async def started(_: Any, ctx: types.SimpleNamespace, params: Any) -> None:
        ctx.opgate_started = time.monotonic()
        ctx.opgate_origin = str(params.url.origin())

    async def ended(_: Any, ctx: types.SimpleNamespace, params: Any) -> None:
        on_done(ctx.opgate_origin, "answer", time.monotonic() - ctx.opgate_started)

    async def failed(_: Any, ctx: types.SimpleNamespace, params: Any) -> None:
        on_done(ctx.opgate_origin, "error", time.monotonic() - ctx.opgate_started)

    config.on_request_start.append(started)
    config.on_request_end.append(ended)
    config.on_request_exception.append(failed)
    return config


def add_trace_ids(_logger: object, _method: str, event_dict: Any) -> Any:
    """structlog processor: the current span's trace and span ids, where there is one."""
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        event_dict.setdefault("trace_id", format(span_context.trace_id, "032x"))
        event_dict.setdefault("span_id", format(span_context.span_id, "016x"))
    return event_dict
