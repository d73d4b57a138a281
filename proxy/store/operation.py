"""The authoritative operation row, as the pure checks and the APIs see it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    CREATED = "created"
    DISPATCHED = "dispatched"
    CONFIRMED = "confirmed"
    FAILED = "failed"


# Not settled yet: an agent or a human may still act on the operation. The one definition, in
# SQL opgate_unsettled (migration 0016; tests/store/test_conditions.py keeps them equal).
UNSETTLED = frozenset({Status.CREATED, Status.DISPATCHED})

# The statuses each listing filter (the operations API's and the console's ``status=``) names.
STATUS_FILTERS: dict[str, list[str]] = {
    "unsettled": [s.value for s in Status if s in UNSETTLED],
    "all": [s.value for s in Status],
    **{s.value: [s.value] for s in Status},
}


class LastOutcome(StrEnum):
    """Why a dispatched operation has no live attempt (``last_outcome`` column)."""

    NOT_SENT = "not_sent"  # the connection to the provider never opened: no byte left
    UNKNOWN_TIMEOUT = "unknown:timeout"
    UNKNOWN_DROPPED = "unknown:dropped"
    UNKNOWN_STATUS = "unknown:status"  # e.g. a 5xx
    UNKNOWN_TRUNCATED = "unknown:truncated"
    CONFIRMED = "confirmed"
    FAILED = "failed"


@dataclass(frozen=True)
class Approval:
    """The one exact request an approval allows, field by field: whose (tenant, agent_id), to
    which provider's rule (action) and target (method, path, path_params), for how much
    (amount in minor units, currency), with which approved params, under which idempotency
    key, as operation_id. Defined here once: the row to insert (``store.NewOperation``), the
    operation row (``Operation``) and a proposal (``proposal.Proposal``) are one with these
    fields; the statements that write them (queries.sql), the operations API's request model
    and the documented request are checked against them (tests/store/test_approval_fields.py)."""

    operation_id: str
    tenant: str
    agent_id: str | None
    provider: str
    action: str
    method: str
    path: str
    path_params: dict[str, str]
    amount: int | None
    currency: str | None
    params: dict[str, Any]
    idempotency_key: str

    def request_public(self) -> dict[str, Any]:
        """The request, as every public shape (operation, proposal) shows it; the key aside (a
        proposal does not show it)."""
        return {
            "operation_id": self.operation_id,
            "tenant": self.tenant,
            "agent_id": self.agent_id,
            "provider": self.provider,
            "action": self.action,
            "target": {"method": self.method, "path": self.path, "path_params": self.path_params},
            "amount": self.amount,
            "currency": self.currency,
            "params": self.params,
        }


@dataclass(frozen=True)
class Approved(Approval):
    """An approval as given: its reference (a ticket, a proposal, a mandate), by whom, until
    when."""

    approval_ref: str
    approved_by: str
    expires_at: datetime


@dataclass(frozen=True)
class Operation(Approved):
    """The authoritative row: the approval, and what became of it."""

    status: Status
    revoked_at: datetime | None
    revoked_reason: str | None
    attempts: int
    dispatched_at: datetime | None
    lease_owner: str | None
    lease_until: datetime | None
    last_outcome: str | None
    provider_status: int | None
    provider_object_id: str | None
    response_content_type: str | None
    response_body: bytes | None
    settled_at: datetime | None
    created_at: datetime
    updated_at: datetime
    attempt_ended_at: datetime | None
    settled_reason: str | None
    supersedes: str | None
    reconcile_attempts: int
    reconcile_lease_until: datetime | None
    next_reconcile_at: datetime | None
    escalated_at: datetime | None
    escalation_reason: str | None
    resolution_note: str | None
    # How many attempts ended before a byte left (not_sent): while it equals ``attempts``,
    # nothing of the operation can have reached the provider.
    unsent_attempts: int
    # The database's clock when the row was read: every time comparison uses it, so opgate
    # replicas with skewed clocks decide alike.
    read_at: datetime
    # When a timeline switch of the database (a failover) was seen while this operation was
    # created or dispatched (None: never, or looked up since): it may have been claimed and sent
    # on the lost timeline, and is looked up at the provider before its next send (migration
    # 0014, queries.sql timeline_seen).
    lookup_before_send: datetime | None = None

    def lease_is_live(self) -> bool:
        return self.lease_until is not None and self.lease_until > self.read_at

    def reconciliation_is_live(self) -> bool:
        return self.reconcile_lease_until is not None and self.reconcile_lease_until > self.read_at

    def approval_stands(self) -> bool:
        return self.revoked_at is None and self.expires_at > self.read_at

    def key_deduplicated(self, window_seconds: float | None) -> bool:
        """Whether the provider still deduplicates a re-send with this operation's key: within
        its retention (``window_seconds``, None if it does not deduplicate), counted from the
        row's creation, before which the key was never sent."""
        if window_seconds is None:
            return False
        return self.read_at < self.created_at + timedelta(seconds=window_seconds)

    def unsettled(self) -> bool:
        return self.status in UNSETTLED

    def nothing_left_yet(self) -> bool:
        """Not settled, and nothing of it can have reached the provider (SQL:
        opgate_nothing_left_yet, migration 0016): what a failed precondition is kept for."""
        return self.unsettled() and self.nothing_left()

    def nothing_left(self) -> bool:
        """Whether no attempt can have reached the provider: none was made, or each ended
        before a byte left. An attempt in flight, or one whose end is unrecorded (its replica
        died before releasing it), is counted in ``attempts`` only: it may have."""
        return self.attempts == self.unsent_attempts

    def nothing_sent(self) -> bool:
        """Nothing of it can have reached the provider, on this database's timeline or on one
        a failover lost (SQL: opgate_nothing_sent, migration 0024)."""
        return self.nothing_left_yet() and self.lookup_before_send is None

    def spends(self) -> bool:
        """Whether it counts against every budget it is under (SQL: opgate_spends, migration
        0024): all but an operation that failed (no effect), or whose approval was revoked
        while nothing of it was sent. A revocation after a send un-sends nothing."""
        revoked_unsent = self.revoked_at is not None and self.nothing_sent()
        return not (self.status is Status.FAILED or revoked_unsent)

    def last_attempt_over_since(self) -> datetime | None:
        """When the last attempt can no longer land a new effect (None: it may still). For a
        row in doubt after a timeline switch, not before the switch was seen: an attempt of
        the lost timeline left no trace here, and may have been on its way until then."""
        if self.lease_is_live():
            return None
        ended = self.attempt_ended_at or self.lease_until
        if self.lookup_before_send is not None:
            return max(ended, self.lookup_before_send) if ended else self.lookup_before_send
        return ended

    def to_public(self) -> dict[str, Any]:
        """The JSON shape the operations API returns (and the recovery read will)."""
        body = self.response_body
        text: str | None = None
        if body is not None:
            text = body.decode("utf-8", errors="replace")
        return {
            **self.request_public(),
            "idempotency_key": self.idempotency_key,
            "approval": {
                "ref": self.approval_ref,
                "approved_by": self.approved_by,
                "expires_at": self.expires_at.isoformat(),
                "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
                "revoked_reason": self.revoked_reason,
            },
            "status": self.status.value,
            "attempts": self.attempts,
            "dispatched_at": self.dispatched_at.isoformat() if self.dispatched_at else None,
            "lease_until": self.lease_until.isoformat() if self.lease_until else None,
            "last_outcome": self.last_outcome,
            "provider_response": None
            if self.provider_status is None
            else {
                "status": self.provider_status,
                "object_id": self.provider_object_id,
                "content_type": self.response_content_type,
                "body": text,
            },
            "settled_at": self.settled_at.isoformat() if self.settled_at else None,
            "settled_reason": self.settled_reason,
            "supersedes": self.supersedes,
            "escalation": None
            if self.escalated_at is None
            else {
                "since": self.escalated_at.isoformat(),
                "reason": self.escalation_reason,
            },
            "resolution_note": self.resolution_note,
            "reconcile_attempts": self.reconcile_attempts,
            # whether it counts against its budgets: a revoked one still does if anything of it
            # may have been sent (revoking un-sends nothing)
            "counts_against_budgets": self.spends(),
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }
