"""``opgate mcp --url --token`` spawned over stdio by the official MCP client, the way a local
agent runtime spawns its tools, relaying to a real opgate in front of localstripe."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from tests.mcp.conftest import approved_refund, revoke
from tests.support.localstripe_server import list_refunds
from tests.support.mcp_client import refused_code, stdio_client, structured
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPGATE_")}
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
