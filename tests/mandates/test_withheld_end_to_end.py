"""The attack of an agent that chooses what to show, end to end: a person's open mandate capped
at 10.00 USD, presented without its limits, must not become a 9,999.99 USD refund. Real opgate,
real PostgreSQL, the shipped Stripe policy (with a tenant budget, so that a refund's currency is
the approval's) and localstripe as Stripe: whatever got past opgate shows up there."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.mandate_gate import (
    AUDIENCE,
    PERSON,
    issued_nonce,
    mandate_settings,
    present,
    send_exactly,
)
from tests.support.mandates import Signer, closed_payment, open_mandate, present_under, withhold
from tests.support.opgate import SHIPPED_POLICIES, Opgate, StartOpgate

AGENT = Signer("agent-key")
CAP = {"type": "payment.amount_range", "currency": "USD", "min": 0, "max": 1000}
RECURRENCE = {"type": "payment.agent_recurrence", "frequency": "ON_DEMAND", "max_occurrences": 3}
BUDGET = "budgets:\n  - {scope: tenant, currency: usd, limit: 100000000, window: 24h}\n"


@pytest_asyncio.fixture(loop_scope="session")
async def stripe_mandate_gate(
    start_opgate: StartOpgate, policy_dir: Path, localstripe_url: str, tmp_path: Path
) -> AsyncIterator[Opgate]:
    """opgate with the shipped Stripe policy and a tenant budget, accepting PERSON's mandates
    for payees paid through Stripe."""
    text = (SHIPPED_POLICIES / "stripe.yaml").read_text("utf-8")
    (policy_dir / "stripe.yaml").write_text(text.replace("\nrules:\n", f"\n{BUDGET}rules:\n", 1))
    async with start_opgate(
        upstream_overrides={"stripe": localstripe_url},
        **mandate_settings(tmp_path, provider="stripe"),
    ) as gate:
        yield gate


def _without_constraints() -> str:
    """The open mandate with its ``constraints`` disclosure withheld."""
    return withhold(open_mandate(PERSON, AGENT, [CAP]), 0)


def _without_one_element() -> str:
    """The open mandate with each constraint an array element, the cap's element withheld."""
    return withhold(open_mandate(PERSON, AGENT, [CAP, RECURRENCE], elements=True), 1)


@pytest.mark.parametrize(
    ("scenario", "open_token"),
    [
        ("constraints withheld", _without_constraints),
        ("one constraints element withheld", _without_one_element),
    ],
)
async def test_a_withheld_limit_creates_nothing_and_sends_nothing(
    stripe_mandate_gate: Opgate,
    localstripe_url: str,
    database_url: str,
    scenario: str,
    open_token: object,
) -> None:
    """An open mandate capped at 10.00 USD, its cap withheld, presented for a 9,999.99 USD
    refund: refused mandate_invalid naming the withheld claim; no operation row, and (the
    agent sending the refund anyway) no refund at Stripe."""
    gate = stripe_mandate_gate
    charge = await create_charge(localstripe_url, 1_000_000)
    assert callable(open_token)
    presentation = present_under(
        open_token(),
        AGENT,
        closed_payment(amount=999_999),
        aud=AUDIENCE,
        nonce=await issued_nonce(gate, gate.http),
    )
    status, answer = await present(
        gate,
        gate.http,
        presentation,
        provider="stripe",
        action="refund.create",
        params={"charge": charge},
    )
    if "operation" in answer:  # the old verifier approved it: the agent sends what it got
        await send_exactly(gate, gate.http, answer["operation"]["request"])
    assert await list_refunds(localstripe_url, charge=charge) == [], scenario
    assert (status, answer["code"]) == (403, "mandate_invalid"), answer
    assert answer["claim"].startswith("constraints"), answer
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM operations") == 0
    finally:
        await conn.close()
