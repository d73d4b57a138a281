"""The shipped Stripe preconditions against localstripe: a charge refunded behind opgate's back
after the approval stops the agent's refund before anything is sent (proxy/gate/preconditions.py).

localstripe never refuses an over-refund, so a refund that got past opgate would show there as
a second refund: the ground truth is the charge's refund list.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import requests
import stripe
from structlog.testing import capture_logs

from tests.support.localstripe_server import LOCALSTRIPE_API_KEY, create_charge, list_refunds
from tests.support.opgate import AGENT_TOKEN, SHIPPED_POLICIES, Opgate, StartOpgate
from tests.support.preconditions import age_approval


@pytest_asyncio.fixture(loop_scope="session")
async def stripe_gate(start_opgate: StartOpgate, localstripe_url: str) -> AsyncIterator[Opgate]:
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES, upstream_overrides={"stripe": localstripe_url}
    ) as gate:
        yield gate


def sdk(base: str, api_key: str) -> Iterator[stripe.StripeClient]:
    session = requests.Session()
    session.trust_env = False
    yield stripe.StripeClient(
        api_key,
        base_addresses={"api": base},
        http_client=stripe.RequestsClient(session=session),
    )
    session.close()


@pytest.fixture
def agent_sdk(
    stripe_gate: Opgate, monkeypatch: pytest.MonkeyPatch
) -> Iterator[stripe.StripeClient]:
    """The agent's SDK, through opgate."""
    monkeypatch.setattr(stripe, "enable_telemetry", False)
    yield from sdk(f"{stripe_gate.agent_url}/stripe", AGENT_TOKEN)


@pytest.fixture
def human_sdk(
    localstripe_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[stripe.StripeClient]:
    """A human's SDK, straight at localstripe: behind opgate's back."""
    monkeypatch.setattr(stripe, "enable_telemetry", False)
    yield from sdk(localstripe_url, LOCALSTRIPE_API_KEY)


async def approve_refund(gate: Opgate, charge: str, amount: int) -> dict[str, Any]:
    return await gate.approve(
        provider="stripe",
        action="refund.create",
        amount=amount,
        currency=None,
        params={"charge": charge},
    )


async def test_a_charge_refunded_behind_opgates_back_stops_the_agents_refund(
    stripe_gate: Opgate,
    agent_sdk: stripe.StripeClient,
    human_sdk: stripe.StripeClient,
    localstripe_url: str,
    database_url: str,
) -> None:
    """Approved an hour ago; meanwhile a human refunded the whole charge at Stripe. The agent's
    refund is refused precondition_failed with the charge's values, nothing reaches Stripe,
    the audit and the operation's events carry the evidence, and the recovery read says a new
    approval is needed."""
    charge = await create_charge(localstripe_url, 2000)
    op = await approve_refund(stripe_gate, charge, 500)
    await age_approval(database_url, op["operation_id"], 60)
    await asyncio.to_thread(human_sdk.v1.refunds.create, params={"charge": charge})
    assert len(await list_refunds(localstripe_url, charge=charge)) == 1

    with capture_logs() as logs, pytest.raises(stripe.StripeError) as refused:
        await asyncio.to_thread(
            agent_sdk.v1.refunds.create,
            params={"charge": charge, "amount": 500},
            options={"idempotency_key": op["idempotency_key"]},
        )

    assert refused.value.http_status == 409
    assert refused.value.headers is not None
    assert refused.value.headers["Stripe-Should-Retry"] == "false"
    assert isinstance(refused.value.json_body, dict)
    error = refused.value.json_body["error"]
    assert error["code"] == "precondition_failed"
    [lookup, skipped] = error["precondition"]["lookups"]
    assert lookup["path"] == f"/v1/charges/{charge}"
    held = {a["require"]: a["held"] for a in lookup["assertions"]}
    assert held == {
        '/status == "succeeded"': True,
        "/refunded == false": False,
        "/amount_refunded + approved.amount <= /amount": False,
    }
    assert lookup["assertions"][2]["values"] == {
        "/amount_refunded": 2000,
        "approved.amount": 500,
        "/amount": 2000,
    }
    assert "skipped" in skipped  # no payment_intent was approved
    assert len(await list_refunds(localstripe_url, charge=charge)) == 1  # the human's only

    [audit] = [e for e in logs if e["event"] == "request"]
    assert (audit["decision"], audit["reason"]) == ("deny", "precondition_failed")
    assert audit["precondition"]["trigger"] == "approval_age"
    assert audit["precondition"]["lookups"][0] == lookup

    row = await stripe_gate.operation(op["operation_id"])
    assert (row["status"], row["attempts"], row["next_action"]) == (
        "created",
        0,
        "new_approval_required",
    )
    [event] = [e for e in row["events"] if e["event"] == "precondition_failed"]
    assert event["detail"]["lookups"][0] == lookup

    status, _, body = await stripe_gate.send(
        f"/_opgate/v1/operations/{op['operation_id']}", method="GET", content_type=None
    )
    view = json.loads(body)
    assert status == 200
    assert view["next_action"] == "new_approval_required"
    assert view["precondition"]["lookups"][0] == lookup
    assert "request" not in view  # nothing to send as it is


async def test_a_partial_refund_behind_opgates_back_leaves_room_only_for_what_remains(
    stripe_gate: Opgate,
    agent_sdk: stripe.StripeClient,
    human_sdk: stripe.StripeClient,
    localstripe_url: str,
    database_url: str,
) -> None:
    """A human refunded 1800 of 2000; the agent's approved 500 no longer fits and is refused,
    while an approved 200 still fits and is refunded once."""
    charge = await create_charge(localstripe_url, 2000)
    too_much = await approve_refund(stripe_gate, charge, 500)
    fits = await approve_refund(stripe_gate, charge, 200)
    for op in (too_much, fits):
        await age_approval(database_url, op["operation_id"], 10)
    await asyncio.to_thread(human_sdk.v1.refunds.create, params={"charge": charge, "amount": 1800})

    with pytest.raises(stripe.StripeError) as refused:
        await asyncio.to_thread(
            agent_sdk.v1.refunds.create,
            params={"charge": charge, "amount": 500},
            options={"idempotency_key": too_much["idempotency_key"]},
        )
    refund = await asyncio.to_thread(
        agent_sdk.v1.refunds.create,
        params={"charge": charge, "amount": 200},
        options={"idempotency_key": fits["idempotency_key"]},
    )

    assert isinstance(refused.value.json_body, dict)
    assert refused.value.json_body["error"]["code"] == "precondition_failed"
    refunds = await list_refunds(localstripe_url, charge=charge)
    assert sorted(r["amount"] for r in refunds) == [200, 1800]
    assert refund.metadata["operation_id"] == fits["operation_id"]


async def test_a_fresh_approval_is_sent_without_asking(
    stripe_gate: Opgate, agent_sdk: stripe.StripeClient, localstripe_url: str
) -> None:
    """An approval younger than recheck_after_seconds goes out without a lookup (none audited)."""
    charge = await create_charge(localstripe_url, 2000)
    op = await approve_refund(stripe_gate, charge, 500)
    with capture_logs() as logs:
        await asyncio.to_thread(
            agent_sdk.v1.refunds.create,
            params={"charge": charge, "amount": 500},
            options={"idempotency_key": op["idempotency_key"]},
        )
    [audit] = [e for e in logs if e["event"] == "request"]
    assert (audit["decision"], audit["precondition"]) == ("allow", None)
    assert len(await list_refunds(localstripe_url, charge=charge)) == 1
