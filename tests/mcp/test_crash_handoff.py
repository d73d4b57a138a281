"""The crash handoff through MCP alone, with real processes: the first agent executes an
approved refund through opgate's MCP endpoint, opgate is SIGKILLed after localstripe has made
the refund but before opgate heard the answer, and a fresh agent process with only the
operation id and MCP tools follows next_action to proceed. One refund exists."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.crash_handoff import HoldingRelay, approve, refund_approval
from tests.support.killable_opgate import REPO, spawn_opgate
from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.mcp_client import http_client
from tests.support.opgate import AGENT_TOKEN


async def mcp_replacement_agent(agent_url: str, operation_id: str) -> tuple[int, dict[str, Any]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.mcp_recovery_agent",
        agent_url,
        AGENT_TOKEN,
        operation_id,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    assert out, err.decode()
    outcome: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return process.returncode, outcome


async def execute_through_mcp(agent_url: str, operation_id: str) -> None:
    async with http_client(agent_url, AGENT_TOKEN) as client:
        await client.call_tool("execute_operation", {"operation_id": operation_id})


async def test_killed_after_the_refund_a_fresh_mcp_agent_proceeds_without_a_second_refund(
    opgate_env: dict[str, str],
    relay: HoldingRelay,
    localstripe_url: str,
    tmp_path: Path,
) -> None:
    """opgate dies after localstripe refunded but before the outcome was recorded; the fresh
    MCP agent is told to wait or reconcile, opgate finds the refund, and the agent proceeds."""
    charge = await create_charge(localstripe_url, 2000)
    first = await spawn_opgate(opgate_env, tmp_path / "opgate-1.log")
    try:
        op = await approve(first.ops_url, refund_approval(charge))
        relay.hold = "after"
        agent = asyncio.create_task(execute_through_mcp(first.agent_url, op["operation_id"]))
        await asyncio.wait_for(relay.reached.wait(), 30)
        await first.kill()
        with pytest.raises(Exception):  # noqa: B017, PT011 (the first agent never hears back)
            await agent
    finally:
        await first.kill()
        relay.release.set()
    restarted = await spawn_opgate(opgate_env, tmp_path / "opgate-2.log")
    try:
        code, outcome = await mcp_replacement_agent(restarted.agent_url, op["operation_id"])
    finally:
        await restarted.stop()
    assert code == 0, outcome
    view = outcome["view"]
    [refund] = await list_refunds(localstripe_url, charge=charge)
    assert refund["metadata"]["operation_id"] == op["operation_id"]
    assert outcome["steps"][-1] == "proceed"
    assert "send" not in outcome["steps"]
    assert "retry" not in outcome["steps"]
    assert view["operation"]["status"] == "confirmed"
    assert view["operation"]["settled_reason"] == "reconciled"
    assert view["operation"]["provider_response"]["object_id"] == refund["id"]
    assert relay.forwarded_posts == 1
