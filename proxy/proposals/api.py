"""Proposals over HTTP. On the agent listener (agent token, as the recovery read): ``POST
/_opgate/v1/proposals``, ``GET /_opgate/v1/proposals/{id}`` and ``POST
/_opgate/v1/proposals/{id}/withdraw`` (the agent's own, while pending: a state change, as the
operations API's approve and decline are, never a delete: the row is kept), each one audited
agent request.
On the operations listener (the admin token or an approver's): ``GET /v1/proposals``,
``GET /v1/proposals/{id}``, ``POST /v1/proposals/{id}/approve|decline``.
"""

from __future__ import annotations

from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.admin.access import Approver, admin_problem
from proxy.gate.bodies import BodyRejected, parse_json_object
from proxy.gate.checks import Agent
from proxy.gate.ids import IdKind, id_rule, path_id
from proxy.gate.problem import problem_response
from proxy.gate.reasons import Reason
from proxy.observe.audit import AuditRecord, Decision
from proxy.operations.agent_body import read_agent_body
from proxy.operations.api import APPROVER, BadInput, query_of, read_document
from proxy.operations.approvals import validation_errors
from proxy.proposals.proposing import (
    Refusal,
    approve_proposal,
    decline_proposal,
    propose_for_agent,
    withdraw_proposal,
)
from proxy.proposals.rules import REASON_MAX, proposal_view
from proxy.recovery.api import recorded, recovery_view
from proxy.runtime import GATEWAY, Gateway
from proxy.store.proposal import Proposal, ProposalState

PROPOSALS_PREFIX = "/_opgate/v1/proposals"
OPS_PROPOSALS_PREFIX = "/v1/proposals"
# The rule name proposals are recorded under: opgate's own, never a provider's.
PROPOSAL_RULE = "proposal"
_STATES = {
    "pending": ["pending"],
    "decided": ["approved", "declined"],  # by a human; withdrawn is the agent's own
    "all": [s.value for s in ProposalState],
    **{s.value: [s.value] for s in ProposalState},
}


def _refuse(
    record: AuditRecord,
    reason: Reason,
    detail: str,
    retry_after: int | None = None,
    **extra: Any,
) -> web.Response:
    record.decision = Decision.DENY
    record.reason = reason.value
    return problem_response(reason, detail, retry_after=retry_after, extra=extra or None)


async def _propose(
    gw: Gateway, request: web.Request, agent: Agent, record: AuditRecord
) -> web.Response:
    record.rule = PROPOSAL_RULE
    raw = await read_agent_body(gw, request)
    if isinstance(raw, tuple):
        return _refuse(record, *raw)
    try:
        document = parse_json_object(raw)
    except BodyRejected as exc:
        return _refuse(record, Reason.PROPOSAL_INVALID, str(exc))
    result = await propose_for_agent(gw, agent, document)
    if isinstance(result, Refusal):
        named = document.get("provider")  # on record only if it is one: the body is not
        if isinstance(named, str) and gw.policy.provider_named(named) is not None:
            record.provider = named
        extra: dict[str, Any] = {"errors": result.errors} if result.errors else {}
        return _refuse(
            record, Reason(result.code), result.detail, result.retry_after, **extra, **result.extra
        )
    record.provider, record.operation_id = result.provider, result.operation_id
    record.status_after = ProposalState.PENDING.value
    return web.json_response(await _view(gw, result), status=201)


async def _own_proposal(
    gw: Gateway, request: web.Request, agent: Agent, record: AuditRecord
) -> Proposal | web.Response:
    """The path's proposal if it is ``agent``'s own, else the refusal (unknown)."""
    record.rule = PROPOSAL_RULE
    proposal_id = path_id(request, IdKind.PROPOSAL, "proposal_id")
    if proposal_id is None:
        return _refuse(record, Reason.PROPOSAL_UNKNOWN, id_rule(IdKind.PROPOSAL))
    proposal = await gw.store.load_proposal(proposal_id)
    if proposal is None:
        return _refuse(record, Reason.PROPOSAL_UNKNOWN, f"no proposal {proposal_id}")
    if proposal.tenant != agent.tenant or proposal.agent_id != agent.agent_id:
        # the same answer for "absent" and "not yours": no probing other tenants' ids
        record.decision, record.reason = Decision.DENY, Reason.OPERATION_SCOPE_MISMATCH.value
        return problem_response(Reason.PROPOSAL_UNKNOWN, f"no proposal {proposal_id}")
    record.provider, record.operation_id = proposal.provider, proposal.operation_id
    return proposal


async def _withdraw(
    gw: Gateway, request: web.Request, agent: Agent, record: AuditRecord
) -> web.Response:
    proposal = await _own_proposal(gw, request, agent, record)
    if isinstance(proposal, web.Response):
        return proposal
    record.status_before = proposal.state.value
    result = await withdraw_proposal(gw, proposal, "http")
    if isinstance(result, Refusal):
        return _refuse(record, Reason(result.code), result.detail)
    record.status_after = result.state.value
    return web.json_response(await _view(gw, result))


async def _read(
    gw: Gateway, request: web.Request, agent: Agent, record: AuditRecord
) -> web.Response:
    proposal = await _own_proposal(gw, request, agent, record)
    if isinstance(proposal, web.Response):
        return proposal
    record.status_after = proposal.state.value
    view = await _view(gw, proposal)
    response = web.json_response(view)
    if view["retry_after_seconds"]:
        response.headers["Retry-After"] = str(view["retry_after_seconds"])
    return response


async def _view(gw: Gateway, proposal: Proposal) -> dict[str, Any]:
    operation_view = None
    if proposal.state is ProposalState.APPROVED:
        op = await gw.store.load(proposal.operation_id)
        operation_view = None if op is None else recovery_view(gw, op)
    return proposal_view(gw.policy, proposal, operation_view)


propose = recorded(_propose, rate_limited=True)
read_proposal = recorded(_read)
withdraw = recorded(_withdraw)


def add_agent_proposal_routes(app: web.Application) -> None:
    app.router.add_post(PROPOSALS_PREFIX, propose)
    app.router.add_get(PROPOSALS_PREFIX + "/{proposal_id}", read_proposal)
    app.router.add_post(PROPOSALS_PREFIX + "/{proposal_id}/withdraw", withdraw)


# --------------------------------------------------------------------- the operations API


class DecisionRequest(BaseModel):
    """The body of an approve or a decline."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    note: Annotated[str, Field(min_length=1, max_length=REASON_MAX)] | None = None
    # the admin says who decides; an approver is who its token says
    decided_by: Annotated[str, Field(min_length=1, max_length=200)] | None = None


def _answer(refusal: Refusal) -> web.Response:
    extra: dict[str, Any] = {"errors": refusal.errors} if refusal.errors else {}
    return admin_problem(refusal.status, refusal.code, refusal.detail, **extra, **refusal.extra)


def _proposal_id(request: web.Request) -> str:
    proposal_id = path_id(request, IdKind.PROPOSAL, "proposal_id")
    if proposal_id is None:
        raise BadInput("proposal_id_invalid", id_rule(IdKind.PROPOSAL))
    return proposal_id


async def _decider(request: web.Request) -> tuple[Approver, str | None]:
    """Who decides, and their note. BadInput for a body that is not a decision."""
    approver = request[APPROVER]
    document = await read_document(request) if request.body_exists else {}
    try:
        decision = DecisionRequest.model_validate(document)
    except ValidationError as exc:
        raise BadInput("invalid_request", "; ".join(validation_errors(exc))) from exc
    if decision.decided_by is not None:
        if approver.role != "admin":
            raise BadInput("invalid_request", "an approver is who its token says: no decided_by")
        approver = Approver(decision.decided_by, "admin")
    return approver, decision.note


async def list_proposals(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    query = query_of(request)
    wanted = query.get("status", "pending")
    if wanted not in _STATES:
        raise BadInput("invalid_request", f"status must be one of {sorted(_STATES)}")
    given = query.get("limit", "")
    limit = min(int(given), 1000) if given.isascii() and given.isdigit() else 100
    proposals = await gw.store.list_proposals(query.get("tenant"), _STATES[wanted], limit)
    return web.json_response({"proposals": [await _view(gw, p) for p in proposals]})


async def get_proposal(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    proposal = await gw.store.load_proposal(_proposal_id(request))
    if proposal is None:
        return admin_problem(404, "proposal_unknown", "no such proposal")
    view = await _view(gw, proposal)
    view["events"] = await gw.store.proposal_events(proposal.proposal_id)
    return web.json_response(view)


async def approve(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    proposal_id = _proposal_id(request)
    approver, note = await _decider(request)
    result = await approve_proposal(gw, proposal_id, approver, note)
    if isinstance(result, Refusal):
        return _answer(result)
    return web.json_response(recovery_view(gw, result), status=201)


async def decline(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    proposal_id = _proposal_id(request)
    approver, note = await _decider(request)
    result = await decline_proposal(gw, proposal_id, approver, note)
    if isinstance(result, Refusal):
        return _answer(result)
    return web.json_response(await _view(gw, result))


def add_ops_proposal_routes(app: web.Application) -> None:
    app.router.add_get(OPS_PROPOSALS_PREFIX, list_proposals)
    app.router.add_get(OPS_PROPOSALS_PREFIX + "/{proposal_id}", get_proposal)
    app.router.add_post(OPS_PROPOSALS_PREFIX + "/{proposal_id}/approve", approve)
    app.router.add_post(OPS_PROPOSALS_PREFIX + "/{proposal_id}/decline", decline)
