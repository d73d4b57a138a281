"""The MCP tasks extension with the official client: execute_operation answered as a task
(the operation), tasks/get from the row, tasks/cancel only while nothing left, and the task
only for clients that declare the extension."""

from __future__ import annotations

import asyncio
import json
import sys
from asyncio.subprocess import Process
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from tests.mcp.conftest import approved_refund
from tests.support.crash_handoff import HoldingRelay, approve, refund_approval
from tests.support.killable_opgate import REPO, spawn_opgate
from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.mcp_client import http_client, refused_code
from tests.support.mcp_tasks import (
    TASKS,
    CreatedTask,
    cancel_task,
    execute_as_task,
    get_task,
    polled,
    tasks_client,
)
from tests.support.opgate import AGENT_TOKEN, OTHER_TENANT_TOKEN, Opgate


async def test_a_client_that_declares_tasks_gets_the_operation_as_a_task_that_completes(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """The handle is the operation id, working; tasks/get polls it to completed with the
    tool's result (the provider's answer); one refund."""
    op = await approved_refund(stripe_gate, localstripe_url)
    async with tasks_client(stripe_gate.agent_url, AGENT_TOKEN) as client:
        created = await execute_as_task(client, op["operation_id"])
        assert isinstance(created, CreatedTask), created
        done = await polled(client, created.task_id)
    assert (created.task_id, created.status) == (op["operation_id"], "working")
    assert done["status"] == "completed", done
    [refund] = await list_refunds(localstripe_url, charge=op["params"]["charge"])
    result = done["result"]
    assert result["isError"] is False
    assert result["structuredContent"]["provider_response"]["body"]["id"] == refund["id"]
    assert result["structuredContent"]["next_action"] == "proceed"
    assert done["taskId"] == op["operation_id"]
    assert {"createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"} <= set(done)


async def test_a_client_without_the_extension_gets_the_answer_inline(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """No declaration, no task: the tool answers as it always did; tasks/get is -32021."""
    op = await approved_refund(stripe_gate, localstripe_url)
    async with tasks_client(stripe_gate.agent_url, AGENT_TOKEN, tasks=False) as client:
        result = await execute_as_task(client, op["operation_id"])
        with pytest.raises(MCPError) as refused:
            await get_task(client, op["operation_id"])
    assert isinstance(result, CallToolResult)
    assert result.is_error is False
    assert refused.value.error.code == -32021


async def test_cancel_revokes_while_nothing_left_and_is_refused_after(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """tasks/cancel of an unsent operation revokes it (the task is cancelled, executing is
    refused approval_revoked); of a settled one it is refused with its reason."""
    unsent = await approved_refund(stripe_gate, localstripe_url)
    sent = await approved_refund(stripe_gate, localstripe_url)
    async with tasks_client(stripe_gate.agent_url, AGENT_TOKEN) as client:
        assert (await cancel_task(client, unsent["operation_id"]))["resultType"] == "complete"
        cancelled = await get_task(client, unsent["operation_id"])
        created = await execute_as_task(client, sent["operation_id"])
        assert isinstance(created, CreatedTask)
        await polled(client, created.task_id)
        with pytest.raises(MCPError) as late:
            await cancel_task(client, sent["operation_id"])
    async with http_client(stripe_gate.agent_url, AGENT_TOKEN) as plain:
        revoked = await plain.call_tool(
            "execute_operation", {"operation_id": unsent["operation_id"]}
        )
    assert cancelled["status"] == "cancelled"
    assert refused_code(revoked) == "approval_revoked"
    assert late.value.error.data["code"] == "mcp_task_not_cancellable"
    assert await list_refunds(localstripe_url, charge=unsent["params"]["charge"]) == []


async def test_another_tenants_task_is_not_found(stripe_gate: Opgate, localstripe_url: str) -> None:
    """tasks/get of another tenant's operation answers what an unknown id answers: -32602."""
    op = await approved_refund(stripe_gate, localstripe_url)
    async with tasks_client(stripe_gate.agent_url, OTHER_TENANT_TOKEN) as client:
        with pytest.raises(MCPError) as theirs:
            await get_task(client, op["operation_id"])
        with pytest.raises(MCPError) as absent:
            await get_task(client, "op_absent_1")
    assert theirs.value.error.code == absent.value.error.code == -32602
    assert theirs.value.error.message == absent.value.error.message


async def start_task_agent(agent_url: str, operation_id: str) -> tuple[Process, dict[str, Any]]:
    """An agent process that executes as a task and prints the handle, then lives on."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "tests.support.mcp_tasks", "start", agent_url, AGENT_TOKEN, operation_id),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    assert line, "the agent printed no task handle"
    return process, json.loads(line)


async def poll_task_agent(agent_url: str, task_id: str) -> dict[str, Any]:
    """A fresh agent process with only the task id: polls until the task ends."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "tests.support.mcp_tasks", "poll", agent_url, AGENT_TOKEN, task_id),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, err.decode()[-2000:]
    task: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return task


async def test_killed_with_the_answer_held_another_replica_completes_the_task_from_its_id(
    opgate_env: dict[str, str],
    relay: HoldingRelay,
    localstripe_url: str,
    tmp_path: Path,
) -> None:
    """The agent executes as a task; localstripe refunds, the answer is held; opgate and the
    agent are SIGKILLed. A second agent process with only the task id, against a second opgate
    process (up before the first died: another replica), polls the task to completed with the
    refund as its result. One refund at the provider."""
    charge = await create_charge(localstripe_url, 2000)
    first = await spawn_opgate(opgate_env, tmp_path / "opgate-1.log")
    second = None
    agent = None
    try:
        op = await approve(first.ops_url, refund_approval(charge))
        relay.hold = "after"
        agent, created = await start_task_agent(first.agent_url, op["operation_id"])
        await asyncio.wait_for(relay.reached.wait(), 30)
        second = await spawn_opgate(opgate_env, tmp_path / "opgate-2.log")
        await first.kill()
        agent.kill()
        await agent.wait()
        relay.release.set()
        done = await poll_task_agent(second.agent_url, created["taskId"])
    finally:
        if agent is not None and agent.returncode is None:
            agent.kill()
            await agent.wait()
        await first.kill()
        relay.release.set()
        if second is not None:
            await second.stop()
    assert (created["resultType"], created["taskId"]) == ("task", op["operation_id"])
    assert created["status"] == "working"
    [refund] = await list_refunds(localstripe_url, charge=charge)
    assert refund["metadata"]["operation_id"] == op["operation_id"]
    assert done["status"] == "completed", done
    content = done["result"]["structuredContent"]
    assert content["operation"]["status"] == "confirmed"
    assert content["operation"]["provider_response"]["object_id"] == refund["id"]
    assert relay.forwarded_posts == 1


async def test_the_extension_is_advertised_on_discovery_and_never_to_the_handshake_era(
    stripe_gate: Opgate,
) -> None:
    """server/discover (2026-07-28) lists the extension; an initialize handshake (whose era
    has no extensions) does not, and its tools/call never answers a task."""
    headers = {
        "Authorization": f"Bearer {AGENT_TOKEN}",
        "Accept": "application/json, text/event-stream",
    }
    handshake = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"extensions": {TASKS: {}}},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    url = f"{stripe_gate.agent_url}/_opgate/mcp"
    async with stripe_gate.http.post(url, json=handshake, headers=headers) as response:
        legacy = (await response.json())["result"]["capabilities"]
    async with tasks_client(stripe_gate.agent_url, AGENT_TOKEN) as client:
        modern = client.server_capabilities
    assert TASKS not in (legacy.get("extensions") or {})
    assert modern is not None
    assert modern.extensions is not None
    assert TASKS in modern.extensions
