"""opgate pays an x402 upstream for an operation (proxy/gate/x402_pay.py), against the SDK's
own resource server and exact facilitator over the in-memory token: once per operation."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from aiohttp import web

from proxy.x402.authorization import operation_nonce
from tests.support.auditlog import flushed, stored_requests
from tests.support.opgate import AGENT_TOKEN, SECOND_AGENT_TOKEN, Opgate, StartOpgate, problem
from tests.support.x402_gate import REPORT, WALLET, approve_purchase, paid_policy
from tests.support.x402_ledger import Ledger
from tests.support.x402_minting import RESOURCE, challenge, encoded, nested, requirement
from tests.support.x402_server import PAYEE, PRICE, PaidApi


@pytest_asyncio.fixture(loop_scope="session")
async def ledger() -> Ledger:
    chain = Ledger(now=lambda: int(time.time()))
    chain.fund(WALLET.address, 10 * PRICE)
    return chain


@pytest_asyncio.fixture(loop_scope="session")
async def gate(
    start_opgate: StartOpgate, policy_dir: Path, api: PaidApi, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Opgate]:
    monkeypatch.setenv("OPGATE_SECRET_PAID_WALLET", WALLET.key.hex())
    (policy_dir / "paid.yaml").write_text(paid_policy())
    async with start_opgate(upstream_overrides={"paid": api.base}) as running:
        yield running


async def buy(
    gate: Opgate, operation_id: str, token: str = AGENT_TOKEN
) -> tuple[int, dict[str, str], bytes]:
    return await gate.send(
        REPORT,
        method="GET",
        # a provider without a credential: the agent's token travels as a proxy's
        headers={"X-Operation-Id": operation_id, "Proxy-Authorization": f"Bearer {token}"},
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
    conn = await asyncpg.connect(gate.running.gateway.settings.database_url)
    try:
        kept = await conn.fetchrow(
            "SELECT nonce, settlement FROM x402_payments WHERE operation_id = $1",
            op["operation_id"],
        )
    finally:
        await conn.close()
    assert kept["nonce"] == operation_nonce(op["operation_id"])
    assert json.loads(kept["settlement"])["transaction"] == settled.tx_hash
    await flushed(gate)
    [record] = [
        r
        for r in await stored_requests(gate.running.gateway.settings.database_url)
        if r.get("operation_id") == op["operation_id"]
    ]
    payment = record["payment"]  # the evidence: paid once, to whom, how much, which transfer
    assert (payment["nonce"], payment["pay_to"], payment["amount"]) == (
        operation_nonce(op["operation_id"]),
        PAYEE,
        str(PRICE),
    )
    assert (payment["paid_by"], payment["settlement_transaction"]) == ("opgate", settled.tx_hash)
    assert len(payment["payment_sha256"]) == 64


async def test_issue_3438_through_opgate_settles_once_whoever_retries(
    gate: Opgate, api: PaidApi, ledger: Ledger
) -> None:
    """The #3438 sequence (paid, answer lost, asked again, by the agent and by a replacement):
    one settlement, and nothing is sent again while the outcome is unknown."""
    op = await approve_purchase(gate, f"{api.base}/report")
    api.lose_answers = 1
    status, _, body = await buy(gate, op["operation_id"])
    assert (status, problem(body)["code"]) == (502, "outcome_unknown")
    for token in (AGENT_TOKEN, SECOND_AGENT_TOKEN):  # the agent, then its replacement
        status, _, body = await buy(gate, op["operation_id"], token=token)
        assert (status, problem(body)["code"]) == (409, "reconcile_required")
    assert len(ledger.settlements) == 1
    assert len(api.payment_headers_seen) == 1


async def test_a_resend_carries_the_stored_payment_and_settles_it_paid_with_its_answer_lost(
    start_opgate: StartOpgate,
    policy_dir: Path,
    api: PaidApi,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where opgate may re-send (a deduplicating provider), the re-send carries the stored
    payment, byte for byte; the token refuses its used nonce, so the operation was paid: it is
    settled confirmed with its answer lost, the agent is told so with the evidence, and a later
    request is answered from the row without sending or signing anything."""
    monkeypatch.setenv("OPGATE_SECRET_PAID_WALLET", WALLET.key.hex())
    (policy_dir / "paid.yaml").write_text(paid_policy(deduplicates=True))
    async with start_opgate(upstream_overrides={"paid": api.base}) as gate:
        op = await approve_purchase(gate, f"{api.base}/report")
        api.lose_answers = 1
        status, _, body = await buy(gate, op["operation_id"])
        assert (status, problem(body)["code"]) == (502, "outcome_unknown")
        status, _, body = await buy(gate, op["operation_id"], token=SECOND_AGENT_TOKEN)
        lost = problem(body)
        assert (status, lost["code"]) == (502, "x402_paid_answer_lost"), lost
        assert lost["nonce_used"] is True
        assert lost["nonce"] == operation_nonce(op["operation_id"])
        assert (lost["pay_to"], lost["amount"]) == (PAYEE, str(PRICE))
        assert lost["payer"] == WALLET.address
        status, headers, body = await buy(gate, op["operation_id"])
        assert (status, headers["X-Operation-Status"]) == (502, "confirmed")
        assert json.loads(body)["code"] == "x402_paid_answer_lost"
    first, again = api.payment_headers_seen
    assert first == again  # the same authorization, never a second one
    assert len(ledger.settlements) == 1
    assert ledger.balance(WALLET.address) == 9 * PRICE


async def test_a_payee_swapped_in_the_second_402_is_not_paid(
    gate: Opgate, api: PaidApi, ledger: Ledger
) -> None:
    """The upstream names another payTo once opgate has signed: its paid request is refused,
    nothing else is signed, nothing is settled."""
    op = await approve_purchase(gate, f"{api.base}/report")
    api.next_pay_to = "0x000000000000000000000000000000000000bAd1"
    status, _, body = await buy(gate, op["operation_id"])
    assert (status, problem(body)["code"]) == (502, "x402_payment_refused")
    assert len(api.payment_headers_seen) == 1
    assert ledger.settlements == []
    api.pay_to = PAYEE


async def test_a_402_beyond_the_approval_is_refused_and_nothing_is_signed(
    gate: Opgate, api: PaidApi, ledger: Ledger
) -> None:
    """An approval for less than the price, or another payee: x402_not_approved naming why."""
    for changes, why in (
        ({"x402_max_amount": str(PRICE - 1)}, "amount over the approved maximum"),
        ({"x402_pay_to": "0x000000000000000000000000000000000000bAd1"}, "payTo"),
        ({"x402_network": "eip155:1"}, "network not approved"),
        ({"x402_resource": f"{api.base}/other"}, "resource"),
    ):
        op = await approve_purchase(gate, f"{api.base}/report", **changes)
        status, _, body = await buy(gate, op["operation_id"])
        refused = problem(body)
        assert (status, refused["code"]) == (403, "x402_not_approved"), refused
        assert why in refused["detail"]
        row = await gate.operation(op["operation_id"])  # nothing left paid: never sent
        assert (row["status"], row["last_outcome"]) == ("dispatched", "not_sent")
    assert api.payment_headers_seen == []
    assert ledger.settlements == []


BAD_402S = {
    "no PAYMENT-REQUIRED": (None, 502, "x402_challenge_invalid"),
    "not base64": ("%%%", 502, "x402_challenge_invalid"),
    "deep JSON": (encoded(challenge(extensions=nested(40))), 502, "x402_challenge_invalid"),
    # aiohttp's client refuses a header field over 8190 bytes before opgate reads it: the
    # answer is unknown to opgate, and nothing is signed (the 16 KiB bound: test_challenge.py)
    "oversized": ("A" * 20_000, 502, "outcome_unknown"),
    "a huge amount": (
        encoded(challenge(requirement(amount="9" * 90))),
        502,
        "x402_challenge_invalid",
    ),
    "an unknown scheme": (
        encoded(challenge(requirement(scheme="stream"))),
        403,
        "x402_not_approved",
    ),
    "an unknown network": (
        encoded(challenge(requirement(network="solana:mainnet"))),
        403,
        "x402_not_approved",
    ),
}


@pytest.mark.parametrize("case", BAD_402S.keys())
async def test_a_bad_402_is_a_problem_answer_and_nothing_is_signed(
    start_opgate: StartOpgate, policy_dir: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """A malformed or unfitting challenge: the problem's code, no 500, nothing stored or sent."""
    header, status, code = BAD_402S[case]
    signatures: list[str] = []

    async def crafted(request: web.Request) -> web.Response:
        if "PAYMENT-SIGNATURE" in request.headers:
            signatures.append(request.headers["PAYMENT-SIGNATURE"])
        headers = {} if header is None else {"PAYMENT-REQUIRED": header}
        return web.json_response({}, status=402, headers=headers)

    app = web.Application()
    app.router.add_get("/report", crafted)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        monkeypatch.setenv("OPGATE_SECRET_PAID_WALLET", WALLET.key.hex())
        (policy_dir / "paid.yaml").write_text(paid_policy())
        async with start_opgate(upstream_overrides={"paid": base}) as gate:
            op = await approve_purchase(gate, RESOURCE)
            got, _, body = await buy(gate, op["operation_id"])
            assert (got, problem(body)["code"]) == (status, code)
            if header is not None and code.startswith("x402"):  # opgate's refusal: not echoed
                assert header[:40] not in body.decode()
            stored = await asyncpg_count(gate)
    finally:
        await runner.cleanup()
    assert signatures == []
    assert stored == 0


async def asyncpg_count(gate: Opgate) -> int:
    """How many payments opgate keeps (signed payments: none may exist after a refusal)."""
    conn = await asyncpg.connect(gate.running.gateway.settings.database_url)
    try:
        count: int = await conn.fetchval("SELECT count(*) FROM x402_payments")
        return count
    finally:
        await conn.close()
