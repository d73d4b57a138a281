"""Many agents executing one operation at once through MCP: one effect, whoever wins."""

from __future__ import annotations

import asyncio

from mcp.types import CallToolResult

from tests.mcp.conftest import approved_refund
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.localstripe_server import list_refunds
from tests.support.mcp_client import http_client, refused_code, structured
from tests.support.opgate import AGENT_TOKEN, Opgate

CALLERS = 20


async def execute(agent_url: str, operation_id: str) -> CallToolResult:
    """One agent with its own MCP client (and its own connections)."""
    async with http_client(agent_url, AGENT_TOKEN) as client:
        return await client.call_tool("execute_operation", {"operation_id": operation_id})


async def test_twenty_concurrent_executions_make_one_refund(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """20 execute_operation calls racing on one operation: localstripe has exactly one
    refund; one call sent it, every other was replayed its answer or refused as in flight."""
    op = await approved_refund(stripe_gate, localstripe_url)
    results = await asyncio.gather(
        *(execute(stripe_gate.agent_url, op["operation_id"]) for _ in range(CALLERS))
    )
    [refund] = await list_refunds(localstripe_url, charge=op["params"]["charge"])
    assert refund["metadata"]["operation_id"] == op["operation_id"]
    sent = [
        r for r in results if not r.is_error and not structured(r)["provider_response"]["replayed"]
    ]
    assert len(sent) == 1
    for result in results:
        if result.is_error:
            assert refused_code(result) == "operation_in_flight"
        else:
            assert structured(result)["provider_response"]["body"]["id"] == refund["id"]


async def test_concurrent_executions_overlap_a_slow_provider_and_still_act_once(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """With the provider slow to answer, the racing calls really overlap the one in flight:
    the provider receives one request, and the losers are refused as in flight."""
    fault_provider.mode = FaultMode.SLOW
    fault_provider.slow_seconds = 0.5
    op = await fault_gate.approve()
    results = await asyncio.gather(
        *(execute(fault_gate.agent_url, op["operation_id"]) for _ in range(CALLERS))
    )
    assert len(fault_provider.effects) == 1
    assert [r.method for r in fault_provider.requests].count("POST") == 1
    codes = [refused_code(r) for r in results if r.is_error]
    assert codes
    assert set(codes) == {"operation_in_flight"}
    assert len([r for r in results if not r.is_error]) == CALLERS - len(codes)
