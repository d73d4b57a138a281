"""Proposals, the acts: an agent proposes, a human approves or declines. Each is one function
that any front end calls (the agents' API, the operations API, the console, and tools such as
an MCP server's ``propose_operation``), answering the result or a ``Refusal`` with a stable
code; the front end only renders it.

    propose_for_agent(gw, agent, document)   the agent's proposal -> Proposal | Refusal
    approve_proposal(gw, id, approver, note) -> Operation | Refusal
    decline_proposal(gw, id, approver, note) -> Proposal | Refusal
    withdraw_proposal(gw, proposal, via)     the agent's own, pending -> Proposal | Refusal
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from proxy.admin.access import Approver
from proxy.errors import IdempotencyKeyInUse
from proxy.gate.budgets import remaining_budget
from proxy.gate.checks import Agent
from proxy.gate.decision import Deny
from proxy.gate.reasons import Reason
from proxy.operations.approvals import holds_nul
from proxy.proposals.rules import (
    ProposalInvalid,
    agent_owners,
    four_eyes_problem,
    plan_proposal,
    read_proposal,
    replan_problems,
)
from proxy.runtime import Gateway
from proxy.settings import Settings
from proxy.store.operation import Approval, Operation
from proxy.store.proposal import PendingProposals, Proposal, ProposalState

_log = structlog.get_logger("opgate.proposals")


@dataclass(frozen=True)
class Refusal:
    """Why a proposal act was refused: an HTTP status, a stable code (docs/concepts/proposals.md), a
    sentence, and every problem where there are several."""

    status: int
    code: str
    detail: str
    errors: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the remaining budget
    retry_after: int | None = None  # seconds, where asking again later may be answered otherwise


async def spend_limits_problem(gw: Gateway, planned: Approval, *, at: str) -> Refusal | None:
    """The limits no approval may exceed (spend budgets, checked early at proposal and at
    approval time; ``at`` says which), or None when the operation is within them. Budgets are
    enforced atomically when a request claims its operation; this early check only refuses
    sooner, and with the remaining budget."""
    if planned.amount is None:
        return None
    room = await remaining_budget(
        gw.store,
        gw.policy,
        planned.provider,
        planned.tenant,
        planned.agent_id,
        planned.currency,
        planned.amount,
    )
    if not isinstance(room, Deny):
        return None
    detail = f"at {at} time: {room.detail}"
    return Refusal(403, room.reason.value, detail, extra=dict(room.extra or {}))


async def propose_for_agent(
    gw: Gateway, agent: Agent, document: dict[str, Any]
) -> Proposal | Refusal:
    """Store ``document`` (a proposal's JSON body) as a pending proposal of ``agent``, if it is
    one and its approval could be sent; the approvers are notified."""
    if holds_nul(document):
        return Refusal(400, "proposal_invalid", "text may not hold a NUL character")
    try:
        request = read_proposal(document)
        planned = plan_proposal(
            request,
            agent,
            gw.policy,
            datetime.now(UTC),
            approval_seconds=gw.settings.proposal_approval_seconds,
            pending_seconds=gw.settings.proposal_pending_seconds,
        )
    except ProposalInvalid as exc:
        return Refusal(400, "proposal_invalid", "the proposal is invalid", exc.errors)
    if isinstance(planned, list):
        return Refusal(422, "approval_not_sendable", "; ".join(planned), planned)
    limited = await spend_limits_problem(gw, planned.operation, at="proposal")
    if limited is not None:
        return limited
    settings = gw.settings
    proposal = await gw.store.create_proposal(
        planned,
        lambda waiting: pending_cap_problem(waiting, settings) is None,
        settings.proposal_declined_twin_seconds,
    )
    if isinstance(proposal, PendingProposals):
        refused = pending_cap_problem(proposal, settings)
        assert refused is not None  # the store creates whenever the cap admits
        return refused
    _log.info(
        "proposal_created",
        proposal_id=proposal.proposal_id,
        agent_id=agent.agent_id,
        action=proposal.action,
        declined_twin=proposal.declined_twin,
    )
    return proposal


# Longest an agent over its pending cap is told to wait before asking again: a decision may
# free a place at any time, long before the first pending proposal expires.
_CAP_RETRY_MAX = 60


def pending_cap_problem(waiting: PendingProposals, settings: Settings) -> Refusal | None:
    """Why one more proposal may not wait for a human (429 ``rate_limited``, Retry-After: when
    the first of the capped proposals expires, at most a minute), or None when it may."""
    caps = (
        (
            "agent",
            settings.max_pending_proposals_per_agent,
            waiting.agent,
            waiting.agent_first_expiry_seconds,
        ),
        (
            "tenant",
            settings.max_pending_proposals_per_tenant,
            waiting.tenant,
            waiting.tenant_first_expiry_seconds,
        ),
    )
    for who, cap, count, first_expiry in caps:
        if cap is None or count < cap:
            continue
        wait = min(_CAP_RETRY_MAX, math.ceil(first_expiry or _CAP_RETRY_MAX))
        detail = (
            f"the {who} has {count} pending proposals, the cap is {cap}: wait for a decision "
            "or an expiry"
        )
        return Refusal(429, Reason.RATE_LIMITED.value, detail, retry_after=max(1, wait))
    return None


async def approve_proposal(
    gw: Gateway, proposal_id: str, approver: Approver, note: str | None
) -> Operation | Refusal:
    """Approve a pending, unexpired proposal: its operation is created in the same statement,
    unchanged, with the approver as ``approved_by`` and the proposal id as ``approval_ref``."""
    proposal = await gw.store.load_proposal(proposal_id)
    if proposal is None:
        return Refusal(404, "proposal_unknown", f"no proposal {proposal_id}")
    if proposal.state is not ProposalState.PENDING:
        return _not_pending(proposal)
    refused = four_eyes_problem(gw.policy, proposal, approver, agent_owners(gw.settings))
    if refused is not None:
        await _record_refusal(gw, proposal, approver, "four_eyes_refused", refused)
        return Refusal(403, "four_eyes_refused", refused)
    problems = replan_problems(proposal, gw.policy, datetime.now(UTC))
    if problems:
        await _record_refusal(gw, proposal, approver, "approval_not_sendable", "; ".join(problems))
        return Refusal(422, "approval_not_sendable", "; ".join(problems), problems)
    limited = await spend_limits_problem(gw, proposal, at="approval")
    if limited is not None:
        await _record_refusal(gw, proposal, approver, limited.code, limited.detail)
        return limited
    try:
        created = await gw.store.approve_proposal(proposal_id, approver.name, approver.actor, note)
    except IdempotencyKeyInUse:
        return Refusal(
            409, "operation_exists", f"an operation holds {proposal.operation_id}'s id or key"
        )
    if created is None:  # decided or expired meanwhile: the statement found it not pending
        again = await gw.store.load_proposal(proposal_id)
        assert again is not None  # proposals are never deleted
        return _not_pending(again)
    _log.info(
        "proposal_approved",
        proposal_id=proposal_id,
        operation_id=created.operation_id,
        by=approver.actor,
    )
    return created


async def decline_proposal(
    gw: Gateway, proposal_id: str, approver: Approver, note: str | None
) -> Proposal | Refusal:
    """Decline a pending, unexpired proposal: no operation will ever exist for it."""
    declined = await gw.store.decline_proposal(proposal_id, approver.name, approver.actor, note)
    if declined is not None:
        _log.info("proposal_declined", proposal_id=proposal_id, by=approver.actor)
        return declined
    existing = await gw.store.load_proposal(proposal_id)
    if existing is None:
        return Refusal(404, "proposal_unknown", f"no proposal {proposal_id}")
    return _not_pending(existing)


async def withdraw_proposal(gw: Gateway, proposal: Proposal, via: str) -> Proposal | Refusal:
    """Withdraw ``proposal``, the calling agent's own (the front end checked the scope), while
    it is pending: nothing can have left, no operation exists before an approval. Refused
    ``proposal_not_withdrawable`` with the reason once it is not pending. ``via``: the front
    end (``http``, ``mcp``), on its event."""
    withdrawn = await gw.store.withdraw_proposal(
        proposal.proposal_id, proposal.tenant, proposal.agent_id, via
    )
    if withdrawn is not None:
        _log.info("proposal_withdrawn", proposal_id=proposal.proposal_id, via=via)
        return withdrawn
    again = await gw.store.load_proposal(proposal.proposal_id) or proposal
    return Refusal(409, Reason.PROPOSAL_NOT_WITHDRAWABLE.value, not_withdrawable(again))


def not_withdrawable(proposal: Proposal) -> str:
    """Why a proposal that is no longer pending cannot be withdrawn (or cancelled as a task)."""
    state = proposal.state
    if state is ProposalState.APPROVED:
        return (
            f"{proposal.proposal_id} is approved by {proposal.decided_by}: operation "
            f"{proposal.operation_id} exists; cancel that operation (MCP tasks/cancel) while "
            "nothing has left, or leave it unsent until its approval expires"
        )
    if state is ProposalState.WITHDRAWN:
        return f"{proposal.proposal_id} is withdrawn already"
    if state is ProposalState.EXPIRED:
        return (
            f"{proposal.proposal_id} expired at {proposal.expires_at.isoformat()} without a "
            "decision: nothing will be sent for it"
        )
    return (
        f"{proposal.proposal_id} is declined by {proposal.decided_by}: nothing was or will be "
        "sent for it"
    )


def _not_pending(proposal: Proposal) -> Refusal:
    state = proposal.state
    if state is ProposalState.WITHDRAWN:
        at = proposal.decided_at.isoformat() if proposal.decided_at else "?"
        detail = (
            f"{proposal.proposal_id} was withdrawn by its agent {proposal.decided_by} at {at}: "
            "there is nothing to decide"
        )
        return Refusal(409, "proposal_not_pending", detail)
    by = f" by {proposal.decided_by}" if proposal.decided_by else ""
    return Refusal(
        409, "proposal_not_pending", f"{proposal.proposal_id} is {state.value}{by}: not decidable"
    )


async def _record_refusal(
    gw: Gateway, proposal: Proposal, approver: Approver, code: str, detail: str
) -> None:
    """A refused approval is a decision too: on the proposal's audit stream, status unchanged."""
    await gw.store.record_proposal_refusal(proposal.proposal_id, approver.actor, code, detail)
    _log.warning(
        "proposal_approval_refused", proposal_id=proposal.proposal_id, by=approver.actor, code=code
    )
