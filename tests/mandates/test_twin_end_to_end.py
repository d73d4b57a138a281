"""The attack of an agent that respells a mandate's signature, end to end: the twin of a
mandate (its ES256 signature (R, n - S), valid and made by anyone holding it) must not become a
second payment. Real opgate, real PostgreSQL, the shipped Stripe policy (with a tenant budget, so
that a refund's currency is the approval's) and localstripe as Stripe: whatever got past opgate
shows up there."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from tests.support.localstripe_server import list_payment_intents
from tests.support.mandate_gate import (
    AUDIENCE,
    PERSON,
    issued_nonce,
    mandate_settings,
    present,
    send_exactly,
)
from tests.support.mandates import (
    Signer,
    closed_mandate,
    closed_payment,
    open_mandate,
    present_under,
    twin,
)
from tests.support.opgate import SHIPPED_POLICIES, Opgate, StartOpgate

AGENT = Signer("agent-key")
CARD = {"id": "pm_card_visa", "type": "card", "description": "visa 4242"}
BUDGET = "budgets:\n  - {scope: tenant, currency: usd, limit: 100000000, window: 24h}\n"
Presentations = Callable[[Opgate], Awaitable[tuple[str, str]]]


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


async def _closed_and_its_twin(_gate: Opgate) -> tuple[str, str]:
    """A person's closed mandate for one payment, and its twin."""
    mandate = closed_mandate(PERSON, amount=1000, payment_instrument=CARD)
    return mandate, twin(mandate)


async def _under_open_and_its_twin(gate: Opgate) -> tuple[str, str]:
    """Two closed mandates of the agent, under a person's open mandate that allows one payment
    (no agent_recurrence) and under its twin."""
    open_token = open_mandate(PERSON, AGENT, [])

    async def under(root: str) -> str:
        nonce = await issued_nonce(gate, gate.http)
        return present_under(
            root,
            AGENT,
            closed_payment(amount=1000, payment_instrument=CARD),
            aud=AUDIENCE,
            nonce=nonce,
        )

    return await under(open_token), await under(twin(open_token))


@pytest.mark.parametrize(
    "presentations",
    [_closed_and_its_twin, _under_open_and_its_twin],
    ids=["closed mandate", "open mandate"],
)
async def test_a_mandates_twin_pays_nothing_more(
    stripe_mandate_gate: Opgate, localstripe_url: str, presentations: Presentations
) -> None:
    """A mandate for one 10.00 USD payment is presented and its payment intent created; then
    its twin (or a closed mandate under the open mandate's twin): whatever opgate answers is
    sent too, and Stripe holds exactly one payment intent of theirs."""
    gate = stripe_mandate_gate
    first, second = await presentations(gate)
    fields = {"provider": "stripe", "action": "payment_intent.create"}
    status, answer = await present(gate, gate.http, first, **fields)
    assert status == 201, answer
    assert await send_exactly(gate, gate.http, answer["operation"]["request"]) == 200
    status, again = await present(gate, gate.http, second, **fields)
    if status == 201:  # a second operation: the agent sends what it got
        await send_exactly(gate, gate.http, again["operation"]["request"])
    ours = {answer["operation"]["operation"]["operation_id"]}
    if status == 201:
        ours.add(again["operation"]["operation"]["operation_id"])
    intents = await list_payment_intents(localstripe_url)
    paid = [i for i in intents if i["metadata"].get("operation_id") in ours]
    assert len(paid) == 1, paid
    assert status in (200, 403), again
