"""Proposals through MCP: an agent asks a human for an approval of an exact request, waits
for the decision with get_proposal, and executes the operation the approval created."""

from __future__ import annotations

from typing import Any

from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.mcp_client import http_client, refused_code, structured
from tests.support.opgate import ADMIN_TOKEN, AGENT_TOKEN, OTHER_TENANT_TOKEN, Opgate


async def decide(gate: Opgate, proposal_id: str, verdict: str) -> dict[str, Any]:
    async with gate.http.post(
        f"{gate.ops_url}/v1/proposals/{proposal_id}/{verdict}",
        json={"decided_by": "alice@example.com"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        payload: dict[str, Any] = await response.json(content_type=None)
        assert response.status in (200, 201), payload
        return payload


def refund_proposal(charge: str, **extra: Any) -> dict[str, Any]:
    return {
        "provider": "stripe",
        "action": "refund.create",
        "amount": 500,
        "params": {"charge": charge},
        "reason": "the customer was charged twice",
        **extra,
    }


async def test_proposed_approved_then_executed_once(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """propose_operation -> pending (wait, nothing sent) -> a human approves -> get_proposal
    names the operation and says send -> execute_operation makes exactly one refund."""
    charge = await create_charge(localstripe_url, 2000)
    async with http_client(stripe_gate.agent_url, AGENT_TOKEN) as client:
        proposed = await client.call_tool("propose_operation", refund_proposal(charge))
        pending = structured(proposed)
        proposal_id = pending["proposal"]["proposal_id"]
        await decide(stripe_gate, proposal_id, "approve")
        approved = structured(await client.call_tool("get_proposal", {"proposal_id": proposal_id}))
        executed = await client.call_tool(
            "execute_operation", {"operation_id": approved["operation_id"]}
        )
    assert not proposed.is_error
    assert (pending["status"], pending["next_action"]) == ("pending", "wait")
    assert (approved["status"], approved["next_action"]) == ("approved", "send")
    assert structured(executed)["next_action"] == "proceed"
    [refund] = await list_refunds(localstripe_url, charge=charge)
    assert refund["metadata"]["operation_id"] == approved["operation_id"]
    assert refund["amount"] == 500


async def test_a_declined_proposal_needs_a_new_approval_and_others_cannot_read_it(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """Declined: new_approval_required, nothing sent; another tenant's agent is told the
    proposal does not exist; an invalid proposal is refused with proposal_invalid."""
    charge = await create_charge(localstripe_url, 2000)
    async with http_client(stripe_gate.agent_url, AGENT_TOKEN) as client:
        proposed = structured(await client.call_tool("propose_operation", refund_proposal(charge)))
        proposal_id = proposed["proposal"]["proposal_id"]
        await decide(stripe_gate, proposal_id, "decline")
        declined = structured(await client.call_tool("get_proposal", {"proposal_id": proposal_id}))
        invalid = await client.call_tool("propose_operation", refund_proposal(charge, amount=-1))
    async with http_client(stripe_gate.agent_url, OTHER_TENANT_TOKEN) as client:
        theirs = await client.call_tool("get_proposal", {"proposal_id": proposal_id})
    assert (declined["status"], declined["next_action"]) == ("declined", "new_approval_required")
    assert refused_code(theirs) == "proposal_unknown"
    assert refused_code(invalid) == "proposal_invalid"
    assert await list_refunds(localstripe_url, charge=charge) == []
