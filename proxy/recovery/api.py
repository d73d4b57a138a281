"""The recovery read for agents, on the agent listener: ``/_opgate/v1/operations[/{id}]``.

Read-only for the agent and scoped to its tenant (and to itself, for operations bound to one
agent). The answer is the authoritative row, read from the primary, and ``next_action`` from
``proxy.recovery.next_action``. When that says ``reconcile``, the read first asks the provider
itself (one bounded try, at most one per the rule's ``retry_seconds`` whoever asks), so an
agent that simply follows the protocol gets a settled answer as soon as the provider can give
one, and an agent polling fast cannot multiply lookups or exhaust the tries into an escalation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy.errors import StoreUnavailable
from proxy.gate.bodies import body_from_fields
from proxy.gate.checks import Agent
from proxy.gate.decision import Deny
from proxy.gate.identity import AmbiguousCredentials, presented_agent_token
from proxy.gate.ids import IdKind, id_rule, path_operation_id
from proxy.gate.limits import Slot
from proxy.gate.problem import problem_response
from proxy.gate.reasons import Reason
from proxy.gate.transitions import ClaimRule
from proxy.observe.audit import AuditRecord, Decision, request_path
from proxy.observe.record_life import RecordLife
from proxy.policy.approved import approved_fields
from proxy.policy.model import BodyKind, Provider, Rule
from proxy.policy.set import PolicySet
from proxy.recovery.next_action import NextAction, next_action
from proxy.recovery.reconcile import reconcile_now
from proxy.runtime import GATEWAY, Gateway
from proxy.store.operation import STATUS_FILTERS, Operation
from proxy.store.proposal import Proposal

RECOVERY_PREFIX = "/_opgate/v1/operations"


def _agent(gw: Gateway, request: web.Request) -> Agent | None:
    try:
        token = presented_agent_token(request.headers, "Authorization")
    except AmbiguousCredentials:
        return None
    return gw.agents.lookup(token) if token else None


def in_scope(op: Operation, agent: Agent) -> bool:
    return op.tenant == agent.tenant and (op.agent_id is None or op.agent_id == agent.agent_id)


def recovery_view(
    gw: Gateway,
    op: Operation,
    precondition_failure: dict[str, Any] | None = None,
    *,
    with_request: bool = False,
) -> dict[str, Any]:
    """The row and its next action; the exact request where the agent is to send it (send,
    retry), or always (``with_request``: for a client that executes it through opgate)."""
    provider = gw.policy.provider_named(op.provider)
    advice = next_action(op, ClaimRule.of(provider, op.action), precondition_failure)
    view: dict[str, Any] = {
        "operation": op.to_public(),
        "next_action": advice.action.value,
        "reason": advice.reason,
        "retry_after_seconds": advice.retry_after_seconds,
    }
    if advice.evidence is not None:
        view["precondition"] = advice.evidence
    wanted = with_request or advice.action in (NextAction.SEND, NextAction.RETRY)
    if wanted and provider is not None:
        rule = provider.rule_named(op.action)
        if rule is not None:
            view["request"] = approved_request(provider, rule, op)
    return view


async def recovery_views(
    gw: Gateway, ops: list[Operation], *, with_request: bool = False
) -> list[dict[str, Any]]:
    """``recovery_view`` of each, with the evidence of a failed precondition where an
    operation of which nothing has left has one (its latest ``precondition_failed`` event:
    one read for all)."""
    failures = await gw.store.precondition_failures(
        [op.operation_id for op in ops if op.nothing_left_yet()]
    )
    return [
        recovery_view(gw, op, failures.get(op.operation_id), with_request=with_request)
        for op in ops
    ]


def approved_request(provider: Provider, rule: Rule, op: Operation) -> dict[str, Any]:
    """The exact request the approval allows, for an agent to send as it is: "re-send the
    identical request" must not depend on what the agent remembers."""
    return exact_request(
        provider,
        rule,
        operation_id=op.operation_id,
        method=op.method,
        path=op.path,
        amount=op.amount,
        currency=op.currency,
        params=op.params,
        idempotency_key=op.idempotency_key,
    )


def proposal_request(policy: PolicySet, proposal: Proposal) -> dict[str, Any] | None:
    """The exact request an approval of this proposal lets through (None if the policy no
    longer has its rule)."""
    provider = policy.provider_named(proposal.provider)
    rule = provider.rule_named(proposal.action) if provider is not None else None
    if provider is None or rule is None:
        return None
    return exact_request(
        provider,
        rule,
        operation_id=proposal.operation_id,
        method=proposal.method,
        path=proposal.path,
        amount=proposal.amount,
        currency=proposal.currency,
        params=proposal.params,
        idempotency_key=proposal.idempotency_key,
    )


def exact_request(
    provider: Provider,
    rule: Rule,
    *,
    operation_id: str,
    method: str,
    path: str,
    amount: int | None,
    currency: str | None,
    params: dict[str, Any],
    idempotency_key: str,
) -> dict[str, Any]:
    """The one request these approved fields let through, in the canonical form the checks
    compare against (``approved_fields``): what an operation allows, and what a proposal
    would allow once approved."""
    fields = approved_fields(
        provider,
        rule,
        amount=amount,
        currency=currency,
        params=params,
        idempotency_key=idempotency_key,
    )
    headers = {"X-Operation-Id": operation_id}
    key_header = provider.key_header(rule)
    if key_header is not None:
        headers[key_header] = idempotency_key
    request: dict[str, Any] = {
        "method": method,
        "path": provider.route_prefix + path,
        "headers": headers,
    }
    if rule.body is BodyKind.FORM:
        request["form"] = dict(body_from_fields(rule.body, fields).form)
    elif rule.body is BodyKind.JSON:
        request["json"] = body_from_fields(rule.body, fields).json
    return request


# The rule name recovery reads are recorded under: they are opgate's own, never a provider's.
RECOVERY_RULE = "recovery"
Read = Callable[[Gateway, web.Request, Agent, AuditRecord], Awaitable[web.Response]]


def recorded(
    read: Read, *, rate_limited: bool = False
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A recovery read as an agent request like any other: one audit record in a ``finally``
    (decision ``allow`` when opgate answered it itself, nothing forwarded), and a slot of the
    agent's requests in flight, since a read may ask the provider (reconciliation).
    ``rate_limited``: admitted under every limit of an agent's requests (proxy/gate/limits.py),
    as a proposal is: it reaches a human, where a read reaches only opgate."""

    async def handler(request: web.Request) -> web.Response:
        gw = request.app[GATEWAY]
        record = AuditRecord(
            source=request.remote,
            method=request.method,
            path=request_path(request.raw_path),
            policy_version=gw.policy.version,
            rule=RECOVERY_RULE,
        )
        with RecordLife(record):
            response = await _admitted(gw, request, record, read, rate_limited)
            record.response_status = response.status
            return response

    return handler


async def _admitted(
    gw: Gateway, request: web.Request, record: AuditRecord, read: Read, rate_limited: bool
) -> web.Response:
    agent = _agent(gw, request)
    if agent is None:
        return _refuse(record, Reason.AGENT_UNAUTHENTICATED, "no valid agent token")
    record.agent_id, record.tenant = agent.agent_id, agent.tenant
    slot = admitted(gw, agent, rate_limited)
    if isinstance(slot, Deny):
        return _refuse(record, slot.reason, slot.detail, slot.retry_after_seconds)
    try:
        response = await read(gw, request, agent, record)
    except StoreUnavailable as exc:
        record.decision = Decision.ERROR
        return _refuse(record, Reason.STORE_UNAVAILABLE, str(exc))
    finally:
        slot.release()
    if record.reason is None:
        record.decision = Decision.ALLOW
    return response


def admitted(gw: Gateway, agent: Agent, rate_limited: bool) -> Slot | Deny:
    """A slot of ``agent``'s requests in flight, or the limit it is over: the in-flight cap
    only, or (``rate_limited``) every limit the settings set (rates, the tenant's cap)."""
    if rate_limited:
        return gw.in_flight.admit(agent, None, gw.settings)
    cap = gw.settings.max_requests_in_flight_per_agent
    slot = gw.in_flight.take(agent, cap)
    if slot is None:
        return Deny(Reason.AGENT_CONCURRENCY_EXCEEDED, f"{cap} requests in flight", 1)
    return slot


def _refuse(
    record: AuditRecord,
    reason: Reason,
    detail: str,
    retry_after: int | None = None,
    *,
    told: Reason | None = None,
) -> web.Response:
    """Refuse with ``reason`` on record; the agent is told ``told`` instead where the truth
    would reveal another scope's operation."""
    if record.decision != Decision.ERROR:
        record.decision = Decision.DENY
    record.reason = reason.value
    return problem_response(told or reason, detail, retry_after=retry_after)


async def _read_operation(
    gw: Gateway, request: web.Request, agent: Agent, record: AuditRecord
) -> web.Response:
    operation_id = path_operation_id(request)
    if operation_id is None:
        return _refuse(record, Reason.OPERATION_ID_INVALID, id_rule(IdKind.OPERATION))
    view = await operation_view(gw, agent, operation_id, record)
    if isinstance(view, ReadRefusal):
        return _refuse(record, view.reason, view.detail, told=view.told)
    response = web.json_response(view)
    if view["retry_after_seconds"]:
        response.headers["Retry-After"] = str(view["retry_after_seconds"])
    return response


@dataclass(frozen=True)
class ReadRefusal:
    """Why a read is refused (on record) and what the agent is told."""

    reason: Reason
    detail: str
    told: Reason


async def operation_view(
    gw: Gateway, agent: Agent, operation_id: str, record: AuditRecord, *, with_request: bool = False
) -> dict[str, Any] | ReadRefusal:
    """The recovery view of ``operation_id`` for ``agent`` (reconciled first where it says
    reconcile), filling ``record``; the same refusal for "absent" and "not yours"."""
    record.operation_id = operation_id
    op = await gw.store.load(operation_id)
    if op is None:
        reason = Reason.OPERATION_UNKNOWN
        return ReadRefusal(reason, f"no operation {operation_id}", reason)
    if not in_scope(op, agent):
        # the same answer for "absent" and "not yours": no probing other tenants' ids
        detail = f"no operation {operation_id}"
        return ReadRefusal(Reason.OPERATION_SCOPE_MISMATCH, detail, Reason.OPERATION_UNKNOWN)
    record.provider, record.status_before = op.provider, op.status.value
    [view] = await recovery_views(gw, [op], with_request=with_request)
    if view["next_action"] == NextAction.RECONCILE:
        op = await reconcile_now(gw, operation_id) or op
        view = recovery_view(gw, op, with_request=with_request)
    record.status_after = op.status.value
    return view


async def unsettled_views(
    gw: Gateway, agent: Agent, *, with_request: bool = False
) -> list[dict[str, Any]]:
    """The agent's operations that are not settled yet, each with its next action."""
    ops = await gw.store.list_operations(
        agent.tenant, STATUS_FILTERS["unsettled"], agent.agent_id, 200
    )
    return await recovery_views(gw, ops, with_request=with_request)


async def _list_unsettled(
    gw: Gateway, request: web.Request, agent: Agent, record: AuditRecord
) -> web.Response:
    return web.json_response({"operations": await unsettled_views(gw, agent)})


read_operation = recorded(_read_operation)
list_unsettled = recorded(_list_unsettled)


def add_recovery_routes(app: web.Application) -> None:
    app.router.add_get(RECOVERY_PREFIX, list_unsettled)
    app.router.add_get(RECOVERY_PREFIX + "/{operation_id}", read_operation)
