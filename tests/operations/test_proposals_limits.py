"""Proposals cannot flood the approvers: they are admitted as every agent request is (rates,
in-flight caps), the pending proposals of an agent and of a tenant are capped, and a proposal
identical to one declined lately says so. Real opgate, real PostgreSQL, httpx as the agent and
the official ``mcp`` client for ``propose_operation``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio

from tests.support.fault_provider import FaultProvider
from tests.support.mcp_client import http_client, refused_code
from tests.support.opgate import (
    AGENT_TOKEN,
    OTHER_TENANT_TOKEN,
    SECOND_AGENT_TOKEN,
    Opgate,
    StartOpgate,
    admin_headers,
    fault_policy,
)

PROPOSAL: dict[str, Any] = {
    "provider": "fault",
    "action": "refund.create",
    "amount": 500,
    "currency": "usd",
    "params": {"charge": "ch_1"},
    "reason": "the customer was charged twice for order 1042",
}


@pytest_asyncio.fixture(loop_scope="session")
async def capped(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> AsyncIterator[Opgate]:
    """opgate whose agents may hold 3 pending proposals each, 5 per tenant."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url},
        max_pending_proposals_per_agent=3,
        max_pending_proposals_per_tenant=5,
    ) as gate:
        yield gate


async def propose(
    client: httpx.AsyncClient, gate: Opgate, token: str = AGENT_TOKEN, **fields: Any
) -> httpx.Response:
    return await client.post(
        f"{gate.agent_url}/_opgate/v1/proposals",
        json={**PROPOSAL, **fields},
        headers={"Authorization": f"Bearer {token}"},
    )


async def pending(client: httpx.AsyncClient, gate: Opgate) -> list[dict[str, Any]]:
    listed = await client.get(f"{gate.ops_url}/v1/proposals", headers=admin_headers())
    assert listed.status_code == 200
    proposals: list[dict[str, Any]] = listed.json()["proposals"]
    return proposals


async def decline(client: httpx.AsyncClient, gate: Opgate, proposal_id: str) -> None:
    declined = await client.post(
        f"{gate.ops_url}/v1/proposals/{proposal_id}/decline",
        json={"note": "not a duplicate charge"},
        headers=admin_headers(),
    )
    assert declined.status_code == 200, declined.text


async def test_proposals_are_admitted_like_every_agent_request(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """With one request per second per agent, 50 proposals sent at once leave one pending:
    the others are 429 rate_limited with Retry-After, before their body is read."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with (
        start_opgate(
            upstream_overrides={"fault": fault_provider.url}, requests_per_second_per_agent=1
        ) as gate,
        httpx.AsyncClient(trust_env=False, timeout=30) as client,
    ):
        answers = await asyncio.gather(*(propose(client, gate) for _ in range(50)))
        assert sorted({a.status_code for a in answers}) == [201, 429]
        refused = [a for a in answers if a.status_code == 429]
        assert len(refused) == 49
        assert all(a.json()["code"] == "rate_limited" for a in refused)
        assert all(int(a.headers["Retry-After"]) >= 1 for a in refused)
        assert len(await pending(client, gate)) == 1


async def test_pending_proposals_are_capped_per_agent_and_per_tenant(capped: Opgate) -> None:
    """An agent's 4th pending proposal is 429 rate_limited with Retry-After; another agent of
    the tenant gets 2 more (5 per tenant); another tenant is not held back; a decision frees a
    place."""
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        first = [await propose(client, capped) for _ in range(3)]
        assert [a.status_code for a in first] == [201] * 3
        over = await propose(client, capped)
        assert over.status_code == 429
        assert over.headers["Content-Type"] == "application/problem+json"
        assert over.json()["code"] == "rate_limited"
        assert "3 pending proposals" in over.json()["detail"]
        assert 1 <= int(over.headers["Retry-After"]) <= 60
        second = [await propose(client, capped, SECOND_AGENT_TOKEN) for _ in range(3)]
        assert [a.status_code for a in second] == [201, 201, 429]
        assert "5 pending proposals" in second[2].json()["detail"]
        other_tenant = await propose(client, capped, OTHER_TENANT_TOKEN)
        assert other_tenant.status_code == 201
        await decline(client, capped, first[0].json()["proposal"]["proposal_id"])
        again = await propose(client, capped, amount=400)
        assert again.status_code == 201
        assert (
            len([p for p in await pending(client, capped) if p["proposal"]["tenant"] == "t1"]) == 5
        )


async def test_concurrent_proposals_never_pass_the_cap(capped: Opgate) -> None:
    """Twelve proposals of one agent at once: exactly three are pending."""
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        answers = await asyncio.gather(*(propose(client, capped) for _ in range(12)))
        assert sorted(a.status_code for a in answers) == [201] * 3 + [429] * 9
        assert len(await pending(client, capped)) == 3


async def test_propose_operation_over_mcp_is_capped_too(capped: Opgate) -> None:
    """MCP propose_operation counts against the same cap and is refused rate_limited."""
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        for _ in range(3):
            assert (await propose(client, capped)).status_code == 201
    async with http_client(capped.agent_url, AGENT_TOKEN) as mcp:
        refused = await mcp.call_tool("propose_operation", dict(PROPOSAL))
    assert refused.is_error
    assert refused_code(refused) == "rate_limited"


async def test_a_proposal_identical_to_a_declined_one_says_so(capped: Opgate) -> None:
    """Proposed again after a decline, the same request (another reason) is pending and links
    the declined proposal, for the agent and for the approvers; another amount does not."""
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        first = (await propose(client, capped)).json()
        declined_id = first["proposal"]["proposal_id"]
        assert first["proposal"]["declined_twin"] is None
        await decline(client, capped, declined_id)
        again = await propose(client, capped, reason="but it really was charged twice")
        assert again.status_code == 201
        twin = again.json()
        assert twin["proposal"]["declined_twin"] == declined_id
        assert declined_id in twin["reason"]
        other = (await propose(client, capped, amount=400)).json()
        assert other["proposal"]["declined_twin"] is None
        listed = {p["proposal"]["proposal_id"]: p for p in await pending(client, capped)}
        assert listed[twin["proposal"]["proposal_id"]]["proposal"]["declined_twin"] == declined_id
        read = await client.get(
            f"{capped.agent_url}/_opgate/v1/proposals/{twin['proposal']['proposal_id']}",
            headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
        )
        assert json.loads(read.text)["proposal"]["declined_twin"] == declined_id


async def test_a_withdrawn_proposal_frees_its_place_under_the_cap(capped: Opgate) -> None:
    """An agent at its cap of 3 withdraws one pending proposal: its next one is admitted."""
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        first = [await propose(client, capped) for _ in range(3)]
        assert (await propose(client, capped)).status_code == 429
        withdrawn = await client.post(
            f"{capped.agent_url}/_opgate/v1/proposals/"
            f"{first[0].json()['proposal']['proposal_id']}/withdraw",
            headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
        )
        assert withdrawn.status_code == 200, withdrawn.text
        again = await propose(client, capped, amount=400)
        assert again.status_code == 201, again.text
        assert len(await pending(client, capped)) == 3
