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

import httpx2
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, Request, RequestParams, Result
from pydantic import ConfigDict, Field, TypeAdapter

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
    """``tasks/get`` at the task's ``pollIntervalMs`` until it ends (bounded)."""
    async with asyncio.timeout(seconds):
        while True:
            task = await get_task(client, task_id)
            if task["status"] in TERMINAL:
                return task
            await asyncio.sleep(task.get("pollIntervalMs", 1000) / 1000)


class TasksExtension(ClientExtension):
    identifier = TASKS

    def claims(self) -> list[ResultClaim[Any]]:
        async def resolve(task: CreatedTask, ctx: ClaimContext) -> CallToolResult:
            raise AssertionError("the tests take the task handle themselves (allow_claimed)")

        return [ResultClaim(result_type="task", model=CreatedTask, resolve=resolve)]


@contextlib.asynccontextmanager
async def tasks_client(
    agent_url: str, token: str, *, tasks: bool = True, url_elicitation: bool = False
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
            extensions=[TasksExtension()] if tasks else None,
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
