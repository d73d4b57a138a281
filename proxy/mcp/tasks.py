"""The MCP tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663, with the 2026-07-28
specification): ``execute_operation`` answers a task handle instead of blocking, and the task
is the operation.

- The task id is the operation id, and the task is the operation row: durable since the
  approval wrote it, before any handle is returned (as the extension requires), and read from
  PostgreSQL on every ``tasks/get``. So any replica answers for any task, and a replacement
  agent that kept only the task id continues it after the first agent and opgate died.
- Status from the row (``task_state``, pure): ``working`` while created or dispatched
  (sending, in flight, outcome unknown: ``tasks/get`` reconciles where the recovery read
  would), ``input_required`` while escalated to a human (opgate's console, not the client:
  no ``inputRequests``), ``completed`` once settled, with the tool's result (``isError`` when
  the provider refused or a new approval is needed, as the extension wants tool-level errors
  reported), ``cancelled`` once revoked with nothing sent. ``failed`` is kept for JSON-RPC
  errors, which no settled operation is. ``pollIntervalMs`` is opgate's own
  ``retry_after_seconds``.
- ``tasks/cancel`` revokes the approval while the row is still ``created`` (one conditional
  statement, so it never races a claim) and is refused with the reason otherwise.
- Only a client that declares the extension in the request's capabilities gets a task
  (2026-07-28 exchanges only); the others get the tool's answer inline.
- ``propose_operation`` answers a task too: the proposal (its id), ``input_required`` while
  it waits for an approver (``proposal_task_state``, pure: the console's approval page as a
  URL elicitation for a client that declared one), ``completed`` once decided (the
  operation id once approved, a tool error once declined or expired). ``tasks/cancel`` of
  it withdraws the proposal while it is pending (``cancelled``), and is refused once not.
- ``tasks/update`` acknowledges an answer to that elicitation and changes nothing; one that
  carries a decision is refused (``calls.update_task``): the agent's token never approves.

Built on the SDK's extension interface (``mcp.server.extension``): new methods as
``MethodBinding``, the task answer as a ``tools/call`` interceptor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import mcp.types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from proxy.mcp.calls import (
    McpCall,
    call_tool,
    cancel_task,
    read_task,
    start_execution,
    update_task,
)
from proxy.mcp.elicitation import APPROVAL, approval_request, url_elicitation_supported
from proxy.mcp.tools import (
    EXECUTE_OPERATION,
    PROPOSE_OPERATION,
    Answered,
    ToolError,
    decoded_body,
    tool_result,
)
from proxy.recovery.next_action import NextAction
from proxy.store.operation import Operation

TASKS = "io.modelcontextprotocol/tasks"
_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
DEFAULT_POLL_MS = 1000  # where opgate has no retry_after_seconds to give
# ttlMs: the extension's TTL is how long the server keeps a task ("The server may discard the
# task after the TTL elapses"), not the work's deadline; opgate keeps its rows and answers a
# task past any expiry, so null ("unlimited") is the true value (docs/mcp.md)
TTL_MS = None


class TaskParams(types.RequestParams):
    task_id: str = Field(alias="taskId", min_length=1, max_length=255)


class UpdateParams(TaskParams):
    # the answers are opgate's to judge (calls.update_task), not refused here in bulk
    input_responses: dict[str, Any] = Field(alias="inputResponses")


def negotiated(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's client declared the extension (per request: 2026-07-28)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    meta = (ctx.params or {}).get("_meta")
    capabilities = meta.get(_CAPABILITIES) if isinstance(meta, dict) else None
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and TASKS in extensions


def task_state(view: dict[str, Any]) -> dict[str, Any]:
    """The task (``DetailedTask``) an operation's recovery view stands for. Pure."""
    operation = view["operation"]
    action = NextAction(view["next_action"])
    retry_after = view.get("retry_after_seconds")
    task: dict[str, Any] = {
        "taskId": operation["operation_id"],
        "status": "working",
        "statusMessage": f"{action.value}: {view['reason']}",
        "createdAt": operation["created_at"],
        "lastUpdatedAt": operation["updated_at"],
        "ttlMs": TTL_MS,
        "pollIntervalMs": DEFAULT_POLL_MS if retry_after is None else max(retry_after, 0) * 1000,
    }
    revoked = operation["approval"]["revoked_at"] is not None
    if action is NextAction.PROCEED:
        task["status"] = "completed"
        task["result"] = _result(view, failed=False)
    elif action is NextAction.NEW_APPROVAL_REQUIRED:
        if operation["status"] == "created" and revoked:
            task["status"] = "cancelled"
        else:
            task["status"] = "completed"
            task["result"] = _result(view, failed=True)
    elif action is NextAction.ESCALATED:
        # The on-call human resolves it on opgate's console; the client's user is not that
        # human and the agent resolves nothing, so no elicitation is asked (docs/mcp.md: a
        # URL elicitation is input of the client's own user, completed by that same user).
        task["status"] = "input_required"
        task["inputRequests"] = {}
        task["statusMessage"] += (
            "; a human resolves it on opgate's console, nothing is asked of this client: "
            "poll until it settles"
        )
    return task


def proposal_task_state(view: dict[str, Any], console_url: str | None) -> dict[str, Any]:
    """The task a proposal's view (``get_proposal``'s) stands for. Pure. ``console_url``:
    ask the user to open the approval page (a client that declared URL elicitation)."""
    proposal = view["proposal"]
    retry_after = view.get("retry_after_seconds")
    task: dict[str, Any] = {
        "taskId": proposal["proposal_id"],
        "status": "input_required",
        "statusMessage": f"{view['next_action']}: {view['reason']}",
        "createdAt": proposal["created_at"],
        "lastUpdatedAt": proposal["decided_at"] or proposal["created_at"],
        "ttlMs": TTL_MS,  # it expires (then completed, isError) but is never discarded
        "pollIntervalMs": DEFAULT_POLL_MS if retry_after is None else max(retry_after, 0) * 1000,
    }
    if view["status"] == "withdrawn":  # by tasks/cancel (or its agent over HTTP)
        task["status"] = "cancelled"
        return task
    if view["status"] == "pending":
        asked = {} if console_url is None else {APPROVAL: approval_request(console_url, proposal)}
        task["inputRequests"] = {
            key: request.model_dump(by_alias=True, mode="json", exclude_none=True)
            for key, request in asked.items()
        }
        return task
    # approved: the operation it created (a task of its own); declined or expired: a tool
    # error, never "failed", which the extension keeps for JSON-RPC errors
    task["status"] = "completed"
    answer = tool_result(Answered(view, failed=view["status"] != "approved"))
    task["result"] = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
    return task


def _result(view: dict[str, Any], *, failed: bool) -> dict[str, Any]:
    operation = view["operation"]
    stored = operation.get("provider_response") or {}
    body = (stored.get("body") or "").encode("utf-8")
    content = {
        "provider_response": {  # the stored answer of the attempt that settled it
            "status": stored.get("status"),
            "replayed": True,
            "content_type": stored.get("content_type"),
            "body": decoded_body(stored.get("content_type"), body),
        },
        "operation": operation,
        "next_action": view["next_action"],
        "reason": view["reason"],
        "retry_after_seconds": view["retry_after_seconds"],
    }
    answer = tool_result(Answered(content, failed=failed))
    return answer.model_dump(by_alias=True, mode="json", exclude_none=True)


def _created(op: Operation) -> dict[str, Any]:
    """The ``CreateTaskResult``: the task's seed state, ``resultType: "task"``."""
    return {
        "resultType": "task",
        "taskId": op.operation_id,
        "status": "working",
        "statusMessage": "opgate is sending exactly the approved request",
        "createdAt": op.created_at.isoformat(),
        "lastUpdatedAt": op.updated_at.isoformat(),
        "ttlMs": TTL_MS,
        "pollIntervalMs": DEFAULT_POLL_MS,
    }


def _jsonrpc_error(error: ToolError) -> MCPError:
    """A refused tasks/* request as JSON-RPC: an unknown task is -32602 (the extension's
    rule), anything else opgate refused is -32603 with opgate's problem as ``data``."""
    code = error.problem.get("code")
    if code in ("operation_unknown", "operation_id_invalid", "proposal_unknown"):
        return MCPError(types.INVALID_PARAMS, "Failed to retrieve task: Task not found")
    if code in ("mcp_task_not_cancellable", "mcp_task_input_refused"):
        return MCPError(types.INVALID_PARAMS, str(error.problem.get("detail")), error.problem)
    return MCPError(types.INTERNAL_ERROR, str(error.problem.get("detail")), error.problem)


class OperationTasks(Extension):
    identifier = TASKS

    def __init__(self, call_of: Callable[[ServerRequestContext[Any, Any]], McpCall]) -> None:
        self.call_of = call_of
        self.running: set[asyncio.Task[Any]] = set()  # executions sent in the background

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("tasks/get", TaskParams, self._get),
            MethodBinding("tasks/update", UpdateParams, self._update),
            MethodBinding("tasks/cancel", TaskParams, self._cancel),
        )

    async def intercept_tool_call(
        self,
        params: types.CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if not negotiated(ctx) or params.request_state is not None:
            return await call_next(ctx)
        if params.name == PROPOSE_OPERATION:
            # the proposal row is written before the handle is returned: durable, as required
            proposed = await call_tool(self.call_of(ctx), PROPOSE_OPERATION, params.arguments)
            if isinstance(proposed, ToolError):
                return tool_result(proposed)
            seed = proposal_task_state(proposed.content, None)
            seed.pop("inputRequests", None)  # a CreateTaskResult is a Task: asked on tasks/get
            return {"resultType": "task", **seed}
        if params.name != EXECUTE_OPERATION:
            return await call_next(ctx)
        started = await start_execution(self.call_of(ctx), params.arguments, self.running)
        if isinstance(started, ToolError):
            return tool_result(started)
        return _created(started)

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        self._require(ctx)
        task = await self._task(ctx, params.task_id)
        if isinstance(task, ToolError):
            raise _jsonrpc_error(task)
        return {"resultType": "complete", **task}

    async def task_of(
        self, ctx: ServerRequestContext[Any, Any], task_id: str
    ) -> dict[str, Any] | None:
        """The task as ``tasks/get`` answers it now, or None where it cannot be read (for
        ``notifications/tasks``, which carry the same)."""
        task = await self._task(ctx, task_id)
        return None if isinstance(task, ToolError) else task

    async def _task(
        self, ctx: ServerRequestContext[Any, Any], task_id: str
    ) -> dict[str, Any] | ToolError:
        call = self.call_of(ctx)
        answer = await read_task(call, task_id)
        if isinstance(answer, ToolError):
            return answer
        if answer.kind == "operation":
            return task_state(answer.view)
        console = call.gateway.settings.console_url
        if not url_elicitation_supported(ctx.protocol_version, ctx.params):
            console = None
        return proposal_task_state(answer.view, console)

    async def _update(
        self, ctx: ServerRequestContext[Any, Any], params: UpdateParams
    ) -> HandlerResult:
        self._require(ctx)
        answer = await update_task(self.call_of(ctx), params.task_id, params.input_responses)
        if isinstance(answer, ToolError):
            raise _jsonrpc_error(answer)
        return {"resultType": "complete"}

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskParams
    ) -> HandlerResult:
        self._require(ctx)
        answer = await cancel_task(self.call_of(ctx), params.task_id)
        if isinstance(answer, ToolError):
            raise _jsonrpc_error(answer)
        return {"resultType": "complete"}

    @staticmethod
    def _require(ctx: ServerRequestContext[Any, Any]) -> None:
        """tasks/* from a client that did not declare the extension: -32021, as required."""
        if not negotiated(ctx):
            raise MCPError(
                -32021,
                "Missing required client capability",
                {"requiredCapabilities": {"extensions": {TASKS: {}}}},
            )

    async def drained(self) -> None:
        """Wait for the executions still being sent (the listener is stopping)."""
        if self.running:
            await asyncio.gather(*self.running, return_exceptions=True)
