"""``opgate mcp --url --token`` spawned over stdio by the official MCP client, the way a local
agent runtime spawns its tools, relaying to a real opgate in front of localstripe."""

from __future__ import annotations

from tests.mcp.conftest import approved_refund, revoke
from tests.support.localstripe_server import list_refunds
from tests.support.mcp_client import refused_code, stdio_client, structured
from tests.support.opgate import AGENT_TOKEN, OTHER_TENANT_TOKEN, Opgate


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
