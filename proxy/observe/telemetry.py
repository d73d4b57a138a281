"""OpenTelemetry tracing: one server span per agent request, a client span per provider call.

Off by default: exported nowhere until ``OTEL_TRACES_EXPORTER`` names an exporter: ``console``,
or ``otlp`` (HTTP/protobuf, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables;
needs the ``opgate[otlp]`` extra). Each opgate instance has its own ``TracerProvider``; nothing
is set globally, so in-process instances (tests) stay apart.

While nothing exports, a request whose agent sent no ``traceparent`` gets no span at all
(``Telemetry.traces``); one that continues the agent's trace gets a span (so that its log lines
carry the trace and span ids, and the provider receives a child ``traceparent``), recorded only
if the agent's traceparent says its trace is sampled (``_RecordWhileExporting``): a
non-recording span still has valid ids but none of a recorded span's cost. Attaching a
processor (an exporter) turns recording on for every request, and puts the aiohttp client
instrumentation (CLIENT spans) on the egress sessions: until then they carry no trace config
at all. A provider call's latency and (while nothing exports) its ``traceparent`` are
``UpstreamCall``'s, observed inline by ``gate.upstream.send``.

Only W3C ``traceparent``/``tracestate`` are read from the agent: baggage is not, so an agent
cannot smuggle headers to the provider through the instrumentation's propagation.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import aiohttp
import yarl
from multidict import CIMultiDict
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.instrumentation._semconv import OTEL_SEMCONV_STABILITY_OPT_IN, _StabilityMode
from opentelemetry.instrumentation.aiohttp_client import create_trace_config
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ParentBased,
    Sampler,
    SamplingResult,
    _get_from_env_or_default,
)
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from proxy.errors import ConfigurationError

TRACER_NAME = "opgate"
_UpstreamDone = Callable[[str, str, float], None]
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


class _RecordWhileExporting(Sampler):
    """``OTEL_TRACES_SAMPLER``'s sampler (default: parent-based, always on) once a span
    processor is attached; until then, parent-based always-off: a span is recorded only to carry
    an agent's *sampled* flag on to the provider, every other span is a cheap non-recording one
    (still with valid trace and span ids)."""

    def __init__(self, configured: Sampler) -> None:
        self.exporting = False  # set when a span processor is attached
        self._configured = configured
        self._idle = ParentBased(ALWAYS_OFF)

    def should_sample(
        self,
        parent_context: otel_context.Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        sampler = self._configured if self.exporting else self._idle
        return sampler.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"RecordWhileExporting{{{self._configured.get_description()}}}"


def tracer_provider_from_environment(environ: Mapping[str, str] | None = None) -> TracerProvider:
    """A provider with the exporters ``OTEL_TRACES_EXPORTER`` names (none by default).
    Sampling follows ``OTEL_TRACES_SAMPLER`` (default: parent-based, always on) while something
    exports (see ``_RecordWhileExporting``)."""
    env = os.environ if environ is None else environ
    service = env.get("OTEL_SERVICE_NAME") or "opgate"
    # The SDK's own reading of OTEL_TRACES_SAMPLER (what TracerProvider does when given none);
    # private, so pinned by tests/observe/test_telemetry.py and test_observer.py exercising both
    # modes.
    sampler = _RecordWhileExporting(_get_from_env_or_default())
    provider = TracerProvider(resource=Resource.create({"service.name": service}), sampler=sampler)
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "none").split(",") if n.strip()]
    for name in names:
        if name != "none":
            provider.add_span_processor(BatchSpanProcessor(_exporter(name, env)))
            sampler.exporting = True
    return provider


def _without_query(url: yarl.URL) -> str:
    # A read's query string may carry customer data: spans get the path only.
    return str(url.with_query(None).with_fragment(None))


class Telemetry:
    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(TRACER_NAME)
        # The trace config lists of the sessions ``instrument`` was given.
        self._traced_sessions: list[list[aiohttp.TraceConfig]] = []

    @property
    def exporting(self) -> bool:
        sampler = self.provider.sampler
        return not isinstance(sampler, _RecordWhileExporting) or sampler.exporting

    def add_span_processor(self, processor: SpanProcessor) -> None:
        """Tests attach an in-memory exporter here; spans are recorded from then on."""
        self.provider.add_span_processor(processor)
        if isinstance(self.provider.sampler, _RecordWhileExporting):
            self.provider.sampler.exporting = True
        self._start_client_spans()

    def instrument(
        self, session: aiohttp.ClientSession, on_upstream_done: _UpstreamDone
    ) -> aiohttp.ClientSession:
        """Every call ``gate.upstream.send`` makes through ``session`` is observed inline
        (``UpstreamCall``: its latency until the answer's headers, the current span's
        traceparent), and the aiohttp client instrumentation (a CLIENT span per provider call,
        its own ``traceparent`` injected) goes on ``session`` from the moment something
        exports: until then ``session`` has no trace config at all, since a span would be
        dropped anyway."""
        _UPSTREAM_OBSERVERS[session] = _UpstreamObserver(self, on_upstream_done)
        self._traced_sessions.append(session.trace_configs)  # read by aiohttp per request
        if self.exporting:
            self._start_client_spans()
        return session

    def _start_client_spans(self) -> None:
        for configs in self._traced_sessions:
            if not configs:
                configs.append(self._client_instrumentation())

    def _client_instrumentation(self) -> aiohttp.TraceConfig:
        config = create_trace_config(
            url_filter=_without_query,
            request_hook=_tag_operation,
            tracer_provider=self.provider,
            sem_conv_opt_in_mode=http_semconv_mode(),
        )
        config.freeze()  # what the session does with the configs it is created with
        return config

    @contextlib.contextmanager
    def server_span(
        self, parent: otel_context.Context, attributes: Callable[[], Attributes]
    ) -> Iterator[trace.Span]:
        """The current span of one agent request, continuing ``parent`` (the agent's trace).
        A span that will not be recorded (nothing exports and the agent's trace is not
        sampled, i.e. almost always) is made here as the SDK would make it (the same ids,
        flags and trace state) without its sampler, its metrics or ``attributes`` (computed
        only for a recorded span): ~10 us of every request that nobody would see."""
        parent_context = trace.get_current_span(parent).get_span_context()
        if self.exporting or (parent_context.is_valid and parent_context.trace_flags.sampled):
            with self.tracer.start_as_current_span(
                "opgate.agent_request",
                context=parent,
                kind=SpanKind.SERVER,
                attributes=attributes(),
            ) as span:
                yield span
            return
        if parent_context.is_valid:
            trace_id, random = parent_context.trace_id, parent_context.trace_flags.random_trace_id
            state: TraceState | None = parent_context.trace_state
        else:
            ids = self.provider.id_generator
            trace_id, random, state = ids.generate_trace_id(), ids.is_trace_id_random(), None
        flags = TraceFlags(TraceFlags.RANDOM_TRACE_ID if random else TraceFlags.DEFAULT)
        span_id = self.provider.id_generator.generate_span_id()
        context = SpanContext(
            trace_id, span_id, is_remote=False, trace_flags=flags, trace_state=state
        )
        with trace.use_span(NonRecordingSpan(context), end_on_exit=False) as span:
            yield span

    def traces(self, headers: Mapping[str, str]) -> bool:
        """Whether an agent request gets a span: while something exports, or when the agent
        sent a ``traceparent`` (its trace continues, to the provider and in the log lines).
        Otherwise there is no trace to continue and nowhere to send a new one, and the
        request goes without: no span, no trace ids in its record and log line, no
        ``traceparent`` to the provider (~12% of opgate's CPU per approved operation,
        bench/README.md)."""
        return self.exporting or "traceparent" in headers

    def agent_context(self, headers: Mapping[str, str]) -> otel_context.Context:
        """The agent's trace context from its traceparent/tracestate, if it sent a valid one."""
        return _AGENT_PROPAGATOR.extract(headers)

    def shutdown(self) -> None:
        self.provider.shutdown()


class _UpstreamObserver:
    """What calls through one instrumented egress session report to (``Telemetry.instrument``)."""

    __slots__ = ("done", "telemetry")

    def __init__(self, telemetry: Telemetry, done: _UpstreamDone) -> None:
        self.telemetry, self.done = telemetry, done


# Each instrumented session's observer; a session closed and dropped leaves with its entry.
_UPSTREAM_OBSERVERS: weakref.WeakKeyDictionary[aiohttp.ClientSession, _UpstreamObserver] = (
    weakref.WeakKeyDictionary()
)


class UpstreamCall:
    """One provider call, observed inline by ``gate.upstream.send`` rather than by an aiohttp
    client middleware (aiohttp builds a middleware chain for every request: ~6% of opgate's
    CPU per approved operation, bench/README.md). Its latency until the answer's headers goes
    to the histogram (by origin, ``answer`` or ``error``) and, while nothing exports, the
    current span's ``traceparent`` (the agent's trace and its sampled flag) to the provider.
    (While something exports, the CLIENT span's instrumentation injects its own.)"""

    __slots__ = ("_observer", "_started", "_url")

    def __init__(self, session: aiohttp.ClientSession, url: yarl.URL) -> None:
        self._observer = _UPSTREAM_OBSERVERS.get(session)  # None: reported already, or never
        self._url = url
        self._started = time.monotonic()

    def headers(self, headers: CIMultiDict[str]) -> CIMultiDict[str]:
        """``headers`` as they are sent: with the current span's ``traceparent`` while
        nothing exports and a span is current (a copy then; the caller's are left as given)."""
        observer = self._observer
        if (
            observer is None
            or observer.telemetry.exporting
            or not trace.get_current_span().get_span_context().is_valid
        ):
            return headers
        sent = CIMultiDict(headers)
        propagate.inject(sent)
        return sent

    def answered(self) -> None:
        """The answer's headers have arrived."""
        self._report("answer")

    def ended(self) -> None:
        """The call is over: an ``error`` if no answer's headers arrived (whatever was raised:
        a timeout arrives as a cancellation)."""
        if self._observer is not None:
            self._report("error")

    def _report(self, outcome: str) -> None:
        observer = self._observer
        if observer is not None:
            self._observer = None  # once per call
            elapsed = time.monotonic() - self._started
            observer.done(str(self._url.origin()), outcome, elapsed)


def _tag_operation(span: trace.Span, params: aiohttp.TraceRequestStartParams) -> None:
    operation_id = params.headers.get("X-Operation-Id")
    if operation_id and span.is_recording():
        span.set_attribute("opgate.operation_id", operation_id)


def add_trace_ids(_logger: object, _method: str, event_dict: Any) -> Any:
    """structlog processor: the current span's trace and span ids, where there is one."""
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        event_dict.setdefault("trace_id", format(span_context.trace_id, "032x"))
        event_dict.setdefault("span_id", format(span_context.span_id, "016x"))
    return event_dict


def http_semconv_mode(environ: Mapping[str, str] | None = None) -> _StabilityMode:
    """The HTTP semantic conventions of CLIENT spans: the stable ones, unless
    ``OTEL_SEMCONV_STABILITY_OPT_IN`` asks for both (``http/dup``). The instrumentation's own
    default is the old ones (``http.method``, ``http.url``), and ``create_trace_config`` reads
    no environment: the mode must be passed (pinned by tests/observe/test_telemetry.py)."""
    value = (environ if environ is not None else os.environ).get(OTEL_SEMCONV_STABILITY_OPT_IN, "")
    wanted = {part.strip() for part in value.split(",")}
    return _StabilityMode.HTTP_DUP if "http/dup" in wanted else _StabilityMode.HTTP
