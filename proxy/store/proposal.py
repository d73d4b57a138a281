"""The proposal row as the store returns it: an agent's request for the approval of one exact
request, and its human decision."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from proxy.store.operation import Approval

# A proposal's id, and so the approval_ref of the operation its approval creates, starts so: an
# operation approved from a proposal is rechecked against the provider before its first send.
PROPOSAL_ID_PREFIX = "prop_"


class ProposalState(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DECLINED = "declined"
    WITHDRAWN = "withdrawn"  # by the agent that made it, while pending (migration 0023)
    # not stored: a pending proposal past its expiry (queries.sql, proposals)
    EXPIRED = "expired"


@dataclass(frozen=True)
class Proposal(Approval):
    """An agent's request for the approval of one exact request (``Approval``'s fields: the
    operation its approval creates), and its human decision."""

    agent_id: str  # a proposal is always an agent's
    proposal_id: str
    reason: str
    approval_seconds: float
    status: str
    expires_at: datetime
    decided_at: datetime | None
    decided_by: str | None
    decision_note: str | None
    created_at: datetime
    # the database's clock when the row was read: expiry is decided against it
    read_at: datetime
    # the same agent's identical proposal declined shortly before this one was made, if any
    declined_twin: str | None = None

    @property
    def state(self) -> ProposalState:
        if self.status == ProposalState.PENDING and self.expires_at <= self.read_at:
            return ProposalState.EXPIRED
        return ProposalState(self.status)

    def to_public(self) -> dict[str, Any]:
        return {
            "proposal_id": self.proposal_id,
            **self.request_public(),  # not its key: approvers need not see it
            "reason": self.reason,
            "status": self.state.value,
            "expires_at": self.expires_at.isoformat(),
            "approval_seconds": self.approval_seconds,
            "decided_at": self.decided_at.isoformat() if self.decided_at else None,
            "decided_by": self.decided_by,
            "decision_note": self.decision_note,
            "created_at": self.created_at.isoformat(),
            "declined_twin": self.declined_twin,
        }


@dataclass(frozen=True)
class PendingProposals:
    """What waits for a human when one more proposal is asked for: the agent's and its
    tenant's pending proposals, and the seconds until the first of each expires."""

    agent: int
    tenant: int
    agent_first_expiry_seconds: float | None
    tenant_first_expiry_seconds: float | None
