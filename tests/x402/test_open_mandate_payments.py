"""An AP2 open mandate funding x402 payments under its budget, end to end: a person's open
mandate (signed SD-JWT, the agent's closed mandates under it), opgate turning each closed
mandate into an x402 operation (payee as payTo, amount through the payments file's peg), and
the official SDK's paid API, facilitator and in-memory token. The budget spans payees: the
payment that would pass it is never kept, sent or settled."""

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
from tests.support.mandate_gate import (
    AUDIENCE,
    PERSON,
    issued_nonce,
    mandate_policy,
    mandate_settings,
    present,
)
from tests.support.mandates import (
    Signer,
    closed_payment,
    open_mandate,
    present_under,
    twin,
    withhold,
)
from tests.support.opgate import AGENT_TOKEN, Opgate, StartOpgate, problem
from tests.support.x402_gate import REPORT, WALLET, paid_policy
from tests.support.x402_ledger import NETWORK, TOKEN, Ledger
from tests.support.x402_server import PAYEE, PRICE, PaidApi

AGENT = Signer("agent-key")
AGENT_WALLET: LocalAccount = Account.from_key("0x" + "6c" * 32)
OTHER_PAYEE = "0x" + "ab" * 20
# The test token is USD at 6 decimals: PRICE (10000 atomic units) is 1 US cent
CENTS = PRICE // 10_000
PEGGED = f"""\
version: 1
payments:
  x402:
    pegs:
      - {{network: "{NETWORK}", asset: "{TOKEN}", currency: USD, decimals: 6}}
"""


def _payee(address: str) -> dict[str, str]:
    return closed_payment(payee_id=address)["payee"]  # type: ignore[no-any-return]


def _constraints(budget: int) -> list[dict[str, Any]]:
    allowed = [_payee(PAYEE), _payee(OTHER_PAYEE), _payee("acct_merchant")]
    return [
        {"type": "payment.allowed_payees", "allowed": allowed},
        {"type": "payment.budget", "max": budget, "currency": "USD"},
        {"type": "payment.agent_recurrence", "frequency": "ON_DEMAND", "max_occurrences": 5},
    ]


@pytest_asyncio.fixture(loop_scope="session")
async def ledger() -> Ledger:
    chain = Ledger(now=lambda: int(time.time()))
    chain.fund(WALLET.address, 10 * PRICE)
    chain.fund(AGENT_WALLET.address, 10 * PRICE)
    return chain


def _settings(tmp_path: Path) -> dict[str, Any]:
    """PERSON's mandates for tenant t1; both payees' ids (their addresses) paid through the
    paid API's provider."""
    settings = mandate_settings(tmp_path, provider="paid")
    payees = {PAYEE: "paid", OTHER_PAYEE: "paid", "acct_merchant": "fault"}
    settings["mandate_issuers"][0]["payees"] = payees
    return settings


async def _approve(
    gate: Opgate, api: PaidApi, open_token: str, payee: str, amount: int, **params: str
) -> tuple[int, dict[str, Any]]:
    """The agent's closed mandate under ``open_token``, paying ``amount`` cents to ``payee``,
    presented for the paid API's report."""
    presentation = present_under(
        open_token,
        AGENT,
        closed_payment(amount=amount, payee_id=payee),
        aud=AUDIENCE,
        nonce=await issued_nonce(gate, gate.http),
    )
    terms = {"x402_resource": f"{api.base}/report", "x402_asset": TOKEN}
    return await present(
        gate,
        gate.http,
        presentation,
        provider="paid",
        action="report.buy",
        params={**terms, "x402_network": NETWORK, **params},
    )


async def _buy(gate: Opgate, operation_id: str, payer: str) -> tuple[int, bytes]:
    headers = {"X-Operation-Id": operation_id, "Proxy-Authorization": f"Bearer {AGENT_TOKEN}"}
    if payer == "agent":  # the SDK's own client with the agent's wallet, opgate as base URL
        client = register_exact_evm_client(x402Client(), AGENT_WALLET)
        async with x402HttpxClient(
            client, base_url=f"{gate.agent_url}/paid", headers=headers
        ) as agent:
            answer = await agent.get("/report")
        return answer.status_code, answer.content
    status, _, body = await gate.send(
        REPORT, method="GET", headers=headers, token=None, content_type=None
    )
    return status, body


async def _params(gate: Opgate, operation_id: str) -> dict[str, Any]:
    """The operation's approved params, as stored."""
    loaded = await gate.running.gateway.store.load(operation_id)
    assert loaded is not None
    return dict(loaded.params)


async def _kept(database_url: str) -> list[tuple[str, str]]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT operation_id, pay_to FROM x402_payments ORDER BY payment_id"
        )
    finally:
        await conn.close()
    return [(r["operation_id"], r["pay_to"]) for r in rows]


@pytest.mark.parametrize("payer", ["opgate", "agent"])
async def test_an_open_mandates_budget_spans_payees_and_the_payment_over_it_is_never_settled(
    start_opgate: StartOpgate,
    policy_dir: Path,
    tmp_path: Path,
    api: PaidApi,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
    payer: str,
) -> None:
    """An open mandate with a budget of 1 cent and two allowed payees: a closed mandate of 1
    cent to each becomes an x402 operation (payTo the payee, maximum the cent in the token's
    units); the first pays, the second, to the other payee, is refused 403
    x402_mandate_budget_exceeded and audited: one settlement in the ledger, one payment kept."""
    monkeypatch.setenv("OPGATE_SECRET_PAID_WALLET", WALLET.key.hex())
    (policy_dir / "paid.yaml").write_text(paid_policy(payer=payer))
    (policy_dir / "payments.yaml").write_text(PEGGED)
    open_token = open_mandate(PERSON, AGENT, _constraints(budget=CENTS))
    async with start_opgate(upstream_overrides={"paid": api.base}, **_settings(tmp_path)) as gate:
        ops, answers = [], []
        # the second under the open mandate's twin text: one mandate, one budget
        for payee, token in ((PAYEE, open_token), (OTHER_PAYEE, twin(open_token))):
            status, created = await _approve(gate, api, token, payee, CENTS)
            assert status == 201, created
            operation_id = created["operation"]["operation"]["operation_id"]
            params = await _params(gate, operation_id)
            assert (params["x402_pay_to"], params["x402_max_amount"]) == (payee, str(PRICE))
            ops.append(operation_id)
            api.pay_to = payee
            answers.append(await _buy(gate, operation_id, payer))
        assert [status for status, _ in answers] == [200, 403], answers
        refused = problem(answers[1][1])
        assert refused["code"] == "x402_mandate_budget_exceeded", refused
        assert refused["mandate"]["budget_max"] == str(CENTS)
        assert refused["mandate"]["paid"] == str(CENTS)
        assert [s.pay_to.lower() for s in ledger.settlements] == [PAYEE.lower()]
        assert len(api.payment_headers_seen) == 1
        database_url = gate.running.gateway.settings.database_url
        assert [op for op, _ in await _kept(database_url)] == ops[:1]
        await flushed(gate)
        records = [
            r for r in await stored_requests(database_url) if r.get("operation_id") == ops[1]
        ]
        assert any(r.get("reason") == "x402_mandate_budget_exceeded" for r in records), records


async def test_an_x402_mandate_names_its_payee_and_amount_and_an_unpegged_asset_approves_nothing(
    start_opgate: StartOpgate, policy_dir: Path, tmp_path: Path, api: PaidApi
) -> None:
    """The agent cannot choose another payTo or maximum than the mandate's (mandate_mismatch),
    and an amount in an asset the payments file pegs to no currency is not sendable."""
    (policy_dir / "paid.yaml").write_text(paid_policy(payer="agent"))
    (policy_dir / "payments.yaml").write_text(PEGGED)
    open_token = open_mandate(PERSON, AGENT, _constraints(budget=100))
    async with start_opgate(upstream_overrides={"paid": api.base}, **_settings(tmp_path)) as gate:
        status, answer = await _approve(gate, api, open_token, PAYEE, 1, x402_pay_to=OTHER_PAYEE)
        assert (status, answer["code"], answer.get("field")) == (
            403,
            "mandate_mismatch",
            "payee",
        ), answer
        status, answer = await _approve(
            gate, api, open_token, PAYEE, 1, x402_max_amount=str(PRICE + 1)
        )
        assert (answer["code"], answer.get("field")) == ("mandate_mismatch", "payment_amount")
        status, answer = await _approve(
            gate, api, open_token, PAYEE, 1, x402_asset="0x" + "99" * 20
        )
        assert answer["code"] == "approval_not_sendable", answer
        conn = await asyncpg.connect(gate.running.gateway.settings.database_url)
        try:
            assert await conn.fetchval("SELECT count(*) FROM operations") == 0
        finally:
            await conn.close()


def _duplicated() -> str:
    """The open mandate with its constraints disclosure given twice."""
    jwt, constraints, _ = open_mandate(PERSON, AGENT, _constraints(1)).split("~")
    return f"{jwt}~{constraints}~{constraints}~"


@pytest.mark.parametrize(
    ("scenario", "open_token", "withheld"),
    [
        (
            "constraints withheld",
            lambda: withhold(open_mandate(PERSON, AGENT, _constraints(1)), 0),
            True,
        ),
        (
            "the payee constraint's element withheld",
            lambda: withhold(open_mandate(PERSON, AGENT, _constraints(1), elements=True), 1),
            True,
        ),
        (
            "the budget's element withheld",
            lambda: withhold(open_mandate(PERSON, AGENT, _constraints(1), elements=True), 2),
            True,
        ),
        ("a disclosure given twice", _duplicated, False),
    ],
)
async def test_an_open_mandate_shown_without_its_limits_funds_no_payment(
    start_opgate: StartOpgate,
    policy_dir: Path,
    tmp_path: Path,
    api: PaidApi,
    scenario: str,
    open_token: Any,
    withheld: bool,
) -> None:
    """The open mandate presented without its payee constraint, or without its budget, or
    without its constraints at all, or with a disclosure duplicated: mandate_invalid (naming
    the withheld claim), no operation; and the open mandate trimmed of the agent's closed
    mandate approves nothing either."""
    (policy_dir / "paid.yaml").write_text(paid_policy(payer="agent"))
    (policy_dir / "payments.yaml").write_text(PEGGED)
    async with start_opgate(upstream_overrides={"paid": api.base}, **_settings(tmp_path)) as gate:
        status, answer = await _approve(gate, api, open_token(), OTHER_PAYEE, 1)
        assert (status, answer["code"]) == (403, "mandate_invalid"), (scenario, answer)
        if withheld:
            assert answer["claim"].startswith("constraints"), answer
        alone = open_mandate(PERSON, AGENT, _constraints(1))
        status, answer = await present(
            gate, gate.http, alone, provider="paid", action="report.buy", params={}
        )
        assert (status, answer["code"]) == (403, "mandate_invalid"), answer
        conn = await asyncpg.connect(gate.running.gateway.settings.database_url)
        try:
            assert await conn.fetchval("SELECT count(*) FROM operations") == 0
        finally:
            await conn.close()


async def test_card_payments_and_x402_payments_under_one_open_mandate_share_its_budget(
    start_opgate: StartOpgate,
    policy_dir: Path,
    tmp_path: Path,
    api: PaidApi,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A budget of 2 cents: an x402 payment of 1 cent is kept, so a card payment of 2 cents
    under the same open mandate is refused at its creation (mandate_exhausted) and one of 1
    cent is made; the next x402 payment of 1 cent is then refused where it would be kept
    (x402_mandate_budget_exceeded), unpaid."""
    monkeypatch.setenv("OPGATE_SECRET_PAID_WALLET", WALLET.key.hex())
    (policy_dir / "paid.yaml").write_text(paid_policy())
    (policy_dir / "fault.yaml").write_text(mandate_policy())
    (policy_dir / "payments.yaml").write_text(PEGGED)
    open_token = open_mandate(PERSON, AGENT, _constraints(budget=2 * CENTS))
    async with start_opgate(upstream_overrides={"paid": api.base}, **_settings(tmp_path)) as gate:
        status, first = await _approve(gate, api, open_token, PAYEE, CENTS)
        assert status == 201, first
        paid = await _buy(gate, first["operation"]["operation"]["operation_id"], "opgate")
        assert paid[0] == 200, paid

        async def card(amount: int) -> tuple[int, dict[str, Any]]:
            presentation = present_under(
                open_token,
                AGENT,
                closed_payment(amount=amount, payee_id="acct_merchant"),
                aud=AUDIENCE,
                nonce=await issued_nonce(gate, gate.http),
            )
            return await present(gate, gate.http, presentation, params={"source": "pm_card"})

        status, refused = await card(2 * CENTS)
        assert (status, refused["code"]) == (403, "mandate_exhausted"), refused
        status, made = await card(CENTS)
        assert status == 201, made
        status, second = await _approve(gate, api, open_token, OTHER_PAYEE, CENTS)
        assert status == 201, second
        api.pay_to = OTHER_PAYEE
        status, body = await _buy(gate, second["operation"]["operation"]["operation_id"], "opgate")
        assert (status, problem(body)["code"]) == (403, "x402_mandate_budget_exceeded"), body
        assert problem(body)["mandate"]["paid"] == str(2 * CENTS)
    assert [s.pay_to.lower() for s in ledger.settlements] == [PAYEE.lower()]
