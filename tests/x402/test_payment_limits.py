"""The policy set's x402 limits (proxy/policy/payments.py) through opgate, against the SDK's
own resource server and exact facilitator over the in-memory token: a tenant's budget in the
asset's units spans payees, whoever signs; the payment over it is never kept, sent or settled."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from eth_account import Account
from eth_account.signers.local import LocalAccount
from x402 import x402Client
from x402.http.clients.httpx import x402HttpxClient
from x402.mechanisms.evm.exact import register_exact_evm_client

from tests.support.auditlog import flushed, stored_requests
from tests.support.opgate import AGENT_TOKEN, Opgate, StartOpgate, admin_headers, problem
from tests.support.x402_gate import (
    REPORT,
    WALLET,
    approve_purchase,
    paid_policy,
    payments_policy,
)
from tests.support.x402_ledger import Ledger
from tests.support.x402_server import PAYEE, PRICE, PaidApi

AGENT_WALLET: LocalAccount = Account.from_key("0x" + "5b" * 32)
PAYEES = [PAYEE, "0x" + "ab" * 20, "0x" + "cd" * 20]


@pytest_asyncio.fixture(loop_scope="session")
async def ledger() -> Ledger:
    chain = Ledger(now=lambda: int(time.time()))
    chain.fund(WALLET.address, 10 * PRICE)
    chain.fund(AGENT_WALLET.address, 10 * PRICE)
    return chain


async def buy(gate: Opgate, operation_id: str) -> tuple[int, bytes]:
    status, _, body = await gate.send(
        REPORT,
        method="GET",
        headers={"X-Operation-Id": operation_id, "Proxy-Authorization": f"Bearer {AGENT_TOKEN}"},
        token=None,
        content_type=None,
    )
    return status, body


async def buy_paying(gate: Opgate, operation_id: str) -> tuple[int, bytes]:
    """The agent pays: the SDK's own client with the agent's wallet, opgate as its base URL."""
    client = register_exact_evm_client(x402Client(), AGENT_WALLET)
    headers = {"X-Operation-Id": operation_id, "Proxy-Authorization": f"Bearer {AGENT_TOKEN}"}
    async with x402HttpxClient(client, base_url=f"{gate.agent_url}/paid", headers=headers) as agent:
        answer = await agent.get("/report")
    return answer.status_code, answer.content


async def kept_payments(gate: Opgate) -> list[tuple[str, str]]:
    conn = await asyncpg.connect(gate.running.gateway.settings.database_url)
    try:
        rows = await conn.fetch(
            "SELECT operation_id, pay_to FROM x402_payments ORDER BY payment_id"
        )
    finally:
        await conn.close()
    return [(r["operation_id"], r["pay_to"]) for r in rows]


@pytest.mark.parametrize("payer", ["opgate", "agent"])
async def test_a_tenant_budget_spans_payees_and_the_payment_over_it_is_never_sent(
    start_opgate: StartOpgate,
    policy_dir: Path,
    api: PaidApi,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
    payer: str,
) -> None:
    """Two purchases from two payees spend the tenant's budget of two prices; the third, from a
    third payee, is refused 403 x402_budget_exceeded with the limit attached and audited: the
    ledger holds two settlements, the paid API saw two payments, the store kept two."""
    monkeypatch.setenv("OPGATE_SECRET_PAID_WALLET", WALLET.key.hex())
    (policy_dir / "paid.yaml").write_text(paid_policy(payer=payer))
    (policy_dir / "payments.yaml").write_text(payments_policy(limit=2 * PRICE))
    purchase = buy if payer == "opgate" else buy_paying
    async with start_opgate(upstream_overrides={"paid": api.base}) as gate:
        answers, ops = [], []
        for payee in PAYEES:
            api.pay_to = payee
            op = await approve_purchase(gate, f"{api.base}/report", x402_pay_to=payee)
            ops.append(op["operation_id"])
            answers.append(await purchase(gate, op["operation_id"]))
        assert [status for status, _ in answers] == [200, 200, 403]
        refused = problem(answers[2][1])
        assert refused["code"] == "x402_budget_exceeded", refused
        assert refused["limit"]["spent"] == str(2 * PRICE)
        assert refused["limit"]["limit"] == str(2 * PRICE)
        assert [s.pay_to.lower() for s in ledger.settlements] == [p.lower() for p in PAYEES[:2]]
        assert len(api.payment_headers_seen) == 2
        assert [op for op, _ in await kept_payments(gate)] == ops[:2]
        await flushed(gate)
        records = [
            r
            for r in await stored_requests(gate.running.gateway.settings.database_url)
            if r.get("operation_id") == ops[2]
        ]
        assert any(r.get("reason") == "x402_budget_exceeded" for r in records), records
        for query in ("?tenant=t1", ""):  # the one asked for; every tenant that paid
            shown = await x402_standings(gate, query)
            assert [
                (s["kind"], s["tenant"], s["spent"], s["payments"], s["remaining"]) for s in shown
            ] == [
                ("x402_budget", "t1", str(2 * PRICE), 2, "0"),
                ("x402_rate_limit", "t1", str(2 * PRICE), 2, 98),
            ]


async def x402_standings(gate: Opgate, query: str) -> list[dict[str, Any]]:
    """GET /v1/budgets's x402 limits."""
    async with gate.http.get(f"{gate.ops_url}/v1/budgets{query}", headers=admin_headers()) as r:
        assert r.status == 200
        found: list[dict[str, Any]] = (await r.json())["x402"]
        return found


async def test_a_rate_limit_counts_payments_whatever_they_pay(
    start_opgate: StartOpgate,
    policy_dir: Path,
    api: PaidApi,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One payment a day for the tenant: the second purchase is refused before it is paid."""
    monkeypatch.setenv("OPGATE_SECRET_PAID_WALLET", WALLET.key.hex())
    (policy_dir / "paid.yaml").write_text(paid_policy())
    (policy_dir / "payments.yaml").write_text(payments_policy(limit=100 * PRICE, max_payments=1))
    async with start_opgate(upstream_overrides={"paid": api.base}) as gate:
        first = await approve_purchase(gate, f"{api.base}/report")
        assert (await buy(gate, first["operation_id"]))[0] == 200
        second = await approve_purchase(gate, f"{api.base}/report")
        status, body = await buy(gate, second["operation_id"])
        assert status == 403
        assert problem(body)["code"] == "x402_budget_exceeded"
        assert "rate limit" in problem(body)["detail"]
    assert len(ledger.settlements) == 1
