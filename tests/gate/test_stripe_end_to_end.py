"""The shipped Stripe policy, the official ``stripe`` SDK as the agent, localstripe as Stripe.

localstripe ignores idempotency keys and never refuses an over-refund, so every duplicate that
got past opgate would show up there as an extra refund: a strict ground truth.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest
import requests
import stripe
from structlog.testing import capture_logs

from tests.support.audit_logs import audits
from tests.support.localstripe_server import LOCALSTRIPE_API_KEY, create_charge, list_refunds
from tests.support.opgate import AGENT_TOKEN, Opgate
from tests.support.sdk_gates import approve_refund, stripe_gate  # noqa: F401


@pytest.fixture
def agent_sdk(
    stripe_gate: Opgate,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[stripe.StripeClient]:
    """The agent's SDK: its api key is its opgate token, its base address is opgate."""
    monkeypatch.setattr(stripe, "enable_telemetry", False)
    session = requests.Session()
    session.trust_env = False
    yield stripe.StripeClient(
        AGENT_TOKEN,
        base_addresses={"api": f"{stripe_gate.agent_url}/stripe"},
        http_client=stripe.RequestsClient(session=session),
    )
    session.close()


async def create_unconfirmed_intent(localstripe_url: str) -> str:
    """A payment intent that can still be cancelled (straight at localstripe, not via opgate)."""
    async with (
        aiohttp.ClientSession(trust_env=False) as session,
        session.post(
            f"{localstripe_url}/v1/payment_intents",
            data={"amount": "1500", "currency": "usd", "payment_method_types[0]": "card"},
            headers={"Authorization": f"Bearer {LOCALSTRIPE_API_KEY}"},
        ) as response,
    ):
        assert response.status == 200, await response.text()
        intent_id: str = (await response.json())["id"]
        return intent_id


async def test_sdk_refund_happens_once_and_carries_the_operation_id(
    stripe_gate: Opgate,  # noqa: F811
    agent_sdk: stripe.StripeClient,
    localstripe_url: str,
) -> None:
    """An unmodified SDK refund with the approved key: one refund at Stripe with
    metadata.operation_id, the row confirmed with its id, and a re-send replayed."""
    charge = await create_charge(localstripe_url, 2000)
    op = await approve_refund(stripe_gate, charge, 500)

    def refund() -> stripe.Refund:
        return agent_sdk.v1.refunds.create(
            params={"charge": charge, "amount": 500},
            options={"idempotency_key": op["idempotency_key"]},
        )

    first = await asyncio.to_thread(refund)
    again = await asyncio.to_thread(refund)
    assert again.id == first.id
    assert again.last_response is not None
    assert again.last_response.headers["Idempotent-Replayed"] == "true"
    [refund_at_stripe] = await list_refunds(localstripe_url, charge=charge)
    assert refund_at_stripe["id"] == first.id
    assert refund_at_stripe["amount"] == 500
    assert refund_at_stripe["metadata"]["operation_id"] == op["operation_id"]
    row = await stripe_gate.operation(op["operation_id"])
    assert (row["status"], row["provider_response"]["object_id"]) == ("confirmed", first.id)


async def test_sdk_refund_named_by_operation_header_without_a_key(
    stripe_gate: Opgate,  # noqa: F811
    agent_sdk: stripe.StripeClient,
    localstripe_url: str,
) -> None:
    """The SDK invents its own Idempotency-Key when given none: naming the operation with
    X-Operation-Id is then refused as a key mismatch (the SDK's InvalidRequestError, told not
    to retry), and the approved key works."""
    charge = await create_charge(localstripe_url, 2000)
    op = await approve_refund(stripe_gate, charge, None)
    with pytest.raises(stripe.InvalidRequestError) as refused:
        await asyncio.to_thread(
            agent_sdk.v1.refunds.create,
            params={"charge": charge},
            options={"headers": {"X-Operation-Id": op["operation_id"]}},
        )
    assert refused.value.http_status == 400
    assert refused.value.code == "idempotency_key_mismatch"
    assert refused.value.user_message is not None
    assert 'options={"idempotency_key": <the approved key>}' in refused.value.user_message
    assert refused.value.headers is not None
    assert refused.value.headers["Stripe-Should-Retry"] == "false"
    assert await list_refunds(localstripe_url, charge=charge) == []
    full = await asyncio.to_thread(
        agent_sdk.v1.refunds.create,
        params={"charge": charge},
        options={
            "idempotency_key": op["idempotency_key"],
            "headers": {"X-Operation-Id": op["operation_id"]},
        },
    )
    assert full.amount == 2000  # a full refund, as approved (no amount)
    assert len(await list_refunds(localstripe_url, charge=charge)) == 1


async def test_sdk_replanned_refund_is_refused_and_stripe_sees_nothing(
    stripe_gate: Opgate,  # noqa: F811
    agent_sdk: stripe.StripeClient,
    localstripe_url: str,
) -> None:
    """A replacement agent that re-plans (another amount, another charge) is refused with the
    SDK's own InvalidRequestError carrying opgate's code and sentence."""
    charge, other = (
        await create_charge(localstripe_url, 2000),
        await create_charge(localstripe_url, 900),
    )
    op = await approve_refund(stripe_gate, charge, 500)
    for params, code in (
        ({"charge": charge, "amount": 700}, "amount_mismatch"),
        ({"charge": other, "amount": 500}, "parameter_mismatch"),
        ({"charge": charge, "amount": 500, "reverse_transfer": "true"}, "parameter_mismatch"),
    ):
        with pytest.raises(stripe.InvalidRequestError) as refused:
            await asyncio.to_thread(
                agent_sdk.v1.refunds.create,
                params=params,
                options={"idempotency_key": op["idempotency_key"]},
            )
        assert refused.value.code == code
        assert refused.value.user_message is not None
        if code == "amount_mismatch":
            assert "amount is '700', approved 500" in refused.value.user_message
    assert await list_refunds(localstripe_url, charge=charge) == []
    assert await list_refunds(localstripe_url, charge=other) == []


async def test_sdk_cancels_an_approved_payment_intent(
    stripe_gate: Opgate,  # noqa: F811
    agent_sdk: stripe.StripeClient,
    localstripe_url: str,
) -> None:
    """A path-bound operation (payment intent cancel) works for its own intent only."""
    intent = await create_unconfirmed_intent(localstripe_url)
    other = await create_unconfirmed_intent(localstripe_url)
    op = await stripe_gate.approve(
        provider="stripe",
        action="payment_intent.cancel",
        path_params={"intent": intent},
        amount=None,
        currency=None,
        params={},
    )
    with pytest.raises(stripe.InvalidRequestError) as refused:
        await asyncio.to_thread(
            agent_sdk.v1.payment_intents.cancel,
            other,
            options={"idempotency_key": op["idempotency_key"]},
        )
    assert refused.value.code == "target_mismatch"
    canceled = await asyncio.to_thread(
        agent_sdk.v1.payment_intents.cancel,
        intent,
        options={"idempotency_key": op["idempotency_key"]},
    )
    assert canceled.status == "canceled"
    assert (await stripe_gate.operation(op["operation_id"]))["status"] == "confirmed"


async def test_sdk_reads_pass_through(
    stripe_gate: Opgate,  # noqa: F811
    agent_sdk: stripe.StripeClient,
    localstripe_url: str,
) -> None:
    """Reads need no operation: the SDK lists a charge's refunds through opgate."""
    charge = await create_charge(localstripe_url, 1000)
    listed = await asyncio.to_thread(agent_sdk.v1.refunds.list, params={"charge": charge})
    assert listed.data == []


async def test_a_permanent_refusal_is_sent_once_by_a_retrying_sdk(
    stripe_gate: Opgate,  # noqa: F811
    agent_sdk: stripe.StripeClient,
    localstripe_url: str,
) -> None:
    """A refund of a charge Stripe does not know fails the operation (404); stripe-python with
    retries on (it retries 409 and 5xx unless Stripe-Should-Retry says otherwise) sends the
    re-send's operation_failed refusal once."""
    op = await approve_refund(stripe_gate, "ch_absent_at_stripe", 500)
    session = requests.Session()
    session.trust_env = False
    retrying = stripe.StripeClient(
        AGENT_TOKEN,
        base_addresses={"api": f"{stripe_gate.agent_url}/stripe"},
        http_client=stripe.RequestsClient(session=session),
        max_network_retries=2,
    )

    def refund() -> stripe.Refund:
        return retrying.v1.refunds.create(
            params={"charge": "ch_absent_at_stripe", "amount": 500},
            options={"idempotency_key": op["idempotency_key"]},
        )

    with pytest.raises(stripe.InvalidRequestError):
        await asyncio.to_thread(refund)  # Stripe's own 404, passed through
    with capture_logs() as logs, pytest.raises(stripe.StripeError) as refused:
        await asyncio.to_thread(refund)
    session.close()
    assert len(audits(logs)) == 1
    assert refused.value.http_status == 409  # an APIError: stripe-python reads the code off 4xx
    assert refused.value.json_body is not None
    assert refused.value.json_body["error"]["code"] == "operation_failed"
    assert refused.value.headers is not None
    assert refused.value.headers["Stripe-Should-Retry"] == "false"
