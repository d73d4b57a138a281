"""The canonical audit record: exactly one per agent request, emitted in a ``finally``.

Field names are constants (``AuditRecord`` attributes) shared by logs and, later, exports; a
reviewer filters on them. Nothing secret is ever assigned to a record: headers are never copied
in, only named facts; the forwarded body appears only as its SHA-256.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

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
    latency_ms: float | None = None

    def fields(self) -> dict[str, object]:
        data = asdict(self)
        data.pop("started_monotonic")
        data["latency_ms"] = round((time.monotonic() - self.started_monotonic) * 1000, 3)
        return data


def emit(record: AuditRecord) -> None:
    structlog.get_logger(AUDIT_LOGGER).info("request", **record.fields())
