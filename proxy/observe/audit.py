"""The canonical audit record: exactly one per agent request, emitted in a ``finally``.

Field names are constants (``AuditRecord`` attributes) shared by logs and, later, exports; a
reviewer filters on them. Nothing secret is ever assigned to a record: headers are never copied
in, only named facts; the forwarded body appears only as its SHA-256.

``emit`` first lets the request's observer number the record (``instance_seq``) or count it
into a ``denials`` record (``aggregated``), then hands it on (queued for the PostgreSQL audit
log before anything else, then the span and counters), then writes the log line: the log line
and the stored record carry the same number, and are the same JSON. The record of a request
that claimed its operation is instead ``seal``-ed: made before the statement that records the
operation's outcome, which stores it in the operation's stream (migration 0022), and then
``emit_stored``: the span, counters and log line, the same JSON, without a number.

No sink's failure (stdout gone: EPIPE, ENOSPC; a span exporter's bug) reaches the caller or
costs the stored record: it is counted and fails readiness (sinks.py).
"""

from __future__ import annotations

import secrets
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from proxy.observe.auditlog.records import record_text
from proxy.observe.auditlog.redact import ALREADY_REDACTED, redact_record
from proxy.observe.auditlog.storable import bounded_path, storable
from proxy.observe.logs import PrerenderedWriter, prerendered_writer
from proxy.observe.sinks import LOG, SINKS

AUDIT_LOGGER = "opgate.audit"
AUDIT_SCHEMA_VERSION = 1


class Decision:
    """The ``decision`` field's values."""

    ALLOW = "allow"  # forwarded
    DENY = "deny"  # rejected by a check, nothing forwarded
    REPLAY = "replay"  # confirmed operation, stored answer returned, nothing forwarded
    ERROR = "error"  # could not decide or could not forward (store down, outcome unknown...)


def new_request_id() -> str:
    """A request's id in its record: random, so no two requests share one across processes."""
    return secrets.token_hex(8)


@dataclass
class AuditRecord:
    request_id: str = field(default_factory=new_request_id)
    started_monotonic: float = field(default_factory=time.monotonic, repr=False)
    time: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    schema_version: int = AUDIT_SCHEMA_VERSION
    # What the record is, in the log line (structlog's event) and in the stored record alike.
    event: str = "request"
    listener: str = "agent"
    # The address the request came from (the TCP peer): what repeated unauthenticated denials
    # are counted by.
    source: str | None = None
    method: str | None = None
    # Raw, as sent (percent-encoded, without the query); cut at 512 bytes, and then
    # path_sha256 is the SHA-256 of the whole path (see fields()).
    path: str | None = None
    path_sha256: str | None = None
    # SHA-256 of the raw query string as sent (null without one): the query's values are not
    # kept, as the body's are not (gate.intake.query_sha256).
    query_sha256: str | None = None
    agent_id: str | None = None
    tenant: str | None = None
    provider: str | None = None
    rule: str | None = None
    policy_version: str | None = None
    operation_id: str | None = None
    decision: str = Decision.DENY  # deny until proven otherwise
    reason: str | None = None
    status_before: str | None = None
    status_after: str | None = None
    attempt: int | None = None
    provider_status: int | None = None
    response_status: int | None = None
    forwarded_body_sha256: str | None = None
    # SHA-256 of the provider's answer body as received (for an operation it settled: exactly
    # what the row stores and replays), or, on a replay, of the stored answer returned: what
    # an offline bundle checks the stored answer against (auditlog/evidence.py).
    provider_answer_sha256: str | None = None
    # The provider's answer headers dropped because they carried the credential opgate
    # injected (their names; never their values): a provider echoing its secret. Null if none.
    credential_echoes: list[str] | None = None
    # Shadow mode (`mode: report`): the code an enforcing rule would have refused with, though
    # the request was decided as `decision` (forwarded or replayed). Null otherwise.
    would_deny: str | None = None
    # The rule's precondition lookups made before the claim and what each assertion read on
    # the provider's answer (proxy/gate/preconditions.py); null when none was due.
    precondition: dict[str, Any] | None = None
    # A signed mandate presented as the approval (proxy/mandates/): its digest, AP2 reference,
    # issuer, the presentation as received (disclosures included) and the issuer's public keys
    # then trusted, so that a dispute can be answered later without opgate. Set once.
    mandate: dict[str, Any] | None = None
    # An x402 payment sent for the operation (proxy/gate/x402_pay.py): its payload's digest,
    # nonce, payer, payee, amount, asset, network, validBefore, who signed it and the
    # settlement's transaction once the provider reported one. Null when none was sent.
    payment: dict[str, Any] | None = None
    # Forward-proxy mode (listener "forward"): the host:port the agent addressed; for a CONNECT
    # record, how it was tunnelled ("inspected" or "pass_through") and, for pass-through, the
    # bytes each way (nothing else about an opaque tunnel is known).
    destination: str | None = None
    tunnel: str | None = None
    bytes_from_agent: int | None = None
    bytes_to_agent: int | None = None
    latency_ms: float | None = None
    # This instance's number for the stored record (1, 2, 3... per process run; the log line
    # and the stored record share it), set by the observer; null when the request is counted
    # into a `denials` record instead (aggregated: true).
    instance_seq: int | None = None
    aggregated: bool | None = None
    # The request's W3C trace id (32 hex digits), set by the observer from the server span;
    # null without one (nothing exports and the agent sent no traceparent: telemetry.py).
    trace_id: str | None = None

    def fields(self) -> dict[str, Any]:
        # Every field is a scalar or (precondition, mandate, payment) a dict never changed once
        # set: a shallow copy is what asdict's recursive copy would give, at a fraction of its
        # cost (this runs once per request).
        data = dict(vars(self))
        data.pop("started_monotonic")
        data["latency_ms"] = round((time.monotonic() - self.started_monotonic) * 1000, 3)
        if isinstance(self.path, str):
            data["path"], data["path_sha256"] = bounded_path(self.path)
        fields: dict[str, Any] = storable(data)
        return fields


def request_path(raw_target: str) -> str:
    """The path of a request target as sent, without its query: origin-form (``/a%2Fb?q``)
    or absolute-form (``http://host/a?q``, forward-proxy mode)."""
    target = raw_target.partition("?")[0].partition("#")[0]
    if target.startswith("/"):
        return target
    scheme, separator, rest = target.partition("://")
    if not separator or not scheme.isalpha():
        return target
    slash = rest.find("/")
    return "/" if slash < 0 else rest[slash:]


class RequestObserver(Protocol):
    """What the observer's middleware (observer.py) installs for each request."""

    def admit(self, fields: dict[str, Any]) -> None:
        """Number the record (``instance_seq``) or count it (``aggregated``), before it is
        logged."""

    def observe(self, fields: dict[str, Any], stored_json: str | None) -> None:
        """The audit table first (``stored_json``: what is stored, None where JSON cannot
        hold the record), then span attributes and metrics: before it is logged. Raises
        nothing."""

    def queue(self, fields: dict[str, Any]) -> None:
        """A record of the request stream that is not a request's (``record_type``), numbered
        by ``admit`` already: queued for the audit table only."""

    def sealing(self, fields: dict[str, Any]) -> bool:
        """Whether request records are stored (a writer runs); if so, gives the record its
        trace id, as ``admit`` does, but no number: the statement that records its
        operation's outcome stores it instead (``seal``)."""

    def observe_stored(self, fields: dict[str, Any]) -> None:
        """``observe`` for a record already stored (``seal``): span attributes and counters."""


REQUEST_OBSERVER: ContextVar[RequestObserver | None] = ContextVar(
    "opgate_request_observer", default=None
)


class _AuditLogger:
    """The audit line's writer, made once per structlog configuration: under the one
    ``configure_logging`` installed, the record's stored JSON with the line's own fields
    (logs.py); under any other, a bound logger (a lazy ``get_logger`` per request would build
    a logger factory's logger, a wrapper and a bind each time). A configuration change (tests
    capture lines by reconfiguring) is followed from the next line on."""

    def __init__(self) -> None:
        self._made_for: tuple[Any, ...] = ()  # held, so that no id is reused meanwhile
        self._logger: Any = None
        self._prerendered: PrerenderedWriter | None = None

    def write(self, fields: dict[str, Any], stored_json: str | None) -> None:
        config = structlog.get_config()
        values = tuple(config.values())
        if len(values) != len(self._made_for) or any(
            now is not then for now, then in zip(values, self._made_for, strict=True)
        ):
            self._logger = structlog.get_logger(AUDIT_LOGGER).bind()
            self._prerendered = prerendered_writer(config)
            self._made_for = values
        if self._prerendered is not None and stored_json is not None:
            self._prerendered(stored_json, fields)
            return
        token = ALREADY_REDACTED.set(True)
        try:
            self._logger.info(**fields)  # the event: "request"
        finally:
            ALREADY_REDACTED.reset(token)


_audit_logger = _AuditLogger()


def stored_json(fields: dict[str, Any]) -> str | None:
    """The JSON a record is stored as (auditlog/records.py), or None where JSON cannot hold
    it (the writer then stores a placeholder, and the log line is rendered by structlog)."""
    try:
        return record_text(fields)
    except (ValueError, TypeError, RecursionError):
        return None


def emit(record: AuditRecord) -> None:
    fields = record.fields()
    observer = REQUEST_OBSERVER.get()
    if observer is not None:
        observer.admit(fields)
    # Redacted once and turned into JSON once, here, for every sink: the log line, the span,
    # the audit log.
    redacted = redact_record(fields)
    text = stored_json(redacted)
    # The audit log first: once queued, the record is on its way to PostgreSQL whatever the
    # other sinks do (the observer guards the span and counters itself).
    if observer is not None:
        observer.observe(redacted, text)
    _write_line(redacted, text)


@dataclass(frozen=True)
class Sealed:
    """A request's record as it is stored (redacted, and its JSON), made for the statement
    that records its operation's outcome to store (queries.sql settle_operation)."""

    fields: dict[str, Any]
    text: str


def seal(record: AuditRecord) -> Sealed | None:
    """``record`` made ready for the statement that records its operation's outcome, or None
    where it cannot go that way (no audit log is kept; JSON cannot hold it): ``emit`` it then.
    Not numbered (``instance_seq`` null): it is stored in the operation's stream, not by this
    instance's writer, whose numbering accounts only for the records the writer stores."""
    observer = REQUEST_OBSERVER.get()
    if observer is None:
        return None
    fields = record.fields()
    if not observer.sealing(fields):
        return None
    redacted = redact_record(fields)
    text = stored_json(redacted)
    return None if text is None else Sealed(redacted, text)


def emit_stored(sealed: Sealed) -> None:
    """The sinks of a record the outcome's statement has stored: the span and counters, then
    the log line (the same JSON as the stored record)."""
    observer = REQUEST_OBSERVER.get()
    if observer is not None:
        observer.observe_stored(sealed.fields)
    _write_line(sealed.fields, sealed.text)


def _write_line(fields: dict[str, Any], text: str | None) -> None:
    """The log line; stdout's own errors are caught where it is written (logs.py), anything
    else a logging configuration raises is caught here."""
    try:
        _audit_logger.write(fields, text)
    except Exception as exc:
        SINKS.failed(LOG, exc)


class Undelivered:
    """Why an answer did not reach the agent in full (``answer_undelivered`` records)."""

    WRITE_TIMEOUT = "answer_write_timeout"  # not taken within answer_write_timeout_seconds
    AGENT_DISCONNECTED = "agent_disconnected"  # the connection went while it was written


def emit_undelivered(record: AuditRecord, reason: str) -> None:
    """The answer to a request whose record was emitted already (and may be stored already,
    so it is never changed) did not reach the agent in full: a record of its own, numbered in
    the same sequence, naming the request by its ``request_id``."""
    fields: dict[str, Any] = {
        "schema_version": AUDIT_SCHEMA_VERSION,
        "record_type": "answer_undelivered",
        "event": "answer_undelivered",
        "time": datetime.now(UTC).isoformat(),
        "request_id": record.request_id,
        "listener": record.listener,
        "agent_id": record.agent_id,
        "operation_id": record.operation_id,
        "response_status": record.response_status,
        "reason": reason,
    }
    observer = REQUEST_OBSERVER.get()
    if observer is not None:
        observer.admit(fields)
    redacted = redact_record(fields)
    if observer is not None:
        observer.queue(redacted)
    _write_line(redacted, stored_json(redacted))
