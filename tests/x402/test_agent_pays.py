"""The agent pays (rule ``x402.payer: agent``): the official SDK's httpx client, as the agent,
through opgate's base URL, against the SDK's resource server and exact facilitator over the
in-memory token. Its authorization is checked against the approval and bound to the operation
by its nonce; #3438's lost answer plus a retry settles once."""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest_asyncio
from eth_account import Account
from eth_account.signers.local import LocalAccount
from x402 import x402Client
from x402.http.clients.httpx import x402HttpxClient
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.schemas import PaymentRequired

from proxy.x402.authorization import sign_payment, signature_header
from tests.support.opgate import AGENT_TOKEN, Opgate, StartOpgate, problem
from tests.support.x402_gate import REPORT, approve_purchase, paid_policy
from tests.support.x402_ledger import Ledger
from tests.support.x402_minting import challenge
from tests.support.x402_server import PAYEE, PRICE, PaidApi

AGENT_WALLET: LocalAccount = Account.from_key("0x" + "5a" * 32)  # the agent's own key


@pytest_asyncio.fixture(loop_scope="session")
async def ledger() -> Ledger:
    chain = Ledger(now=lambda: int(time.time()))
    chain.fund(AGENT_WALLET.address, 10 * PRICE)
    return chain


@contextlib.asynccontextmanager
async def agent_pays(
    start_opgate: StartOpgate, policy_dir: Path, api: PaidApi, *, deduplicates: bool = False
) -> AsyncIterator[Opgate]:
    (policy_dir / "paid.yaml").write_text(paid_policy(payer="agent", deduplicates=deduplicates))
    async with start_opgate(upstream_overrides={"paid": api.base}) as gate:
        yield gate


def sdk_agent(gate: Opgate, operation_id: str) -> x402HttpxClient:
    """The SDK's paying client, unmodified, with opgate as its base URL (its proxy= setting
    skips payment: x402 issue 41's notes) and the operation id on every request."""
    client = register_exact_evm_client(x402Client(), AGENT_WALLET)
    return x402HttpxClient(
        client,
        base_url=f"{gate.agent_url}/paid",
        headers={"X-Operation-Id": operation_id, "Proxy-Authorization": f"Bearer {AGENT_TOKEN}"},
    )


async def send_paid(gate: Opgate, operation_id: str, header: str) -> tuple[int, dict[str, str]]:
    """A request carrying ``header`` as the agent's PAYMENT-SIGNATURE; its status and problem."""
    status, _, body = await gate.send(
        REPORT,
        method="GET",
        headers={
            "X-Operation-Id": operation_id,
            "Proxy-Authorization": f"Bearer {AGENT_TOKEN}",
            "PAYMENT-SIGNATURE": header,
        },
        token=None,
        content_type=None,
    )
    return status, problem(body) if status >= 400 else {}


def agent_payment(resource: str, *, nonce_of: str = "another", **changes: object) -> str:
    """A payment the agent signed itself (real signature), for ``resource``, its nonce derived
    from ``nonce_of`` (any 32 bytes do: the agent's nonces are its own)."""
    document = challenge()
    document["resource"] = {"url": resource}
    required = PaymentRequired.model_validate(document)
    requirement = required.accepts[0].model_copy(update=changes)
    payload = sign_payment(AGENT_WALLET, requirement, required.resource, nonce_of, int(time.time()))
    return signature_header(payload)


async def test_the_sdk_client_pays_through_opgate_and_its_payment_is_bound(
    start_opgate: StartOpgate, policy_dir: Path, api: PaidApi, ledger: Ledger
) -> None:
    """The 402 reaches the SDK client, which pays with its own authorization; opgate checks it,
    binds it to the operation by its nonce and forwards it: one settlement, by the agent."""
    async with agent_pays(start_opgate, policy_dir, api) as gate:
        op = await approve_purchase(gate, f"{api.base}/report")
        async with sdk_agent(gate, op["operation_id"]) as agent:
            answer = await agent.get("/report")
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Operation-Status"] == "confirmed"
        conn = await asyncpg.connect(gate.running.gateway.settings.database_url)
        try:
            kept = await conn.fetchrow(
                "SELECT nonce, payer, payer_kind, pay_to FROM x402_payments "
                "WHERE operation_id = $1",
                op["operation_id"],
            )
        finally:
            await conn.close()
    [settled] = ledger.settlements
    assert "0x" + settled.nonce.hex() == kept["nonce"]
    assert (kept["payer"], kept["payer_kind"], kept["pay_to"]) == (
        AGENT_WALLET.address,
        "agent",
        PAYEE,
    )


async def test_issue_3438_with_the_sdk_client_through_opgate_settles_once(
    start_opgate: StartOpgate, policy_dir: Path, api: PaidApi, ledger: Ledger
) -> None:
    """The #3438 sequence with the SDK client paying (paid, answer lost, asked again): the bare
    client settles twice (test_sdk_reproduction.py); through opgate, once: the repeated call
    gets reconcile_required, not a 402, so the client signs nothing more."""
    async with agent_pays(start_opgate, policy_dir, api) as gate:
        op = await approve_purchase(gate, f"{api.base}/report")
        api.lose_answers = 1
        async with sdk_agent(gate, op["operation_id"]) as agent:
            lost = await agent.get("/report")
            assert (lost.status_code, lost.json()["code"]) == (502, "outcome_unknown")
            again = await agent.get("/report")
            assert (again.status_code, again.json()["code"]) == (409, "reconcile_required")
    assert len(ledger.settlements) == 1
    assert len(api.payment_headers_seen) == 1


async def test_a_deduplicated_resend_carries_the_bound_payment_and_settles_it_paid(
    start_opgate: StartOpgate, policy_dir: Path, api: PaidApi, ledger: Ledger
) -> None:
    """Where opgate may re-send, the SDK client's repeated call is sent with the payment bound
    to the operation, never the client's next one: the token's used nonce says it was paid, the
    operation settles paid with its answer lost, and the ledger holds one settlement."""
    async with agent_pays(start_opgate, policy_dir, api, deduplicates=True) as gate:
        op = await approve_purchase(gate, f"{api.base}/report")
        api.lose_answers = 1
        async with sdk_agent(gate, op["operation_id"]) as agent:
            lost = await agent.get("/report")
            assert lost.status_code == 502
            again = await agent.get("/report")
            assert (again.status_code, again.json()["code"]) == (502, "x402_paid_answer_lost")
    first, resent = api.payment_headers_seen
    assert first == resent
    assert len(ledger.settlements) == 1


async def test_a_second_different_authorization_is_refused_and_the_same_one_forwarded(
    start_opgate: StartOpgate, policy_dir: Path, api: PaidApi, ledger: Ledger
) -> None:
    """Once an authorization is bound to the operation, another one (another nonce) is
    payment_authorization_mismatch and nothing is sent; the same one is sent again."""
    async with agent_pays(start_opgate, policy_dir, api, deduplicates=True) as gate:
        op = await approve_purchase(gate, f"{api.base}/report")
        resource = f"{api.base}/report"
        first = agent_payment(resource, nonce_of="first")
        api.lose_answers = 1
        status, refused = await send_paid(gate, op["operation_id"], first)
        assert (status, refused["code"]) == (502, "outcome_unknown")
        status, refused = await send_paid(gate, op["operation_id"], agent_payment(resource))
        assert (status, refused["code"]) == (422, "payment_authorization_mismatch"), refused
        assert len(api.payment_headers_seen) == 1
        status, answered = await send_paid(gate, op["operation_id"], first)
        assert (status, answered["code"]) == (502, "x402_paid_answer_lost")
    assert api.payment_headers_seen == [first, first]
    assert len(ledger.settlements) == 1


async def test_an_agent_payment_beyond_the_approval_is_refused_and_nothing_is_sent(
    start_opgate: StartOpgate, policy_dir: Path, api: PaidApi, ledger: Ledger
) -> None:
    """Another payee, a higher amount, a window over an hour, another resource, a signature not
    the payer's, a malformed header: refused with the code that names it, nothing forwarded."""
    async with agent_pays(start_opgate, policy_dir, api) as gate:
        resource = f"{api.base}/report"
        other = "0x000000000000000000000000000000000000bAd1"
        forged = json.loads(base64.b64decode(agent_payment(resource)))
        forged["payload"]["authorization"]["from"] = other  # signed by the agent, not by `from`
        cases = {
            "another payee": (agent_payment(resource, pay_to=other), 403, "x402_not_approved"),
            "over the maximum": (
                agent_payment(resource, amount=str(PRICE + 1)),
                403,
                "x402_not_approved",
            ),
            "a day's window": (
                agent_payment(resource, max_timeout_seconds=86_400),
                403,
                "x402_not_approved",
            ),
            "another resource": (agent_payment(f"{resource}x"), 403, "x402_not_approved"),
            "a forged payer": (
                base64.b64encode(json.dumps(forged).encode()).decode(),
                400,
                "x402_payment_invalid",
            ),
            "not base64": ("%%%", 400, "x402_payment_invalid"),
        }
        for case, (header, status, code) in cases.items():
            op = await approve_purchase(gate, resource)
            got, refused = await send_paid(gate, op["operation_id"], header)
            assert (got, refused.get("code")) == (status, code), case
    assert api.payment_headers_seen == []
    assert ledger.settlements == []
