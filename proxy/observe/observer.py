"""What one opgate process tells the outside: the audit log in PostgreSQL, traces, metrics and
redacted log lines. Built once per process by ``server.running`` and kept on the ``Gateway``.

The pipeline knows none of this: ``audit.emit`` hands each canonical record to the observer the
``observe_agent_request`` middleware installed for that request, which sets the server span's
attributes, counts it, and queues it for the audit log.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web
from opentelemetry import trace
from opentelemetry.trace import Status as SpanStatus
from opentelemetry.trace import StatusCode

from proxy.errors import StoreUnavailable
from proxy.observe.audit import AUDIT_SCHEMA_VERSION, REQUEST_OBSERVER, request_path
from proxy.observe.auditlog import records
from proxy.observe.auditlog.integrator import Integrator
from proxy.observe.auditlog.redact import Redactor, set_log_redactor
from proxy.observe.auditlog.storable import bounded_path, storable_text
from proxy.observe.auditlog.witnesses import Witnesses
from proxy.observe.auditlog.writer import Checkpointer, RequestRecordWriter
from proxy.observe.logs import bind_run
from proxy.observe.metrics import (
    CONTENT_TYPE,
    Counter,
    Histogram,
    exposition,
    gauge,
    process_metrics,
    python_metrics,
)
from proxy.observe.shared_metrics import Series, SharedCounts
from proxy.observe.sinks import SINK_NAMES, SINKS, SPAN
from proxy.observe.telemetry import Telemetry, tracer_provider_from_environment
from proxy.policy.budgets import BudgetScope
from proxy.policy.set import PolicySet
from proxy.settings import Secrets, Settings
from proxy.store.metrics import operation_counts
from proxy.store.store import Store
from proxy.transparency import note

# The secret's NAME (OPGATE_SECRET_AUDIT_KEY or <secrets_dir>/audit_key), not its value.
AUDIT_KEY_SECRET = "audit_key"  # noqa: S105
# The transparency log's Ed25519 signer key (PRIVATE+KEY+<origin>+...: docs/audit.md).
TRANSPARENCY_KEY_SECRET = "transparency_key"  # noqa: S105
_VERSION = version("opgate")
_UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Span attribute for each audit field that goes on the server span.
_SPAN_FIELDS = (
    "request_id",
    "agent_id",
    "tenant",
    "provider",
    "rule",
    "policy_version",
    "operation_id",
    "decision",
    "reason",
    "status_before",
    "status_after",
    "attempt",
    "provider_status",
)


def audit_key(credentials: Secrets) -> bytes | None:
    secret = credentials.secret(AUDIT_KEY_SECRET)
    return secret.encode("utf-8") if secret else None


def transparency_signer(credentials: Secrets) -> note.Signer | None:
    secret = credentials.secret(TRANSPARENCY_KEY_SECRET)
    return note.Signer.from_skey(secret) if secret else None


def configured_secrets(policy: PolicySet, credentials: Secrets) -> list[str]:
    """Every secret value this process holds: cut out of anything it writes anywhere."""
    names = {p.credential.secret for p in policy.providers if p.credential is not None}
    # webhook_key: the escalation webhooks' signing secret (proxy/recovery/webhooks.py)
    values = [
        credentials.secret(name)
        for name in sorted(names | {AUDIT_KEY_SECRET, TRANSPARENCY_KEY_SECRET, "webhook_key"})
    ]
    return [v for v in values if v]


class Observability:
    def __init__(self, settings: Settings, policy: PolicySet, credentials: Secrets):
        self.settings = settings
        self.policy_version = policy.version
        self.redactor = Redactor(
            settings.audit_redact_fields, secrets=configured_secrets(policy, credentials)
        )
        set_log_redactor(self.redactor)
        self.telemetry = Telemetry(tracer_provider_from_environment())
        self.key = audit_key(credentials)
        self.signer = transparency_signer(credentials)
        self._policy = policy
        self._store: Store | None = None
        self.writer: RequestRecordWriter | None = None
        self.checkpointer: Checkpointer | None = None
        self.integrator: Integrator | None = None
        self.witnesses: Witnesses | None = None
        self.requests = Counter(
            "opgate_requests_total",
            "Agent requests by decision and reason, and the provider and rule they matched.",
            ("decision", "reason", "provider", "rule"),
        )
        self.credential_echoes = Counter(
            "opgate_credential_echoes_total",
            "Provider answer headers dropped for carrying the credential opgate injected.",
            ("provider",),
        )
        self.reload_failures = Counter(
            "opgate_policy_reload_failures_total",
            "Policy reloads refused (the set that was serving keeps serving).",
        )
        self.upstream_seconds = Histogram(
            "opgate_upstream_seconds",
            "Provider call latency until the answer's headers, by upstream origin and outcome.",
            _UPSTREAM_BUCKETS,
            ("upstream", "outcome"),
        )
        # Under a supervisor, every worker's counts, whichever worker answers the scrape.
        self.shared = (
            SharedCounts(
                settings.metrics_dir,
                settings.instance_id,
                (
                    self.requests,
                    self.upstream_seconds,
                    self.reload_failures,
                    self.credential_echoes,
                ),
            )
            if settings.metrics_dir is not None
            else None
        )
        self._sharing: asyncio.Task[None] | None = None

    def instrument(self, session: aiohttp.ClientSession) -> aiohttp.ClientSession:
        """``session``'s provider calls observed (the latency histogram, the traceparent), and
        CLIENT spans on it whenever something exports (telemetry.py)."""
        return self.telemetry.instrument(session, self._observe_upstream)

    def _observe_upstream(self, origin: str, outcome: str, seconds: float) -> None:
        self.upstream_seconds.observe(seconds, origin, outcome)

    async def start(self, store: Store) -> None:
        """Start the audit writers and record this process's policy load."""
        self._store = store
        if self.shared is not None:
            self._sharing = asyncio.get_running_loop().create_task(self.shared.keep_written())
        self.writer = RequestRecordWriter(
            store,
            records.request_stream(self.settings.instance_id),
            redact=self.redactor.mapping,
            linger_seconds=self.settings.audit_linger_seconds,
            heartbeat_seconds=self.settings.audit_heartbeat_seconds,
        )
        self.writer.start()
        bind_run(self.writer.run_id)  # every log line names the run that numbers its records
        await self.record_policy_event("policy_loaded", self._policy, now_deciding=True)
        if self.key is not None:
            self.checkpointer = Checkpointer(
                store, self.key, self.settings.instance_id, self.settings.audit_checkpoint_seconds
            )
            self.checkpointer.start()
        if self.signer is not None:
            self.witnesses = Witnesses(store, self.settings.audit_witnesses)
            self.integrator = Integrator(
                store, self.signer, self.settings.audit_integrate_seconds, self.witnesses
            )
            self.integrator.start()

    async def record_policy_event(
        self,
        event: str,
        policy: PolicySet | None,
        *,
        now_deciding: bool,
        version: str | None = None,
        **fields: Any,
    ) -> None:
        """A policy (re)load record (``policy_loaded``, ``policy_reloaded`` or
        ``policy_reload_refused``); synchronous with the event, so a reload is on record
        before the new set decides anything."""
        assert self._store is not None, "start() first"
        if event == "policy_reload_refused":
            self.reload_failures.inc()
        record = {
            "schema_version": AUDIT_SCHEMA_VERSION,
            "time": datetime.now(UTC).isoformat(),
            "event": event,
            "policy_version": policy.version if policy else version,
            "actor": self.settings.instance_id,
            "providers": sorted(p.provider for p in policy.providers) if policy else None,
            "rules": sum(len(p.rules) for p in policy.providers) if policy else None,
            **self.redactor.mapping(fields),
        }
        instance = self.settings.instance_id
        await self._store.run(
            lambda conn: records.record_policy_event(
                conn, instance, record, now_deciding=now_deciding
            )
        )
        if now_deciding and policy is not None:  # the reload swaps the set right after this
            self.policy_version = policy.version
            self._policy = policy

    async def close(self) -> None:
        if self._sharing is not None:
            self._sharing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sharing
        if self.shared is not None:
            self.shared.close()
        if self.writer is not None:
            await self.writer.close()
        if self.checkpointer is not None:
            await self.checkpointer.close()
        if self.integrator is not None:
            await self.integrator.close()
        if self.witnesses is not None:
            await self.witnesses.close()
        self.telemetry.shutdown()

    def admit(self, fields: dict[str, Any]) -> None:
        """Before the request's log line: its number in this instance's sequence, or its
        place in a count of repeated denials (writer.py, denials.py). And its trace id: the
        record names its trace, so the console links it and a reviewer finds its spans."""
        _name_trace(fields)
        if self.writer is not None:
            self.writer.admit(fields)

    def audit_writer_problem(self) -> str | None:
        """Why this process cannot keep its audit trail right now (readiness), or None: its
        writer cannot store request records, or one of its sinks fails (sinks.py)."""
        writer = self.writer
        problems = [SINKS.problem()]
        if writer is not None and writer.stalled:
            problems.insert(
                0,
                f"the audit writer cannot store request records: {writer.pending} waiting, the"
                f" oldest for {writer.oldest_pending_seconds:.1f} s, {writer.dropped} dropped",
            )
        return "; ".join(p for p in problems if p) or None

    def sealing(self, fields: dict[str, Any]) -> bool:
        """Whether request records are stored; if so, the record's trace id (audit.seal)."""
        if self.writer is None:
            return False
        _name_trace(fields)
        return True

    def observe(self, fields: dict[str, Any], stored_json: str | None) -> None:
        """One canonical request record, redacted already and made the JSON it is stored as
        (audit.emit; None where JSON cannot hold it): span attributes, counters, the audit
        log."""
        # The audit log first: nothing after this can cost the stored record.
        if self.writer is not None:
            self.writer.submit(fields, redacted=True, text=stored_json)
        self.observe_stored(fields)

    def observe_stored(self, fields: dict[str, Any]) -> None:
        """Span attributes and counters of a record stored already (audit.emit_stored)."""
        try:
            span = trace.get_current_span()
            if span.is_recording():
                span.set_attributes(
                    {
                        f"opgate.{name}": fields[name]
                        for name in _SPAN_FIELDS
                        if fields.get(name) is not None
                    }
                )
            self.requests.inc(
                str(fields.get("decision")),
                str(fields.get("reason") or ""),
                str(fields.get("provider") or ""),
                str(fields.get("rule") or ""),
            )
            echoes = fields.get("credential_echoes")
            if echoes:
                self.credential_echoes.inc(str(fields.get("provider") or ""), amount=len(echoes))
        except Exception as exc:  # a sink's failure is counted, never the request's
            SINKS.failed(SPAN, exc)
        else:
            SINKS.wrote(SPAN)

    def queue(self, fields: dict[str, Any]) -> None:
        """A record of the request stream that is not a request's (audit.emit_undelivered),
        redacted and numbered already: for the audit log only."""
        if self.writer is not None:
            self.writer.submit(fields, redacted=True)

    async def metrics_text(self) -> str:
        own: list[Series] = [
            self.requests,
            self.upstream_seconds,
            self.reload_failures,
            self.credential_echoes,
        ]
        counted = self.shared.merged() if self.shared is not None else own
        blocks = [series.render() for series in counted]
        blocks.append(
            gauge(
                "opgate_build_info",
                "The running opgate's version (always 1).",
                [((_VERSION,), 1)],
                ("version",),
            )
        )
        blocks.append(
            gauge(
                "opgate_policy_info",
                "The policy set this process decides with (always 1; its digest as a label).",
                [((self.policy_version,), 1)],
                ("policy_version",),
            )
        )
        if self.writer is not None:
            blocks.extend(_writer_metrics(self.writer))
        sink_failures = Counter(
            "opgate_audit_sink_failures_total",
            "Writes to an audit sink that failed (log: the log lines on stdout; span: the"
            " request spans and counters); readiness fails while one does.",
            ("sink",),
        )
        for sink in SINK_NAMES:
            sink_failures.inc(sink, amount=SINKS.failures.get(sink, 0))
        blocks.append(sink_failures.render())
        if self._store is not None:
            size, idle, maximum = self._store.pool_usage()
            blocks.append(
                gauge(
                    "opgate_db_pool_connections",
                    "Database pool connections open, by state; in_use near "
                    "opgate_db_pool_max_connections means saturation.",
                    [(("in_use",), size - idle), (("idle",), idle)],
                    ("state",),
                )
            )
            blocks.append(
                gauge(
                    "opgate_db_pool_max_connections",
                    "The most connections this process's pool may open (pool_max_size).",
                    [((), maximum)],
                )
            )
            blocks.extend(await self._operation_gauges(self._store))
            blocks.extend(await self._budget_gauges(self._store))
        # the process answering the scrape (one worker of several: docs/audit.md, Metrics)
        blocks.extend(process_metrics())
        blocks.extend(python_metrics())
        return exposition(blocks)

    async def _operation_gauges(self, store: Store) -> list[list[str]]:
        age = self.settings.metrics_dispatched_after_seconds
        try:
            counts = await operation_counts(store, age)
        except (StoreUnavailable, asyncpg.PostgresError):
            return [
                gauge("opgate_store_up", "Whether the database answered the scrape.", [((), 0)])
            ]
        return [
            gauge("opgate_store_up", "Whether the database answered the scrape.", [((), 1)]),
            gauge(
                "opgate_operations",
                "Unsettled operations by status.",
                [(("created",), counts.created), (("dispatched",), counts.dispatched)],
                ("status",),
            ),
            gauge(
                "opgate_operations_dispatched_too_long",
                f"Operations dispatched more than {age:g} seconds ago and still unsettled.",
                [((), counts.dispatched_old)],
            ),
            gauge(
                "opgate_escalations_open",
                "Dispatched operations escalated to a human and awaiting a verdict.",
                [((), counts.escalated)],
            ),
            gauge(
                "opgate_proposals_pending",
                "Agents' proposals waiting for an approver (not yet expired).",
                [((), counts.proposals_pending)],
            ),
        ]

    async def _budget_gauges(self, store: Store) -> list[list[str]]:
        """Each budget's limit, and what is left of it for every key that spent anything in
        its window (a tenant or agent not listed has all of it). Read without the budget's
        lock: what a claim would see a moment ago."""
        limits: list[tuple[list[str], float]] = []
        remaining: list[tuple[list[str], float]] = []
        try:
            for provider in self._policy.providers:
                for budget in provider.budgets:
                    scope = budget.scope.value
                    labels = [provider.provider, scope, budget.currency, budget.window]
                    limits.append((labels, budget.limit))
                    spent = await store.budget_spent_by_key(
                        provider.provider,
                        budget.currency,
                        budget.window_seconds,
                        tenant=budget.scope is not BudgetScope.PROVIDER,
                        agent=budget.scope is BudgetScope.AGENT,
                    )
                    if budget.scope is BudgetScope.PROVIDER and not spent:
                        spent = [(None, None, 0)]
                    remaining.extend(
                        ([*labels, tenant or "", agent or ""], max(0, budget.limit - used))
                        for tenant, agent, used in spent
                    )
        except (StoreUnavailable, asyncpg.PostgresError):
            return []  # opgate_store_up says why
        if not limits:
            return []
        names = ("provider", "scope", "currency", "window")
        return [
            gauge(
                "opgate_budget_limit", "Each spend budget's limit, in minor units.", limits, names
            ),
            gauge(
                "opgate_budget_remaining",
                "What is left of a spend budget in its window, in minor units, per tenant or "
                "agent that spent anything (tenant and agent empty for a provider budget).",
                remaining,
                (*names, "tenant", "agent"),
            ),
        ]


def _total(name: str, help_text: str, value: float) -> list[str]:
    counter = Counter(name, help_text)
    counter.inc(amount=value)
    return counter.render()


def _writer_metrics(writer: RequestRecordWriter) -> list[list[str]]:
    return [
        gauge(
            "opgate_audit_records_pending",
            "Request records queued for the audit log.",
            [((), writer.pending)],
        ),
        gauge(
            "opgate_audit_oldest_pending_seconds",
            "How long the oldest queued request record has waited (0 when none waits).",
            [((), round(writer.oldest_pending_seconds, 3))],
        ),
        gauge(
            "opgate_audit_writer_stalled",
            "1 while records wait and none has been stored for the stall time; readiness fails.",
            [((), 1 if writer.stalled else 0)],
        ),
        _total(
            "opgate_audit_records_dropped_total",
            "Request records that never reached the audit log (they are in the log stream).",
            writer.dropped,
        ),
        _total(
            "opgate_audit_write_failures_total",
            "Failed attempts to store a batch of request records (each is retried).",
            writer.failures,
        ),
        _total(
            "opgate_audit_records_unstorable_total",
            "Request records the database refused, stored as placeholders with their SHA-256.",
            writer.unstorable,
        ),
        _total(
            "opgate_audit_denials_aggregated_total",
            "Pre-authentication denials counted into a denials record instead of stored whole.",
            writer.aggregated,
        ),
    ]


def _span_path(request: web.Request) -> str:
    path, _ = bounded_path(request_path(request.raw_path))
    return storable_text(path)


# The process's observability on each listener's app, set by the server (absent in bare setups).
OBSERVABILITY = web.AppKey("observability", Observability)


def _name_trace(fields: dict[str, Any]) -> None:
    """The record's trace id, from the current span (unless it names one already)."""
    context = trace.get_current_span().get_span_context()
    if fields.get("trace_id") is None and context.is_valid:
        fields["trace_id"] = format(context.trace_id, "032x")


@web.middleware
async def observe_agent_request(request: web.Request, handler: Any) -> web.StreamResponse:
    """The SERVER span of an agent request, continuing the agent's W3C trace if it sent one;
    no span at all where there is no trace to continue and nowhere to send one."""
    observability = request.app.get(OBSERVABILITY)
    if observability is None:
        response: web.StreamResponse = await handler(request)
        return response
    telemetry = observability.telemetry
    token = REQUEST_OBSERVER.set(observability)
    try:
        if not telemetry.traces(request.headers):
            response = await handler(request)
        else:
            with telemetry.server_span(
                telemetry.agent_context(request.headers), lambda: _server_attributes(request)
            ) as span:
                response = await handler(request)
                span.set_attribute("http.response.status_code", response.status)
                if response.status >= 500:  # includes every unknown outcome (502, 504)
                    span.set_status(SpanStatus(StatusCode.ERROR))
    finally:
        REQUEST_OBSERVER.reset(token)
    return response


def _server_attributes(request: web.Request) -> dict[str, str | int]:
    """The stable HTTP semantic conventions of a SERVER span. The path is the raw one, bounded,
    as in the audit record: decoded, it can hold a NUL or worse."""
    attributes: dict[str, str | int] = {
        "http.request.method": request.method,
        "url.path": _span_path(request),
        "url.scheme": request.scheme,
        "http.route": request.match_info.route.resource.canonical
        if request.match_info.route.resource is not None
        else request.path,
    }
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        attributes["server.address"], attributes["server.port"] = str(sockname[0]), sockname[1]
    return attributes


async def metrics(request: web.Request) -> web.Response:
    observability = request.app.get(OBSERVABILITY)
    text = await observability.metrics_text() if observability else ""
    return web.Response(body=text.encode("utf-8"), headers={"Content-Type": CONTENT_TYPE})


def add_metrics_route(app: web.Application) -> None:
    app.router.add_get("/metrics", metrics)
