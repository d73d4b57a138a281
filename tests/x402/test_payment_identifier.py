"""The lost answer of a paid operation recovered through the ``payment-identifier`` extension:
a paid API (the SDK's resource server and exact facilitator over the in-memory token) that
keeps each answer under its payment id, as the extension's spec describes, answers opgate's
re-send of the operation's stored payment (same payload, same id: the operation id) from what
it kept, without settling again; a server that does not declare the extension leaves the
operation settled as paid with its answer lost, as before."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from eth_account import Account
from x402.http.utils import decode_payment_required_header
from x402.schemas import PaymentRequired

from proxy.x402.authorization import operation_nonce, sign_payment, signature_header
from tests.support.opgate import Opgate, StartOpgate, problem
from tests.support.x402_chain_rpc import ChainRpc
from tests.support.x402_gate import WALLET, approve_purchase, buy, paid_policy, reconcile
from tests.support.x402_ledger import Ledger
from tests.support.x402_server import PRICE, PaidApi

OPERATION_ID = "op_0123456789abcdef0123"  # an id the extension allows (16-128 of [A-Za-z0-9_-])


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


async def paid_header(http: aiohttp.ClientSession, api: PaidApi, signer: Any) -> str:
    """A payment for the paid API's own 402, with the operation's id as its payment id."""
    async with http.get(f"{api.base}/report") as response:
        assert response.status == 402
        required = decode_payment_required_header(response.headers["PAYMENT-REQUIRED"])
    assert isinstance(required, PaymentRequired)
    payload = sign_payment(
        signer,
        required.accepts[0],
        required.resource,
        OPERATION_ID,
        int(time.time()),
        required.extensions,
    )
    return signature_header(payload)


async def test_the_paid_api_fixture_answers_a_repeated_payment_id_from_what_it_kept(
    api: PaidApi, ledger: Ledger
) -> None:
    """The fixture follows the extension's spec: it declares it; the same id with the same
    payload is answered from the kept answer (its PAYMENT-RESPONSE included) without a second
    settlement, even though the nonce is used; the same id with another payload is 409."""
    api.payment_ids = True
    async with aiohttp.ClientSession(trust_env=False) as http:
        header = await paid_header(http, api, WALLET)
        answers = []
        for _ in range(2):
            async with http.get(
                f"{api.base}/report", headers={"PAYMENT-SIGNATURE": header}
            ) as response:
                answers.append(
                    (response.status, await response.json(), response.headers["PAYMENT-RESPONSE"])
                )
        other = await paid_header(http, api, Account.from_key("0x" + "6b" * 32))
        async with http.get(f"{api.base}/report", headers={"PAYMENT-SIGNATURE": other}) as again:
            assert again.status == 409
    assert answers[0] == answers[1]
    assert answers[0][:2] == (200, {"report": "ok"})
    assert (len(ledger.settlements), api.served, api.replayed) == (1, 1, 1)


@pytest.mark.parametrize("server", ["keeps_answers", "no_extension", "forgot_its_answers"])
async def test_a_lost_paid_answer_is_recovered_where_the_server_keeps_it_by_payment_id(
    gate: Opgate, api: PaidApi, ledger: Ledger, node: ChainRpc, server: str
) -> None:
    """Paid, its answer lost: the nonce is used, so the operation was paid. Where the server
    declared payment-identifier, reconciliation re-sends the operation's stored payment (the
    same bytes, its id the operation id) and the server answers from what it kept: the
    operation is confirmed with the provider's own answer (``x402_answer_recovered``) and the
    agent gets it. Without the extension nothing is re-sent, and a server that declared it but
    kept nothing refuses the re-sent payment (its nonce is used): confirmed as paid with its
    answer lost, as before. Every way: one settlement, one authorization, nothing signed
    again."""
    api.payment_ids = server != "no_extension"
    op = await approve_purchase(gate, f"{api.base}/report")
    operation_id = op["operation_id"]
    api.lose_answers = 1
    status, _, body = await buy(gate, operation_id)
    assert (status, problem(body)["code"]) == (502, "outcome_unknown")
    if server == "forgot_its_answers":
        api.kept_answers.clear()
    row = await reconcile(gate, operation_id)
    status, headers, body = await buy(gate, operation_id)
    assert headers["X-Operation-Status"] == "confirmed"
    if server == "keeps_answers":
        assert (row["status"], row["settled_reason"]) == ("confirmed", "x402_answer_recovered")
        assert (status, body) == (200, b'{"report": "ok"}')
        assert api.replayed == 1
    else:
        assert (row["status"], row["settled_reason"]) == ("confirmed", "x402_paid_answer_lost")
        assert (status, problem(body)["code"]) == (502, "x402_paid_answer_lost")
        assert api.replayed == 0
    # the stored payment, re-sent as it was where the server declared the extension
    assert len(set(api.payment_headers_seen)) == 1
    assert len(api.payment_headers_seen) == (1 if server == "no_extension" else 2)
    assert ["0x" + s.nonce.hex() for s in ledger.settlements] == [operation_nonce(operation_id)]
    assert api.served == 1
