"""The client half of the MCP tasks extension (``io.modelcontextprotocol/tasks``) for the
official ``mcp`` client, which ships none: the extension declared through the client's own
extension interface (``ClientExtension`` with a ``ResultClaim`` for ``resultType: "task"``),
and ``tasks/get`` / ``tasks/cancel`` sent as requests of the session.

    python -m tests.support.mcp_tasks start AGENT_URL TOKEN OPERATION_ID
        execute_operation as a task; prints the CreateTaskResult as one JSON line, then waits
        (to be killed: an agent that dies holding only the task id)
    python -m tests.support.mcp_tasks poll AGENT_URL TOKEN TASK_ID
        polls tasks/get at the pace the task asks until it ends; prints the last task
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
import httpx2
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CallToolResult,
    Request,
    RequestParams,
    Result,
    SubscriptionFilter,
    SubscriptionsListenRequest,
    SubscriptionsListenRequestParams,
)
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

TASKS = "io.modelcontextprotocol/tasks"
TERMINAL = ("completed", "failed", "cancelled")
_ANY: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


class CreatedTask(Result):
    """``CreateTaskResult``: the task's seed state."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")


class TaskParams(RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(Request[TaskParams, Literal["tasks/get"]]):
    name_param = "taskId"  # the extension: tasks/* carry Mcp-Name: <taskId>


class CancelTask(Request[TaskParams, Literal["tasks/cancel"]]):
    name_param = "taskId"


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


class UpdateTask(Request[UpdateParams, Literal["tasks/update"]]):
    name_param = "taskId"


async def get_task(client: Client, task_id: str) -> dict[str, Any]:
    request = GetTask(method="tasks/get", params=TaskParams(taskId=task_id))
    return await client.session.send_request(request, _ANY)


async def cancel_task(client: Client, task_id: str) -> dict[str, Any]:
    request = CancelTask(method="tasks/cancel", params=TaskParams(taskId=task_id))
    return await client.session.send_request(request, _ANY)


async def update_task(client: Client, task_id: str, responses: dict[str, Any]) -> dict[str, Any]:
    params = UpdateParams(taskId=task_id, inputResponses=responses)
    return await client.session.send_request(UpdateTask(method="tasks/update", params=params), _ANY)


async def polled(client: Client, task_id: str, seconds: float = 60.0) -> dict[str, Any]:
    """``tasks/get`` until the task ends (bounded), at the task's ``pollIntervalMs`` or every
    0.1 s if that is sooner: the interval is a suggestion, and for an attempt in flight opgate
    suggests its lease (tens of seconds), which a test need not wait out."""
    async with asyncio.timeout(seconds):
        while True:
            task = await get_task(client, task_id)
            if task["status"] in TERMINAL:
                return task
            await asyncio.sleep(min(task.get("pollIntervalMs", 1000) / 1000, 0.1))


class TaskNotice(BaseModel):
    """``notifications/tasks``: the task, as tasks/get answers it."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    task_id: str = Field(alias="taskId")
    status: str


class TasksExtension(ClientExtension):
    """``notices``: where ``notifications/tasks`` arrive (a listen stream's, see
    ``listen_to_tasks``)."""

    identifier = TASKS

    def __init__(self, notices: asyncio.Queue[TaskNotice] | None = None) -> None:
        self.notices = notices

    def notifications(self) -> list[NotificationBinding[Any]]:
        notices = self.notices
        if notices is None:
            return []

        async def heard(notice: TaskNotice) -> None:
            await notices.put(notice)

        return [
            NotificationBinding(method="notifications/tasks", params_type=TaskNotice, handler=heard)
        ]

    def claims(self) -> list[ResultClaim[Any]]:
        async def resolve(task: CreatedTask, ctx: ClaimContext) -> CallToolResult:
            raise AssertionError("the tests take the task handle themselves (allow_claimed)")

        return [ResultClaim(result_type="task", model=CreatedTask, resolve=resolve)]


@contextlib.asynccontextmanager
async def tasks_client(
    agent_url: str,
    token: str,
    *,
    tasks: bool = True,
    url_elicitation: bool = False,
    notices: asyncio.Queue[TaskNotice] | None = None,
) -> AsyncIterator[Client]:
    """The official client on the 2026-07-28 exchange, declaring the extension (``tasks``)
    and, with ``url_elicitation``, elicitation (it never answers one here: the tests read
    the task's ``inputRequests`` themselves)."""

    async def never(context: Any, params: Any) -> Any:
        raise AssertionError("opgate sent an elicitation outside the task")

    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx2.Timeout(30.0, read=60.0),
            trust_env=False,
        ) as http,
        Client(
            streamable_http_client(f"{agent_url}/_opgate/mcp", http_client=http),
            extensions=[TasksExtension(notices)] if tasks else None,
            elicitation_callback=never if url_elicitation else None,
        ) as client,
    ):
        yield client


async def execute_as_task(client: Client, operation_id: str) -> CreatedTask | CallToolResult:
    result = await client.session.call_tool(
        "execute_operation", {"operation_id": operation_id}, allow_claimed=True
    )
    assert isinstance(result, CreatedTask | CallToolResult), result
    return result


@contextlib.asynccontextmanager
async def listen_to_tasks(client: Client, task_ids: list[str]) -> AsyncIterator[dict[str, Any]]:
    """A ``subscriptions/listen`` stream with the extension's ``taskIds``; yields the
    acknowledged filter. ``Client.listen`` takes only the core kinds, so this sends the
    request as ``mcp.client.subscriptions.listen`` does, through the session's own
    machinery; the notifications arrive at the client's ``TasksExtension`` notices."""
    session = client.session
    request = SubscriptionsListenRequest(
        params=SubscriptionsListenRequestParams(
            notifications=SubscriptionFilter.model_validate({"taskIds": task_ids})
        )
    )
    request_id = f"listen-tasks-{id(task_ids)}"
    data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
    opts: Any = {"request_id": request_id}
    session._stamp(data, opts)
    route = session._register_listen_route(request_id)
    async with anyio.create_task_group() as group:

        async def drive() -> None:
            try:
                await session._dispatcher.send_raw_request(data["method"], data["params"], opts)
            except MCPError as error:  # refused: the waiting side raises it
                route.settle("lost", error=error)

        group.start_soon(drive)
        with anyio.fail_after(30):
            await route.acked.wait()
        refused = route.error if route.honored is None else None
        try:
            if route.honored is not None:
                yield route.honored.model_dump(by_alias=True, exclude_none=True)
        finally:
            session._unregister_listen_route(request_id)
            group.cancel_scope.cancel()
    if refused is not None:  # raised out here: the task group would wrap it
        raise refused


async def propose_as_task(
    client: Client, arguments: dict[str, Any]
) -> CreatedTask | CallToolResult:
    result = await client.session.call_tool("propose_operation", arguments, allow_claimed=True)
    assert isinstance(result, CreatedTask | CallToolResult), result
    return result


async def main(mode: str, agent_url: str, token: str, ident: str) -> None:
    async with tasks_client(agent_url, token) as client:
        if mode == "start":
            created = await execute_as_task(client, ident)
            print(created.model_dump_json(by_alias=True), flush=True)
            await asyncio.Event().wait()  # until killed
        else:
            print(json.dumps(await polled(client, ident)), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
