"""The canonical audit record: exactly one per agent request, emitted in a ``finally``.

Field names are constants (``AuditRecord`` attributes) shared by logs and, later, exports; a
reviewer filters on them. Nothing secret is ever assigned to a record: headers are never copied
in, only named facts; the forwarded body appears only as its SHA-256.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

AUDIT_LOGGER = "opgate.audit"
AUDIT_SCHEMA_VERSION = 1


class Decision:
    """The ``decision`` field's values."""

    ALLOW = "allow"  # forwarded
    DENY = "deny"  # rejected by a check, nothing forwarded
    REPLAY = "replay"  # confirmed operation, stored answer returned, nothing forwarded
    ERROR = "error"  # could not decide or could not forward (store down, outcome unknown...)


@dataclass
class AuditRecord:
    request_id: str
    started_monotonic: float = field(default_factory=time.monotonic, repr=False)
    time: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    schema_version: int = AUDIT_SCHEMA_VERSION
    listener: str = "agent"
    method: str | None = None
    path: str | None = None
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
    # Shadow mode (`mode: report`): the code an enforcing rule would have refused with, though
    # the request was decided as `decision` (forwarded or replayed). Null otherwise.
    would_deny: str | None = None
    # Forward-proxy mode (listener "forward"): the host:port the agent addressed; for a CONNECT
    # record, how it was tunnelled ("inspected" or "pass_through") and, for pass-through, the
    # bytes each way (nothing else about an opaque tunnel is known).
    destination: str | None = None
    tunnel: str | None = None
    bytes_from_agent: int | None = None
    bytes_to_agent: int | None = None
    latency_ms: float | None = None

    def fields(self) -> dict[str, object]:
        # Every field is a scalar: a shallow copy is what asdict's recursive copy would give,
        # at a fraction of its cost (this runs once per request).
        data = dict(vars(self))
        data.pop("started_monotonic")
        data["latency_ms"] = round((time.monotonic() - self.started_monotonic) * 1000, 3)
        return data


# Set per request by the observer's middleware (observer.py): span attributes, metrics, the
# audit table.
REQUEST_OBSERVER: ContextVar[Callable[[dict[str, Any]], None] | None] = ContextVar(
    "opgate_request_observer", default=None
)


def emit(record: AuditRecord) -> None:
    fields = record.fields()
    structlog.get_logger(AUDIT_LOGGER).info("request", **fields)
    observer = REQUEST_OBSERVER.get()
    if observer is not None:
        observer(fields)
