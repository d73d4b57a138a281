"""The tool calls, against the gateway. Each call leaves exactly one audit record (listener
``mcp``): a read's own, like the recovery read's; an execution's is the pipeline's, since the
request it sends is decided, claimed and forwarded there like any agent request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import structlog
from aiohttp import web

from proxy.errors import StoreUnavailable
from proxy.gate.checks import Agent
from proxy.gate.decision import Deny
from proxy.gate.ids import IdKind, id_rule, valid_id
from proxy.gate.pipeline import ComposedRequest, handle_composed_request
from proxy.gate.problem import PROBLEM, problem_response
from proxy.gate.reasons import Reason
from proxy.mcp.auth import task_scope
from proxy.mcp.compose import compose_request
from proxy.mcp.tools import (
    EXECUTE_OPERATION,
    GET_OPERATION,
    GET_PROPOSAL,
    LIST_OPERATIONS,
    PROPOSE_OPERATION,
    Answered,
    ToolError,
    decoded_body,
)
from proxy.observe.audit import AuditRecord, Decision, emit
from proxy.observe.record_life import RecordLife
from proxy.proposals.api import PROPOSAL_RULE
from proxy.proposals.proposing import Refusal as ProposalRefusal
from proxy.proposals.proposing import propose_for_agent, withdraw_proposal
from proxy.proposals.rules import proposal_view
from proxy.recovery.api import (
    RECOVERY_RULE,
    ReadRefusal,
    admitted,
    in_scope,
    operation_view,
    recovery_view,
    unsettled_views,
)
from proxy.runtime import Gateway
from proxy.store.operation import Operation, Status
from proxy.store.proposal import Proposal, ProposalState

LISTENER = "mcp"
_log = structlog.get_logger("opgate.mcp")
# The rule name of the records MCP writes itself (refusals before a request was composed).
MCP_RULE = "mcp"


@dataclass
class McpCall:
    """The MCP exchange a tool call arrived in: who is calling, from where, and its audit
    record's life (``exchange``: the endpoint's record, unless a tool or the pipeline writes
    the request's own, which then replaces it)."""

    gateway: Gateway
    agent: Agent
    token: str
    source: str | None
    path: str
    exchange: RecordLife
    # what its OAuth token grants (None: a static token, everything the agent may do)
    scopes: frozenset[str] | None = None
    # the scope a task id was found to need that the token lacks: the endpoint answers 403
    # insufficient_scope naming it, as for a scope known before the lookup
    lacking: str | None = None


Answer = Answered | ToolError


async def call_tool(call: McpCall, name: str, arguments: Mapping[str, Any] | None) -> Answer:
    """The tool's answer. Whatever it raises that no stage foresaw is a refusal on record
    (``mcp_tool_failed``, decision error), never left to the SDK (which would answer a bare
    JSON-RPC error and leave the exchange looking allowed)."""
    return await _guarded(call, name, arguments, lambda: _dispatch(call, name, arguments))


T = TypeVar("T")


async def _guarded(
    call: McpCall, name: str, arguments: Mapping[str, Any] | None, run: Callable[[], Awaitable[T]]
) -> T | ToolError:
    try:
        return await run()
    except Exception:
        _log.exception("mcp_tool_failed", tool=name, agent_id=call.agent.agent_id)
        failed = Deny(Reason.MCP_TOOL_FAILED, f"{name} failed inside opgate (logged)")
        if call.exchange.gone:  # the pipeline's record stands: it says what was sent
            return ToolError(problem_response(failed.reason, failed.detail)[PROBLEM])
        record = _record(call, MCP_RULE)
        record.decision = Decision.ERROR
        operation_id = (arguments or {}).get("operation_id")
        if valid_id(operation_id, IdKind.OPERATION):
            record.operation_id = operation_id
        return _refuse(call, record, failed)


async def _dispatch(call: McpCall, name: str, arguments: Mapping[str, Any] | None) -> Answer:
    args = dict(arguments or {})
    if name == EXECUTE_OPERATION:
        return await _execute(call, args)
    if name == GET_OPERATION:
        return await _recorded_read(call, lambda record: _get(call, args, record))
    if name == LIST_OPERATIONS:
        return await _recorded_read(call, lambda record: _list(call, args, record))
    if name == PROPOSE_OPERATION:
        return await _recorded_read(
            call, lambda record: _propose(call, args, record), rate_limited=True
        )
    if name == GET_PROPOSAL:
        return await _recorded_read(call, lambda record: _get_proposal(call, args, record))
    record = _record(call, MCP_RULE)
    return _refuse(call, record, Deny(Reason.NO_MATCHING_RULE, f"no tool named {name!r}"))


# -- reads --------------------------------------------------------------------------------


async def _recorded_read(
    call: McpCall,
    read: Callable[[AuditRecord], Awaitable[Answer]],
    *,
    rate_limited: bool = False,
) -> Answer:
    """A call answered by opgate itself, like the recovery read: one record, a slot of the
    agent's requests in flight (a read may ask the provider, when it reconciles); a proposal
    (``rate_limited``) is admitted under every limit of the agent's requests."""
    gw = call.gateway
    record = _record(call, RECOVERY_RULE)
    slot = admitted(gw, call.agent, rate_limited)
    if isinstance(slot, Deny):
        return _refuse(call, record, slot)
    try:
        answer = await read(record)
    except StoreUnavailable as exc:
        record.decision = Decision.ERROR
        return _refuse(call, record, Deny(Reason.STORE_UNAVAILABLE, str(exc)))
    finally:
        slot.release()
    if isinstance(answer, Answered):
        record.decision, record.response_status = Decision.ALLOW, 200
        _emit(call, record)
    return answer


async def _get(call: McpCall, args: dict[str, Any], record: AuditRecord) -> Answer:
    operation_id = args.pop("operation_id", None)
    refused = _unexpected(args) or _invalid_operation_id(operation_id)
    if refused is not None:
        return _refuse(call, record, refused)
    assert isinstance(operation_id, str)
    gw, agent = call.gateway, call.agent
    view = await operation_view(gw, agent, operation_id, record, with_request=True)
    if isinstance(view, ReadRefusal):
        told = view.told if view.told is not view.reason else None
        return _refuse(call, record, Deny(view.reason, view.detail), told=told)
    return Answered(view)


async def list_unsettled(call: McpCall) -> Answer:
    """``resources/list``: the agent's unsettled operations, as ``list_operations``."""
    return await _guarded(
        call,
        "resources/list",
        None,
        lambda: _recorded_read(call, lambda record: _list(call, {}, record)),
    )


async def _list(call: McpCall, args: dict[str, Any], record: AuditRecord) -> Answer:
    refused = _unexpected(args)
    if refused is not None:
        return _refuse(call, record, refused)
    views = await unsettled_views(call.gateway, call.agent, with_request=True)
    return Answered({"operations": views})


# -- proposals ---------------------------------------------------------------------------


async def _propose(call: McpCall, args: dict[str, Any], record: AuditRecord) -> Answer:
    """As ``POST /_opgate/v1/proposals``: validated as an approval is, stored pending."""
    record.rule = PROPOSAL_RULE
    result = await propose_for_agent(call.gateway, call.agent, args)
    if isinstance(result, ProposalRefusal):
        named = args.get("provider")  # on record only if it is one: the arguments are not
        if isinstance(named, str) and call.gateway.policy.provider_named(named) is not None:
            record.provider = named
        extra: dict[str, Any] = {"errors": result.errors} if result.errors else {}
        deny = Deny(Reason(result.code), result.detail, result.retry_after)
        return _refuse(call, record, deny, extra={**extra, **result.extra})
    record.provider, record.operation_id = result.provider, result.operation_id
    record.status_after = ProposalState.PENDING.value
    return Answered(await _proposal_view(call.gateway, result))


async def _get_proposal(call: McpCall, args: dict[str, Any], record: AuditRecord) -> Answer:
    """As ``GET /_opgate/v1/proposals/{id}``: the agent's own proposals only."""
    record.rule = PROPOSAL_RULE
    proposal_id = args.pop("proposal_id", None)
    refused = _unexpected(args)
    if refused is not None:
        return _refuse(call, record, refused)
    if not isinstance(proposal_id, str) or not valid_id(proposal_id, IdKind.PROPOSAL):
        return _refuse(call, record, Deny(Reason.PROPOSAL_UNKNOWN, id_rule(IdKind.PROPOSAL)))
    unknown = Deny(Reason.PROPOSAL_UNKNOWN, f"no proposal {proposal_id}")
    proposal = await call.gateway.store.load_proposal(proposal_id)
    if proposal is None:
        return _refuse(call, record, unknown)
    if proposal.tenant != call.agent.tenant or proposal.agent_id != call.agent.agent_id:
        # the same answer for "absent" and "not yours": no probing other tenants' ids
        scope = Deny(Reason.OPERATION_SCOPE_MISMATCH, unknown.detail)
        return _refuse(call, record, scope, told=unknown.reason)
    record.provider, record.operation_id = proposal.provider, proposal.operation_id
    record.status_after = proposal.state.value
    return Answered(await _proposal_view(call.gateway, proposal))


async def _proposal_view(gw: Gateway, proposal: Proposal) -> dict[str, Any]:
    operation = None
    if proposal.state is ProposalState.APPROVED:
        op = await gw.store.load(proposal.operation_id)
        operation = None if op is None else recovery_view(gw, op, with_request=True)
    return proposal_view(gw.policy, proposal, operation)


# -- execute ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prepared:
    """An execution checked and composed, not sent yet; ``record`` is the exchange's."""

    op: Operation
    composed: ComposedRequest
    record: AuditRecord


async def _prepare(call: McpCall, args: dict[str, Any]) -> _Prepared | ToolError:
    gw = call.gateway
    record = _record(call, MCP_RULE)
    operation_id = args.pop("operation_id", None)
    free_fields = args.pop("free_fields", None) or {}
    refused = _unexpected(args) or _invalid_operation_id(operation_id)
    if refused is None and not isinstance(free_fields, dict):
        refused = Deny(Reason.BODY_INVALID, "free_fields is an object: field -> value")
    if refused is not None:
        return _refuse(call, record, refused)
    assert isinstance(operation_id, str)
    op = await _operation_in_scope(call, record, operation_id)
    if isinstance(op, ToolError):
        return op
    provider = gw.policy.provider_named(op.provider)
    rule = provider.rule_named(op.action) if provider else None
    if provider is None or rule is None:
        why = f"the policy has no {op.provider} rule {op.action} any more"
        return _refuse(call, record, Deny(Reason.NO_MATCHING_RULE, why), op=op)
    composed = compose_request(provider, rule, op, call.token, free_fields)
    if isinstance(composed, Deny):
        return _refuse(call, record, composed, op=op)
    return _Prepared(op, composed, record)


async def _execute(call: McpCall, args: dict[str, Any]) -> Answer:
    prepared = await _prepare(call, args)
    if isinstance(prepared, ToolError):
        return prepared
    # From here on the pipeline writes the record: the composed request is an agent request.
    call.exchange.replaced()
    gw = call.gateway
    composed = prepared.composed
    response = await handle_composed_request(gw, composed, listener=LISTENER, source=call.source)
    return await _answer(gw, prepared.op.operation_id, response)


async def start_execution(
    call: McpCall, arguments: Mapping[str, Any] | None, running: set[asyncio.Task[Any]]
) -> Operation | ToolError:
    """``execute_operation`` as a task: checked and composed now (a refusal is answered
    inline), sent by the pipeline in the background, in this process. The operation row is
    the task, durable since its approval; the pipeline's record follows this exchange's."""

    async def start() -> Operation | ToolError:
        prepared = await _prepare(call, dict(arguments or {}))
        if isinstance(prepared, ToolError):
            return prepared
        op, record = prepared.op, prepared.record
        record.decision, record.response_status = Decision.ALLOW, 200
        record.provider, record.status_before = op.provider, op.status.value
        _emit(call, record)
        sending = asyncio.create_task(
            handle_composed_request(
                call.gateway, prepared.composed, listener=LISTENER, source=call.source
            )
        )
        running.add(sending)
        sending.add_done_callback(running.discard)
        return op

    return await _guarded(call, EXECUTE_OPERATION, arguments, start)


async def read_operation(call: McpCall, operation_id: str, what: str) -> Answer:
    """``tasks/get`` and ``resources/read`` (``what``): the operation's recovery view
    (reconciled first where it says reconcile), as ``get_operation`` reads it."""
    arguments = {"operation_id": operation_id}
    return await _guarded(
        call,
        what,
        arguments,
        lambda: _recorded_read(call, lambda record: _get(call, dict(arguments), record)),
    )


async def cancel_task(call: McpCall, task_id: str) -> Answer:
    """``tasks/cancel``: revoke the approval while nothing has left (the row still
    ``created``, in one conditional statement), or withdraw a pending proposal; refused with
    the reason otherwise."""

    async def cancel() -> Answer:
        record = _record(call, MCP_RULE)
        refused = _invalid_operation_id(task_id, IdKind.TASK)
        if refused is not None:
            return _refuse(call, record, refused)
        proposal = await _proposal_of(call, task_id)
        refused = _task_scope_refused(call, "tasks/cancel", proposal)
        if refused is not None:
            return _refuse(call, record, refused)
        if proposal is not None:
            return await _withdraw(call, record, proposal)
        op = await _operation_in_scope(call, record, task_id)
        if isinstance(op, ToolError):
            return op
        revoked = await call.gateway.store.revoke_unsent(
            task_id, "cancelled by the agent (tasks/cancel)", f"agent:{call.agent.agent_id}"
        )
        if revoked is None and not (op.status is Status.CREATED and op.revoked_at is not None):
            current = await call.gateway.store.load(task_id) or op
            why = f"it is {current.status.value}: something may have left"
            if current.status in (Status.CONFIRMED, Status.FAILED):
                why = f"it is settled ({current.status.value})"
            return _refuse(call, record, Deny(Reason.MCP_TASK_NOT_CANCELLABLE, why), op=current)
        settled = revoked or op
        record.provider, record.status_before = settled.provider, settled.status.value
        record.status_after = settled.status.value
        record.decision, record.response_status = Decision.ALLOW, 200
        _emit(call, record)
        return Answered({})

    return await _guarded(call, "tasks/cancel", {"operation_id": task_id}, cancel)


# -- tasks of proposals, tasks/update -------------------------------------------------------


@dataclass(frozen=True)
class TaskView:
    """What a task id names: an operation's recovery view, or a proposal's view."""

    kind: Literal["operation", "proposal"]
    view: dict[str, Any]


async def _proposal_of(call: McpCall, task_id: str) -> Proposal | None:
    """The proposal a task id names (any tenant's: the caller checks the scope), or None:
    a task id is a proposal's when it has the prefix and the proposal exists (an operation's
    id may start so too: then it is the operation's)."""
    if not valid_id(task_id, IdKind.PROPOSAL):
        return None
    return await call.gateway.store.load_proposal(task_id)


def _task_scope_refused(call: McpCall, method: str, proposal: Proposal | None) -> Deny | None:
    """Whether the token lacks the scope of what the task id was found to name (a proposal,
    else an operation): the spelling of the id decides nothing. The lacking scope is kept on
    the call for the endpoint's answer (``lacking``)."""
    scope = task_scope(method, proposal=proposal is not None)
    if call.scopes is None or scope in call.scopes:
        return None
    call.lacking = scope
    return Deny(Reason.MCP_SCOPE_INSUFFICIENT, f"the token does not grant {scope}")


def _own(call: McpCall, proposal: Proposal) -> bool:
    return proposal.tenant == call.agent.tenant and proposal.agent_id == call.agent.agent_id


async def read_task(call: McpCall, task_id: str) -> TaskView | ToolError:
    """``tasks/get``: a proposal's task (``get_proposal``'s view) or an operation's
    (``get_operation``'s), read as those tools read them, with one record."""
    kind: list[Literal["operation", "proposal"]] = ["operation"]

    async def read(record: AuditRecord) -> Answer:
        proposal = await _proposal_of(call, task_id)
        refused = _task_scope_refused(call, "tasks/get", proposal)
        if refused is not None:
            record.rule = MCP_RULE
            return _refuse(call, record, refused)
        if proposal is not None:
            kind[0] = "proposal"
            return await _get_proposal(call, {"proposal_id": task_id}, record)
        return await _get(call, {"operation_id": task_id}, record)

    answer = await _guarded(
        call,
        "tasks/get",
        {"operation_id": task_id},
        lambda: _recorded_read(call, read),
    )
    return answer if isinstance(answer, ToolError) else TaskView(kind[0], answer.content)


async def _withdraw(call: McpCall, record: AuditRecord, proposal: Proposal) -> Answer:
    """``tasks/cancel`` of a proposal's task: the pending proposal is withdrawn (nothing can
    have left before an approval); refused with the reason once it is not pending. Another
    agent's is told unknown, as ``get_proposal`` tells it."""
    record.rule = PROPOSAL_RULE
    if not _own(call, proposal):
        unknown = Deny(Reason.PROPOSAL_UNKNOWN, f"no proposal {proposal.proposal_id}")
        scope = Deny(Reason.OPERATION_SCOPE_MISMATCH, unknown.detail)
        return _refuse(call, record, scope, told=unknown.reason)
    record.provider, record.operation_id = proposal.provider, proposal.operation_id
    record.status_before = proposal.state.value
    withdrawn = await withdraw_proposal(call.gateway, proposal, "mcp")
    if isinstance(withdrawn, ProposalRefusal):
        record.status_after = record.status_before
        return _refuse(call, record, Deny(Reason.MCP_TASK_NOT_CANCELLABLE, withdrawn.detail))
    record.status_after = withdrawn.state.value
    record.decision, record.response_status = Decision.ALLOW, 200
    _emit(call, record)
    return Answered({})


async def watchable(
    call: McpCall, operation_ids: list[str], task_ids: list[str]
) -> tuple[list[str], list[str]]:
    """What a ``subscriptions/listen`` stream may watch of what it named: the operations, and
    the tasks (an operation's or a proposal's), in the agent's scope. Another tenant's is left
    out as an unknown one is: the stream's acknowledgement names only these."""

    async def operation_in_scope(operation_id: str) -> bool:
        if not valid_id(operation_id, IdKind.OPERATION):
            return False
        op = await call.gateway.store.load(operation_id)
        return op is not None and in_scope(op, call.agent)

    async def task_in_scope(task_id: str) -> bool:
        if not valid_id(task_id, IdKind.TASK):
            return False
        proposal = await _proposal_of(call, task_id)
        scope = task_scope("tasks/get", proposal=proposal is not None)
        if call.scopes is not None and scope not in call.scopes:
            return False  # left out, as one not in the agent's scope is
        if proposal is not None:
            return _own(call, proposal)
        return await operation_in_scope(task_id)

    operations = [i for i in dict.fromkeys(operation_ids) if await operation_in_scope(i)]
    tasks = [i for i in dict.fromkeys(task_ids) if await task_in_scope(i)]
    return operations, tasks


_ANSWER_ACTIONS = ("accept", "decline", "cancel")


def _decides(answer: Any) -> bool:
    """Whether an input response is more than the answer to a URL-mode elicitation (an
    ``action``, no ``content``): the only question opgate ever asks a task's client."""
    if not isinstance(answer, dict) or answer.get("action") not in _ANSWER_ACTIONS:
        return True
    return bool(set(answer) - {"action", "_meta"})


async def update_task(call: McpCall, task_id: str, responses: Mapping[str, Any]) -> Answer:
    """``tasks/update``: the client's answers to what the task asked. opgate asks only that
    the user open the proposal's approval page, so an answer is acknowledged and changes
    nothing (``accept`` means only that the user agreed to open it); an answer that carries
    more (content: a decision) is refused, since the agent's token never approves; answers
    to keys never asked are ignored, as the extension says."""

    async def update() -> Answer:
        record = _record(call, MCP_RULE)
        refused = _invalid_operation_id(task_id, IdKind.TASK)
        if refused is not None:
            return _refuse(call, record, refused)
        proposal = await _proposal_of(call, task_id)
        scope = _task_scope_refused(call, "tasks/update", proposal)
        if scope is not None:
            return _refuse(call, record, scope)
        if proposal is not None:
            record.rule = PROPOSAL_RULE
            unknown = Deny(Reason.PROPOSAL_UNKNOWN, f"no proposal {task_id}")
            if not _own(call, proposal):
                scope = Deny(Reason.OPERATION_SCOPE_MISMATCH, unknown.detail)
                return _refuse(call, record, scope, told=unknown.reason)
            record.provider, record.operation_id = proposal.provider, proposal.operation_id
            record.status_before = record.status_after = proposal.state.value
        else:
            op = await _operation_in_scope(call, record, task_id)
            if isinstance(op, ToolError):
                return op
            record.provider = op.provider
            record.status_before = record.status_after = op.status.value
        deciding = sorted(key for key, answer in responses.items() if _decides(answer))
        if deciding:
            why = (
                f"the answer to {', '.join(deciding)} carries more than an action: opgate only "
                "asks the user to open the approval page; an approver decides there, and the "
                "agent's token never approves or declines"
            )
            return _refuse(call, record, Deny(Reason.MCP_TASK_INPUT_REFUSED, why))
        record.decision, record.response_status = Decision.ALLOW, 200
        _emit(call, record)
        return Answered({})

    return await _guarded(call, "tasks/update", {"operation_id": task_id}, update)


async def _answer(gw: Gateway, operation_id: str, response: web.StreamResponse) -> Answer:
    """The pipeline's answer, with the row as it is now and what to do next."""
    assert isinstance(response, web.Response)  # the pipeline answers with whole responses
    try:
        current = await gw.store.load(operation_id)
    except StoreUnavailable:
        current = None
    recovery = recovery_view(gw, current) if current is not None else None
    problem = response.get(PROBLEM)
    if problem is not None:
        if recovery is not None:
            problem = {**problem, "recovery": _recovery_fields(recovery)}
        return ToolError(problem)
    body = response.body if isinstance(response.body, bytes) else b""
    content_type = response.headers.get("Content-Type")
    provider_response = {
        "status": response.status,
        "replayed": response.headers.get("Idempotent-Replayed") == "true",
        "content_type": content_type,
        "body": decoded_body(content_type, body),
    }
    content: dict[str, Any] = {"provider_response": provider_response}
    if recovery is not None:
        content.update(operation=recovery["operation"], **_recovery_fields(recovery))
    else:  # the store went away after the answer: the answer still stands
        content.update(operation={}, next_action="wait", reason="the row could not be read")
    return Answered(content, failed=response.status >= 400)


def _recovery_fields(view: dict[str, Any]) -> dict[str, Any]:
    return {
        "next_action": view["next_action"],
        "reason": view["reason"],
        "retry_after_seconds": view["retry_after_seconds"],
    }


# -- refusals and records ---------------------------------------------------------------------


def _unexpected(args: dict[str, Any]) -> Deny | None:
    if args:
        names = ", ".join(sorted(args))
        return Deny(Reason.PARAMETER_UNEXPECTED, f"this tool takes no argument {names}")
    return None


def _invalid_operation_id(value: Any, kind: IdKind = IdKind.OPERATION) -> Deny | None:
    if valid_id(value, kind):
        return None
    return Deny(Reason.OPERATION_ID_INVALID, id_rule(kind))


async def _operation_in_scope(
    call: McpCall, record: AuditRecord, operation_id: str
) -> Operation | ToolError:
    """The operation, read from the primary, if it is in the agent's scope; else the refusal
    on record (an operation of another scope is told exactly what an absent id is told, and a
    store fault is ``store_unavailable``, nothing sent)."""
    record.operation_id = operation_id
    try:
        op = await call.gateway.store.load(operation_id)
    except StoreUnavailable as exc:
        record.decision = Decision.ERROR
        return _refuse(call, record, Deny(Reason.STORE_UNAVAILABLE, f"nothing was sent: {exc}"))
    unknown = Deny(Reason.OPERATION_UNKNOWN, f"no operation {operation_id}")
    if op is None:
        return _refuse(call, record, unknown)
    if not in_scope(op, call.agent):
        scope = Deny(Reason.OPERATION_SCOPE_MISMATCH, unknown.detail)
        return _refuse(call, record, scope, told=unknown.reason)
    return op


def _record(call: McpCall, rule: str) -> AuditRecord:
    return AuditRecord(
        source=call.source,
        method="POST",
        path=call.path,
        policy_version=call.gateway.policy.version,
        listener=LISTENER,
        agent_id=call.agent.agent_id,
        tenant=call.agent.tenant,
        rule=rule,
    )


def _refuse(
    call: McpCall,
    record: AuditRecord,
    deny: Deny,
    *,
    told: Reason | None = None,
    op: Operation | None = None,
    extra: dict[str, Any] | None = None,
) -> ToolError:
    """Refuse with ``deny`` on record; the agent is told ``told`` instead where the truth
    would reveal another scope's operation (then nothing of the row either)."""
    if record.decision != Decision.ERROR:
        record.decision = Decision.DENY
    record.reason = deny.reason.value
    if op is not None:
        record.operation_id, record.provider = op.operation_id, op.provider
        record.status_before = record.status_after = op.status.value
    shown = told or deny.reason
    response = problem_response(
        shown,
        deny.detail,
        operation_id=op.operation_id if op is not None and told is None else None,
        retry_after=deny.retry_after_seconds,
        extra=extra or None,
    )
    record.response_status = response.status
    _emit(call, record)
    return ToolError(response[PROBLEM])


def _emit(call: McpCall, record: AuditRecord) -> None:
    call.exchange.replaced()
    emit(record)
