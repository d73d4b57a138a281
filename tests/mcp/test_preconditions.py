"""The shipped Stripe preconditions hold for MCP executions too: a charge refunded behind
opgate's back after an old approval stops execute_operation before anything is sent, with the
code the HTTP path gives, and the recovery read through MCP says a new approval is needed."""

from __future__ import annotations

import json

import aiohttp

from tests.mcp.conftest import approved_refund
from tests.support.localstripe_server import LOCALSTRIPE_API_KEY, list_refunds
from tests.support.mcp_client import http_client, refused_code, structured
from tests.support.opgate import AGENT_TOKEN, Opgate
from tests.support.preconditions import age_approval


async def test_a_failed_precondition_stops_mcp_as_it_stops_http(
    stripe_gate: Opgate, localstripe_url: str, database_url: str
) -> None:
    """Approval 10 minutes old, charge fully refunded since by a human: HTTP and MCP both get
    precondition_failed, localstripe keeps only the human's refund, and get_operation says
    new_approval_required."""
    op = await approved_refund(stripe_gate, localstripe_url)
    charge = op["params"]["charge"]
    await age_approval(database_url, op["operation_id"], 10)
    async with (  # a human refunds the whole charge, straight at localstripe
        aiohttp.ClientSession(trust_env=False) as http,
        http.post(
            f"{localstripe_url}/v1/refunds",
            data={"charge": charge},
            headers={"Authorization": f"Bearer {LOCALSTRIPE_API_KEY}"},
        ) as human,
    ):
        assert human.status == 200, await human.text()
    status, _, body = await stripe_gate.send(
        "/stripe/v1/refunds",
        data=f"charge={charge}&amount=500",
        headers={"X-Operation-Id": op["operation_id"], "Idempotency-Key": op["idempotency_key"]},
    )
    async with http_client(stripe_gate.agent_url, AGENT_TOKEN) as client:
        refused = await client.call_tool("execute_operation", {"operation_id": op["operation_id"]})
        view = structured(
            await client.call_tool("get_operation", {"operation_id": op["operation_id"]})
        )
    http_code = json.loads(body)["error"]["code"]  # the Stripe dialect: error.code
    assert (status, http_code) == (409, "precondition_failed")
    assert refused_code(refused) == "precondition_failed"
    assert view["next_action"] == "new_approval_required"
    assert len(await list_refunds(localstripe_url, charge=charge)) == 1
