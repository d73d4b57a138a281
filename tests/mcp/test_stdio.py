"""``opgate mcp --url --token`` spawned over stdio by the official MCP client, the way a local
agent runtime spawns its tools, relaying to a real opgate in front of localstripe."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import TextResourceContents

from tests.mcp.conftest import approved_refund, revoke
from tests.support.environment import inherited
from tests.support.localstripe_server import list_refunds
from tests.support.mcp_client import refused_code, stdio_client, structured
from tests.support.mcp_tasks import (
    CreatedTask,
    TasksExtension,
    cancel_task,
    execute_as_task,
    get_task,
    polled,
    propose_as_task,
    update_task,
)
from tests.support.opgate import AGENT_TOKEN, OTHER_TENANT_TOKEN, Opgate
from tests.support.paths import REPO


async def test_over_stdio_the_tools_execute_once_replay_conceal_and_refuse(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """Through the stdio relay: the tools with their annotations; one refund with
    metadata.operation_id, a replayed repeat; another tenant's operation told as unknown; a
    revoked one refused with approval_revoked."""
    op = await approved_refund(stripe_gate, localstripe_url)
    revoked = await approved_refund(stripe_gate, localstripe_url)
    await revoke(stripe_gate, revoked["operation_id"])
    operation_id = op["operation_id"]
    async with stdio_client(stripe_gate.agent_url, AGENT_TOKEN) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        first = await client.call_tool("execute_operation", {"operation_id": operation_id})
        again = await client.call_tool("execute_operation", {"operation_id": operation_id})
        refused = await client.call_tool(
            "execute_operation", {"operation_id": revoked["operation_id"]}
        )
    async with stdio_client(stripe_gate.agent_url, OTHER_TENANT_TOKEN) as client:
        theirs = await client.call_tool("execute_operation", {"operation_id": operation_id})
        absent = await client.call_tool("execute_operation", {"operation_id": "op_absent_1"})

    execute = tools["execute_operation"].annotations
    assert execute is not None
    assert (execute.destructive_hint, execute.idempotent_hint) == (True, True)
    get = tools["get_operation"].annotations
    assert get is not None
    assert get.read_only_hint is True
    [refund] = await list_refunds(localstripe_url, charge=op["params"]["charge"])
    assert refund["metadata"]["operation_id"] == operation_id
    assert structured(first)["provider_response"]["body"]["id"] == refund["id"]
    assert structured(again)["provider_response"]["replayed"] is True
    assert refused_code(refused) == "approval_revoked"
    assert refused_code(theirs) == refused_code(absent) == "operation_unknown"
    assert await list_refunds(localstripe_url, charge=revoked["params"]["charge"]) == []


async def test_over_stdio_a_request_with_invalid_params_gets_an_error_answer(
    stripe_gate: Opgate,
) -> None:
    """A request with an id whose params do not fit its method is answered with a JSON-RPC
    error for that id, never with silence (the client would wait forever)."""
    env = inherited()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "proxy", "mcp", "--url", stripe_gate.agent_url, "--token", AGENT_TOKEN),
        cwd=REPO,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    initialize = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    }
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": "execute_operation"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": [1]},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": 5}},
    ]
    try:
        for message in messages:
            child.stdin.write(json.dumps(message).encode() + b"\n")
        await child.stdin.drain()
        answers: dict[int, dict[str, Any]] = {}
        async with asyncio.timeout(20):
            while len(answers) < 4:
                line = await child.stdout.readline()
                assert line, "the relay closed its output"
                answer = json.loads(line)
                answers[answer["id"]] = answer
    finally:
        child.stdin.close()
        if child.returncode is None:
            child.terminate()
        await child.wait()
    assert "result" in answers[1]
    assert answers[2]["error"]["code"] == -32602  # invalid params
    assert answers[3]["error"]["code"] == -32602
    assert answers[4]["error"]["code"] == -32602


async def test_over_stdio_tasks_work_as_over_http(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """A stdio client that declares the tasks extension gets execute_operation as a task
    (the operation id) and polls it to completed through the relay; a proposal is a task
    too, whose update is acknowledged and whose cancel withdraws it (a second cancel is
    refused with opgate's reason)."""
    op = await approved_refund(stripe_gate, localstripe_url)
    proposal = {
        "provider": "stripe",
        "action": "refund.create",
        "amount": 100,
        "params": {"charge": op["params"]["charge"]},
        "reason": "a second partial refund",
    }
    async with stdio_client(
        stripe_gate.agent_url, AGENT_TOKEN, extensions=[TasksExtension()]
    ) as client:
        created = await execute_as_task(client, op["operation_id"])
        assert isinstance(created, CreatedTask), created
        done = await polled(client, created.task_id)
        proposed = await propose_as_task(client, proposal)
        assert isinstance(proposed, CreatedTask), proposed
        waiting = await get_task(client, proposed.task_id)
        updated = await update_task(client, proposed.task_id, {"approval": {"action": "accept"}})
        await cancel_task(client, proposed.task_id)
        withdrawn = await get_task(client, proposed.task_id)
        with pytest.raises(MCPError) as refused:
            await cancel_task(client, proposed.task_id)
    assert created.task_id == op["operation_id"]
    assert done["status"] == "completed", done
    [refund] = await list_refunds(localstripe_url, charge=op["params"]["charge"])
    assert done["result"]["structuredContent"]["provider_response"]["body"]["id"] == refund["id"]
    assert waiting["status"] == "input_required"
    assert updated.get("resultType") == "complete"
    assert withdrawn["status"] == "cancelled", withdrawn
    assert refused.value.error.code == -32602
    assert refused.value.error.data["code"] == "mcp_task_not_cancellable"


async def test_over_stdio_operations_are_resources_as_over_http(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """Through the relay: the template opgate://operations/{operation_id}, the unsettled
    operation listed beside the proposal card, its read (the row, next_action send, the exact
    request) as over HTTP; another tenant reading it gets what an unknown id gets."""
    op = await approved_refund(stripe_gate, localstripe_url)
    uri = f"opgate://operations/{op['operation_id']}"
    async with stdio_client(stripe_gate.agent_url, AGENT_TOKEN) as client:
        templates = await client.list_resource_templates()
        listed = await client.list_resources()
        read = await client.read_resource(uri)
    async with stdio_client(stripe_gate.agent_url, OTHER_TENANT_TOKEN) as other:
        with pytest.raises(MCPError) as theirs:
            await other.read_resource(uri)
        with pytest.raises(MCPError) as absent:
            await other.read_resource("opgate://operations/op_absent_1")
    [template] = templates.resource_templates
    assert template.uri_template == "opgate://operations/{operation_id}"
    assert {uri, "ui://opgate/proposal-card.html"} <= {str(r.uri) for r in listed.resources}
    [contents] = read.contents
    assert isinstance(contents, TextResourceContents)
    view = json.loads(contents.text)
    assert (view["operation"]["operation_id"], view["next_action"]) == (op["operation_id"], "send")
    assert view["request"]["path"] == "/stripe/v1/refunds"
    assert theirs.value.error.code == absent.value.error.code == -32602
    assert theirs.value.error.message == absent.value.error.message == "Resource not found"
