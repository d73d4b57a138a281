"""Reconciliation of an x402 operation whose outcome is unknown, from its payment's nonce state
(proxy/recovery/x402_state.py), read from the in-memory token behind a JSON-RPC node, with the
SDK's resource server and exact facilitator settling: paid (answer lost), provably unpaid
(released for one new payment), or escalated with the evidence."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from proxy.x402.authorization import operation_nonce
from tests.support.opgate import Opgate, StartOpgate, problem
from tests.support.x402_chain_rpc import ChainRpc
from tests.support.x402_gate import WALLET, approve_purchase, buy, paid_policy, reconcile
from tests.support.x402_ledger import Ledger
from tests.support.x402_server import PAYEE, PRICE, PaidApi


@pytest_asyncio.fixture(loop_scope="session")
async def ledger() -> Ledger:
    chain = Ledger(now=lambda: int(time.time()))
    chain.fund(WALLET.address, 10 * PRICE)
    return chain


@pytest_asyncio.fixture(loop_scope="session")
async def gate(
    start_opgate: StartOpgate,
    policy_dir: Path,
    api: PaidApi,
    node: ChainRpc,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Opgate]:
    monkeypatch.setenv("OPGATE_SECRET_PAID_WALLET", WALLET.key.hex())
    monkeypatch.setenv("OPGATE_SECRET_PAID_RPC", node.url)
    (policy_dir / "paid.yaml").write_text(paid_policy(chain_rpc=True, expiry_margin=0))
    async with start_opgate(upstream_overrides={"paid": api.base}) as running:
        yield running


async def test_a_paid_operation_whose_answer_was_lost_is_settled_paid_from_its_nonce(
    gate: Opgate, api: PaidApi, ledger: Ledger, node: ChainRpc
) -> None:
    """Paid, answer lost: the token shows the operation's nonce used, so reconciliation
    settles it confirmed (x402_paid_answer_lost) and the agent's next request is answered from
    the row, naming it, with nothing sent or signed."""
    op = await approve_purchase(gate, f"{api.base}/report")
    api.lose_answers = 1
    status, _, body = await buy(gate, op["operation_id"])
    assert (status, problem(body)["code"]) == (502, "outcome_unknown")
    row = await reconcile(gate, op["operation_id"])
    assert (row["status"], row["settled_reason"]) == ("confirmed", "x402_paid_answer_lost")
    assert node.calls == 1
    status, headers, body = await buy(gate, op["operation_id"])
    lost = problem(body)
    assert (status, headers["X-Operation-Status"]) == (502, "confirmed")
    assert lost["code"] == "x402_paid_answer_lost"
    assert (lost["nonce"], lost["pay_to"]) == (operation_nonce(op["operation_id"]), PAYEE)
    assert len(ledger.settlements) == 1
    assert len(api.payment_headers_seen) == 1


async def test_an_authorization_expired_unused_is_released_for_one_new_payment(
    gate: Opgate, api: PaidApi, ledger: Ledger
) -> None:
    """The paid request is lost before the server sees it, and its authorization expires
    unused: reconciliation releases it, the operation is paid once with a new authorization
    (the same nonce: a second one could never settle too), and the ledger shows one
    settlement."""
    op = await approve_purchase(gate, f"{api.base}/report")
    api.max_timeout_seconds, api.drop_payments = 1, 1
    status, _, body = await buy(gate, op["operation_id"])
    assert (status, problem(body)["code"]) == (502, "outcome_unknown")
    api.max_timeout_seconds = 300
    row = await reconcile(gate, op["operation_id"])  # still valid: nothing proven yet
    assert (row["status"], row["last_outcome"]) == ("dispatched", "unknown:dropped")
    deadline = time.monotonic() + 30  # the authorization is valid for 1 s
    while row["last_outcome"] != "not_sent":
        assert time.monotonic() < deadline, row
        await asyncio.sleep(0.2)
        row = await reconcile_when_due(gate, op["operation_id"])
    status, headers, _ = await buy(gate, op["operation_id"])
    assert (status, headers["X-Operation-Status"]) == (200, "confirmed")
    first, second = api.payment_headers_seen
    assert first != second
    [settled] = ledger.settlements
    assert "0x" + settled.nonce.hex() == operation_nonce(op["operation_id"])


async def reconcile_when_due(gate: Opgate, operation_id: str) -> dict[str, Any]:
    """One reconciliation try now, its pace ignored (the test's clock is the real one)."""
    conn = await asyncpg.connect(gate.running.gateway.settings.database_url)
    try:
        await conn.execute(
            "UPDATE operations SET next_reconcile_at = now() WHERE operation_id = $1",
            operation_id,
        )
    finally:
        await conn.close()
    return await reconcile(gate, operation_id)


async def test_without_a_chain_node_the_unknown_payment_is_escalated_with_its_evidence(
    start_opgate: StartOpgate,
    policy_dir: Path,
    api: PaidApi,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No node to read the nonce from: a human gets the operation with the payment's digest,
    nonce, payer, payTo and amount; nothing is sent again."""
    monkeypatch.setenv("OPGATE_SECRET_PAID_WALLET", WALLET.key.hex())
    (policy_dir / "paid.yaml").write_text(paid_policy())
    async with start_opgate(upstream_overrides={"paid": api.base}) as gate:
        op = await approve_purchase(gate, f"{api.base}/report")
        api.lose_answers = 1
        await buy(gate, op["operation_id"])
        row = await reconcile(gate, op["operation_id"])
        assert row["escalation"] is not None
        conn = await asyncpg.connect(gate.running.gateway.settings.database_url)
        try:
            raw = await conn.fetchval(
                "SELECT detail FROM operation_events WHERE operation_id = $1 "
                "AND event = 'escalated' ORDER BY event_id DESC LIMIT 1",
                op["operation_id"],
            )
        finally:
            await conn.close()
    assert raw is not None
    detail = json.loads(raw)
    assert set(detail["x402"]) >= {"payment_sha256", "nonce", "payer", "pay_to", "amount"}
    assert detail["x402"]["nonce"] == operation_nonce(op["operation_id"])
    assert len(api.payment_headers_seen) == 1
