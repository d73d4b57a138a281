"""Proposals, the pure part: an agent's proposal read and planned as an approval would be, the
four-eyes rule, and what the agent is told about its proposal. No IO.

A proposal is planned by ``approvals.plan_operation`` itself, with the tenant and the agent
taken from the agent's token and the proposal id as the approval reference: a proposal that
is accepted is an operation row waiting only for a human's yes, and approving it copies that
row unchanged (queries.sql ``proposal_approve``). So an approved proposal can be sent by
exactly one well-formed request, the one shown to the agent and to the approver.

Who may approve: the admin, or a configured approver (settings ``approvers``). With
``four_eyes`` (policy, per provider or per rule), an approver may not approve a proposal of an
agent they are bound to: the agent whose id is their name, or an agent whose ``owner`` they
are (settings ``agents[].owner``).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from proxy.admin.access import Approver
from proxy.gate.checks import Agent
from proxy.operations.approvals import (
    OperationRequest,
    plan_operation,
    request_for,
    validation_errors,
)
from proxy.policy.set import PolicySet
from proxy.recovery.api import proposal_request
from proxy.recovery.next_action import NextAction
from proxy.settings import Settings
from proxy.store.proposal import PROPOSAL_ID_PREFIX, Proposal, ProposalState
from proxy.store.store import NewProposal

REASON_MAX = 2000
# How often an agent waiting on a human is told to ask again (at most: never past the expiry).
WAIT_SECONDS = 10


class ProposalRequest(BaseModel):
    """The body of ``POST /_opgate/v1/proposals``: the exact request the agent intends, and
    why. The tenant and agent are the token's, never the body's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Annotated[str, Field(min_length=1, max_length=128)]
    action: Annotated[str, Field(min_length=1, max_length=128)]
    path_params: dict[str, str] = Field(default_factory=dict)
    # as an approval's: money is a JSON integer, never coerced
    amount: Annotated[int, Field(strict=True, ge=0, le=2**53 - 1)] | None = None
    currency: Annotated[str, Field(pattern=r"^[A-Za-z]{3}$")] | None = None
    params: dict[str, JsonValue] = Field(default_factory=dict)
    reason: Annotated[str, Field(min_length=1, max_length=REASON_MAX)]


class ProposalInvalid(ValueError):
    """The proposal's body is not a proposal (fields, types): every error, one per line."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


def new_proposal_id() -> str:
    return PROPOSAL_ID_PREFIX + secrets.token_hex(12)


def read_proposal(document: dict[str, Any]) -> ProposalRequest:
    """The proposal, or ProposalInvalid with every error."""
    try:
        return ProposalRequest.model_validate(document)
    except ValidationError as exc:
        raise ProposalInvalid(validation_errors(exc)) from exc


def plan_proposal(
    req: ProposalRequest,
    agent: Agent,
    policy: PolicySet,
    now: datetime,
    *,
    approval_seconds: int,
    pending_seconds: float,
) -> NewProposal | list[str]:
    """The proposal to store, or every reason its approval could not be sent (the reasons an
    operation approval would get: ``approval_not_sendable``); ProposalInvalid if it holds a
    value no approval can."""
    proposal_id = new_proposal_id()
    try:
        approval = OperationRequest(
            tenant=agent.tenant,
            agent_id=agent.agent_id,
            provider=req.provider,
            action=req.action,
            path_params=dict(req.path_params),
            amount=req.amount,
            currency=req.currency,
            params=dict(req.params),
            approval_ref=proposal_id,
            approved_by="proposal",  # replaced by the approver's identity at approval
            ttl_seconds=approval_seconds,
        )
    except ValidationError as exc:  # a value no approval could hold (a null, a NaN)
        raise ProposalInvalid(validation_errors(exc)) from exc
    planned = plan_operation(approval, policy, now)
    if isinstance(planned, list):
        return planned
    return NewProposal(
        proposal_id=proposal_id,
        operation=planned,
        reason=req.reason,
        approval_seconds=float(approval_seconds),
        pending_seconds=pending_seconds,
    )


def replan_problems(proposal: Proposal, policy: PolicySet, now: datetime) -> list[str]:
    """Why the proposal could no longer be sent under the policy loaded now (it may have
    changed since the proposal was made): approving it would create an operation no request
    can carry. Empty: it still can, as the exact same request."""
    approval = request_for(
        proposal,
        approval_ref=proposal.proposal_id,
        approved_by="proposal",
        expires_at=now + timedelta(seconds=proposal.approval_seconds),
        supersedes=None,
        ttl_seconds=None,
    )
    planned = plan_operation(approval, policy, now)
    if isinstance(planned, list):
        return planned
    if (planned.method, planned.path) != (proposal.method, proposal.path):
        return [f"the policy now sends it as {planned.method} {planned.path}, not as proposed"]
    return []


def agent_owners(settings: Settings) -> dict[str, str | None]:
    return {agent.id: agent.owner for agent in settings.agents}


def four_eyes_problem(
    policy: PolicySet, proposal: Proposal, approver: Approver, owners: Mapping[str, str | None]
) -> str | None:
    """Why ``approver`` may not approve ``proposal`` under four eyes (None: they may).
    ``owners``: each agent's owner (settings ``agents[].owner``)."""
    provider = policy.provider_named(proposal.provider)
    rule = provider.rule_named(proposal.action) if provider is not None else None
    if provider is None or rule is None or not provider.four_eyes_for(rule):
        return None
    bound = {proposal.agent_id, owners.get(proposal.agent_id)}
    if approver.name not in bound:
        return None
    return (
        f"four eyes: {approver.name} may not approve a proposal of agent {proposal.agent_id}, "
        "which they are bound to; another approver must decide"
    )


def proposal_view(
    policy: PolicySet, proposal: Proposal, operation_view: dict[str, Any] | None
) -> dict[str, Any]:
    """What the agent (and the approver) are told: the proposal, its state, and next_action:
    ``wait`` while pending, ``new_approval_required`` once declined, withdrawn or expired, and once
    approved the created operation's own next_action (``send`` until it is sent), from
    ``operation_view`` (the recovery read's view of it)."""
    state = proposal.state
    view: dict[str, Any] = {
        "proposal": proposal.to_public(),
        "status": state.value,
        "operation_id": None,
        "retry_after_seconds": None,
    }
    if state is ProposalState.PENDING:
        left = (proposal.expires_at - proposal.read_at).total_seconds()
        view["next_action"] = NextAction.WAIT.value
        view["reason"] = f"waiting for an approver until {proposal.expires_at.isoformat()}"
        if proposal.declined_twin is not None:
            view["reason"] += (
                f"; the same request was declined lately as {proposal.declined_twin} (its "
                "decision and note: GET /_opgate/v1/proposals/" + proposal.declined_twin + ")"
            )
        view["retry_after_seconds"] = max(1, min(WAIT_SECONDS, int(left)))
        view["request"] = proposal_request(policy, proposal)
    elif state is ProposalState.APPROVED and operation_view is not None:
        view["operation_id"] = proposal.operation_id
        view["operation"] = operation_view["operation"]
        view["next_action"] = operation_view["next_action"]
        view["reason"] = f"approved by {proposal.decided_by}: " + str(operation_view["reason"])
        view["retry_after_seconds"] = operation_view["retry_after_seconds"]
        if "request" in operation_view:
            view["request"] = operation_view["request"]
    elif state is ProposalState.APPROVED:  # the operation row is always created with it
        view["operation_id"] = proposal.operation_id
        view["next_action"] = NextAction.WAIT.value
        view["reason"] = "approved; the operation is not readable yet"
        view["retry_after_seconds"] = 1
    elif state is ProposalState.DECLINED:
        view["next_action"] = NextAction.NEW_APPROVAL_REQUIRED.value
        note = f": {proposal.decision_note}" if proposal.decision_note else ""
        view["reason"] = f"declined by {proposal.decided_by}{note}"
    elif state is ProposalState.WITHDRAWN:
        view["next_action"] = NextAction.NEW_APPROVAL_REQUIRED.value
        at = proposal.decided_at.isoformat() if proposal.decided_at else "?"
        view["reason"] = f"withdrawn by its agent {proposal.decided_by} at {at}"
    else:
        view["next_action"] = NextAction.NEW_APPROVAL_REQUIRED.value
        view["reason"] = f"expired at {proposal.expires_at.isoformat()} without a decision"
    return view
