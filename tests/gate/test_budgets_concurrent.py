"""A spend budget under real concurrency: two opgate processes, one database, localstripe."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import aiohttp
import asyncpg

from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.opgate import (
    ADMIN_TOKEN,
    AGENT_TOKEN,
    SHIPPED_POLICIES,
    admin_headers,
    process_env,
)
from tests.support.opgate_process import OpgateProcess, opgate_process

CLAIMS = 50
AMOUNT = 100
LIMIT = 4000  # room for 40 of the 50: ten over


def _budgeted_stripe_policy(directory: Path) -> None:
    """The shipped Stripe policy with a per-tenant budget, adjusted to localstripe (which does
    not deduplicate keys)."""
    text = (SHIPPED_POLICIES / "stripe.yaml").read_text()
    text = text.replace("provider_deduplicates: true", "provider_deduplicates: false")
    budget = f"budgets:\n  - {{scope: tenant, currency: usd, limit: {LIMIT}, window: 24h}}\n"
    text = text.replace("\nrules:\n", "\n" + budget + "rules:\n", 1)
    (directory / "stripe.yaml").write_text(text)


async def _approve(http: aiohttp.ClientSession, gate: OpgateProcess, charge: str) -> str:
    approval = {
        "tenant": "t1",
        "provider": "stripe",
        "action": "refund.create",
        "amount": AMOUNT,
        "currency": "usd",
        "params": {"charge": charge},
        "approval_ref": "budget-race",
        "approved_by": "alice@example.com",
        "ttl_seconds": 600,
    }
    async with http.post(
        f"{gate.ops_url}/v1/operations", json=approval, headers=admin_headers()
    ) as r:
        assert r.status == 201, await r.text()
        operation_id: str = (await r.json())["operation_id"]
        return operation_id


async def _refund(
    http: aiohttp.ClientSession, gate: OpgateProcess, operation_id: str, charge: str
) -> tuple[str, int, dict[str, object]]:
    async with http.post(
        f"{gate.agent_url}/stripe/v1/refunds",
        data=f"amount={AMOUNT}&charge={charge}",
        headers={
            "Authorization": f"Bearer {AGENT_TOKEN}",
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Operation-Id": operation_id,
        },
    ) as r:
        return gate.agent_url, r.status, json.loads(await r.read())


async def test_fifty_claims_on_two_processes_never_exceed_the_budget_together(
    database_url: str, localstripe_url: str, tmp_path: Path
) -> None:
    """50 separately approved refunds claimed at once through two processes, ten more than a
    budget allows: exactly 40 are sent (on both processes), localstripe holds exactly 40
    refunds, and the other ten are refused budget_exceeded with nothing left to spend."""
    policies = tmp_path / "policies"
    policies.mkdir()
    _budgeted_stripe_policy(policies)
    charge = await create_charge(localstripe_url, CLAIMS * AMOUNT * 2)
    environments = [
        process_env(
            database_url,
            policies,
            {"stripe": localstripe_url},
            OPGATE_INSTANCE_ID=name,
            OPGATE_BACKGROUND_INTERVAL_SECONDS="3600",
            OPGATE_POLICY_RELOAD_INTERVAL_SECONDS="0",
        )
        for name in ("budget-a", "budget-b")
    ]
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        opgate_process(environments[0]) as gate_a,
        opgate_process(environments[1]) as gate_b,
        aiohttp.ClientSession(trust_env=False, connector=connector) as http,
    ):
        gates = (gate_a, gate_b)
        ids = await asyncio.gather(*(_approve(http, gates[i % 2], charge) for i in range(CLAIMS)))
        answers = await asyncio.gather(
            *(_refund(http, gates[i % 2], op, charge) for i, op in enumerate(ids))
        )
        async with http.get(
            f"{gate_a.ops_url}/v1/budgets", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ) as r:
            budgets = await r.json()

    statuses = Counter(status for _, status, _ in answers)
    assert statuses == {200: LIMIT // AMOUNT, 403: CLAIMS - LIMIT // AMOUNT}, statuses
    sent_by = Counter(url for url, status, _ in answers if status == 200)
    assert set(sent_by) == {gate_a.agent_url, gate_b.agent_url}
    refused = [body for _, status, body in answers if status == 403]
    assert {body["error"]["code"] for body in refused} == {"budget_exceeded"}  # type: ignore[index]
    # in Stripe's error shape too, the remaining budget: nothing
    assert {body["error"]["budget"]["remaining"] for body in refused} == {0}  # type: ignore[index]
    assert len(await list_refunds(localstripe_url, charge=charge)) == LIMIT // AMOUNT
    conn = await asyncpg.connect(database_url)
    try:
        spent = await conn.fetchval(
            "SELECT sum(amount) FROM operations WHERE status IN ('dispatched', 'confirmed')"
        )
    finally:
        await conn.close()
    assert spent == LIMIT
    [standing] = budgets["budgets"]
    assert (standing["tenant"], standing["spent"], standing["remaining"]) == ("t1", LIMIT, 0)
