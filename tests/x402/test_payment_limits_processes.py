"""Two opgate processes (``python -m proxy serve``) on one database pay the SDK's paid API at
once, each purchase to its own payee, under one tenant budget of the policy set's payments
file: the ledger's total never exceeds the budget, whichever process paid."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest_asyncio

from tests.support.killable_opgate import spawn_opgate
from tests.support.opgate import AGENT_TOKEN, admin_headers, process_env
from tests.support.x402_gate import REPORT, WALLET, paid_policy, payments_policy, terms
from tests.support.x402_ledger import Ledger
from tests.support.x402_server import PRICE, PaidApi

PURCHASES = 8
BUDGET = 3 * PRICE


@pytest_asyncio.fixture(loop_scope="session")
async def ledger() -> Ledger:
    chain = Ledger(now=lambda: int(time.time()))
    chain.fund(WALLET.address, 100 * PRICE)
    return chain


async def test_two_processes_paying_different_payees_at_once_stay_within_the_budget(
    database_url: str, tmp_path: Path, api: PaidApi, ledger: Ledger
) -> None:
    """Eight purchases from eight payees, sent at once through two processes, under a tenant
    budget of three prices: three settle, five are refused x402_budget_exceeded before any
    payment left, and the ledger's total is the budget."""
    policy_dir = tmp_path / "policies"
    policy_dir.mkdir()
    (policy_dir / "paid.yaml").write_text(paid_policy())
    (policy_dir / "payments.yaml").write_text(payments_policy(limit=BUDGET))
    env = process_env(
        database_url, policy_dir, {"paid": api.base}, OPGATE_SECRET_PAID_WALLET=WALLET.key.hex()
    )
    payees = {f"agent-{i}": "0x" + f"{i + 1:02x}" * 20 for i in range(PURCHASES)}
    api.pay_to_by_user_agent = payees
    logs = tmp_path / "opgate.log"
    gates = [await spawn_opgate(env, logs)]
    try:
        gates.append(await spawn_opgate(env, logs))
        async with aiohttp.ClientSession(trust_env=False) as http:

            async def approve(payee: str) -> str:
                body = {
                    "tenant": "t1",
                    "provider": "paid",
                    "action": "report.buy",
                    "params": terms(f"{api.base}/report", x402_pay_to=payee),
                    "approval_ref": "ticket-x402-budget",
                    "approved_by": "alice@example.com",
                    "ttl_seconds": 600,
                }
                async with http.post(
                    f"{gates[0].ops_url}/v1/operations", json=body, headers=admin_headers()
                ) as response:
                    created: dict[str, Any] = await response.json(content_type=None)
                    assert response.status == 201, created
                return str(created["operation_id"])

            async def buy(i: int, operation_id: str, user_agent: str) -> tuple[int, str]:
                gate = gates[i % 2]
                headers = {
                    "X-Operation-Id": operation_id,
                    "Proxy-Authorization": f"Bearer {AGENT_TOKEN}",
                    "User-Agent": user_agent,
                }
                async with http.get(f"{gate.agent_url}{REPORT}", headers=headers) as response:
                    answer: dict[str, Any] = await response.json(content_type=None)
                    return response.status, str(answer.get("code", answer.get("detail", "")))

            ops = [await approve(payee) for payee in payees.values()]
            answers = await asyncio.gather(
                *(buy(i, ops[i], f"agent-{i}") for i in range(PURCHASES))
            )
    finally:
        for gate in gates:
            await gate.stop()
    assert sorted(answers) == [(200, "")] * 3 + [(403, "x402_budget_exceeded")] * 5, answers
    assert sum(s.value for s in ledger.settlements) == BUDGET
    assert len({s.pay_to.lower() for s in ledger.settlements}) == 3
    assert len(api.payment_headers_seen) == 3
