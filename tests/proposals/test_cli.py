"""``opgate proposals``: an approver lists, approves and declines proposals from a terminal,
run as an operator runs it (a subprocess against a real opgate)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from tests.support.killable_opgate import REPO
from tests.support.opgate import ADMIN_TOKEN, Opgate


async def proposals(gate: Opgate, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "OPGATE_OPS_URL": gate.ops_url, "OPGATE_ADMIN_TOKEN": ADMIN_TOKEN}
    env.pop("OPGATE_APPROVER_TOKEN", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "proposals",
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def propose(gate: Opgate, amount: int) -> dict[str, Any]:
    body = {
        "provider": "fault",
        "action": "refund.create",
        "amount": amount,
        "currency": "usd",
        "params": {"charge": "ch_1"},
        "reason": f"refund {amount}",
    }
    status, _, raw = await gate.send(
        "/_opgate/v1/proposals", data=json.dumps(body), content_type="application/json"
    )
    assert status == 201, raw
    proposed: dict[str, Any] = json.loads(raw)
    return proposed["proposal"]


async def test_list_approve_and_decline_from_the_command_line(fault_gate: Opgate) -> None:
    """Pending proposals are listed as a table; approve (--by, with the admin token) creates
    the operation, decline leaves none, and deciding a decided one exits 1 with its code."""
    first, second = await propose(fault_gate, 700), await propose(fault_gate, 800)
    code, table, err = await proposals(fault_gate, "list")
    assert code == 0, err
    assert table.splitlines()[0].split()[:3] == ["PROPOSAL_ID", "TENANT", "AGENT_ID"]
    assert first["proposal_id"] in table
    assert second["proposal_id"] in table
    assert "7.00 USD (700 minor units)" in table  # money as a person reads it, never "700"

    code, out, err = await proposals(
        fault_gate, "approve", first["proposal_id"], "--by", "alice", "--note", "ok", "--json"
    )
    assert code == 0, err
    approved = json.loads(out)
    assert approved["operation"]["operation_id"] == first["operation_id"]
    assert approved["operation"]["approval"]["approved_by"] == "alice"
    assert approved["next_action"] == "send"

    code, out, err = await proposals(fault_gate, "decline", second["proposal_id"], "--json")
    assert code == 0, err
    assert json.loads(out)["status"] == "declined"

    code, out, err = await proposals(fault_gate, "approve", second["proposal_id"])
    assert code == 1
    assert "proposal_not_pending" in err
    code, out, err = await proposals(fault_gate, "--json", "list", "--status", "decided")
    assert code == 0, err
    decided = {v["proposal"]["proposal_id"]: v["status"] for v in json.loads(out)["proposals"]}
    assert decided == {first["proposal_id"]: "approved", second["proposal_id"]: "declined"}
