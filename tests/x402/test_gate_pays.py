"""opgate pays an x402 upstream for an operation (proxy/gate/x402_pay.py), against the SDK's
own resource server and exact facilitator over the in-memory token: once per operation."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from proxy.x402.authorization import operation_nonce
from tests.support.opgate import AGENT_TOKEN, Opgate, StartOpgate
from tests.support.x402_gate import REPORT, WALLET, approve_purchase, paid_policy
from tests.support.x402_ledger import Ledger
from tests.support.x402_server import PRICE, PaidApi, paid_api


@pytest_asyncio.fixture(loop_scope="session")
async def ledger() -> Ledger:
    chain = Ledger(now=lambda: int(time.time()))
    chain.fund(WALLET.address, 10 * PRICE)
    return chain


@pytest_asyncio.fixture(loop_scope="session")
async def api(ledger: Ledger) -> AsyncIterator[PaidApi]:
    async with paid_api(ledger) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="session")
async def gate(
    start_opgate: StartOpgate, policy_dir: Path, api: PaidApi, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Opgate]:
    monkeypatch.setenv("OPGATE_SECRET_PAID_WALLET", WALLET.key.hex())
    (policy_dir / "paid.yaml").write_text(paid_policy())
    async with start_opgate(upstream_overrides={"paid": api.base}) as running:
        yield running


async def buy(gate: Opgate, operation_id: str) -> tuple[int, dict[str, str], bytes]:
    return await gate.send(
        REPORT,
        method="GET",
        # a provider without a credential: the agent's token travels as a proxy's
        headers={"X-Operation-Id": operation_id, "Proxy-Authorization": f"Bearer {AGENT_TOKEN}"},
        token=None,
        content_type=None,
    )


async def test_an_approved_purchase_is_paid_once_and_its_settlement_kept(
    gate: Opgate, api: PaidApi, ledger: Ledger
) -> None:
    """A 402 within the approval is paid with the operation's nonce and the answer passes."""
    op = await approve_purchase(gate, f"{api.base}/report")
    status, headers, body = await buy(gate, op["operation_id"])
    assert status == 200, body
    assert headers["X-Operation-Status"] == "confirmed"
    [settled] = ledger.settlements
    assert "0x" + settled.nonce.hex() == operation_nonce(op["operation_id"])
    assert settled.value == PRICE
    assert "PAYMENT-RESPONSE" in headers
    assert api.served == 1
