"""The shipped Adyen policy with the official ``Adyen`` SDK as the agent (unmodified; the
checkout service's baseUrl pointed at opgate, its X-API-Key the agent's opgate token) and a
fake Adyen on loopback: metadata carries the operation id, the real API key is opgate's, and
a refusal is the SDK's own error class for the status with opgate's code as errorCode."""

from __future__ import annotations

import asyncio
from typing import Any

import Adyen
import pytest
from Adyen.exceptions import AdyenAPIUnprocessableEntity, AdyenError
from structlog.testing import capture_logs

from tests.support.audit_logs import audits
from tests.support.fake_adyen import ADYEN_API_KEY, FakeAdyen
from tests.support.opgate import AGENT_TOKEN, Opgate
from tests.support.sdk_gates import PAYMENT, adyen, adyen_gate  # noqa: F401


def sdk(gate: Opgate) -> Adyen.Adyen:
    """The agent's SDK: its API key is its opgate token; the checkout base URL is opgate."""
    client = Adyen.Adyen()
    client.client.xapikey = AGENT_TOKEN
    client.client.platform = "test"
    client.checkout.payments_api.baseUrl = f"{gate.agent_url}/adyen"
    client.checkout.modifications_api.baseUrl = f"{gate.agent_url}/adyen"
    return client


async def approve_payment(gate: Opgate) -> dict[str, Any]:
    return await gate.approve(
        provider="adyen",
        action="payment.create",
        amount=1099,
        currency="EUR",
        params={"/merchantAccount": "AcmeCOM"},
    )


async def test_an_approved_payment_goes_through_once_with_the_operation_id(
    adyen_gate: Opgate,  # noqa: F811
    adyen: FakeAdyen,  # noqa: F811
) -> None:
    """/payments with the approved key: one payment, metadata.operation_id set, the real API
    key sent in place of the agent's token, and a re-send replayed by opgate."""
    op = await approve_payment(adyen_gate)
    client = sdk(adyen_gate)

    def pay() -> Any:
        return client.checkout.payments_api.payments(
            dict(PAYMENT), idempotency_key=op["idempotency_key"]
        )

    first = await asyncio.to_thread(pay)
    assert first.message["metadata"] == {"operation_id": op["operation_id"]}
    [sent] = adyen.posts()
    assert sent.headers["X-API-Key"] == ADYEN_API_KEY
    assert sent.headers["Idempotency-Key"] == op["idempotency_key"]
    again = await asyncio.to_thread(pay)
    assert again.message["pspReference"] == first.message["pspReference"]
    assert len(adyen.effects) == 1
    row = await adyen_gate.operation(op["operation_id"])
    assert row["status"] == "confirmed"
    assert row["provider_response"]["object_id"] == first.message["pspReference"]


async def test_a_replanned_amount_is_the_sdks_error_with_opgates_code(
    adyen_gate: Opgate,  # noqa: F811
    adyen: FakeAdyen,  # noqa: F811
) -> None:
    """Another amount: AdyenAPIUnprocessableEntity (422) whose error_code is amount_mismatch,
    and Adyen sees nothing."""
    op = await approve_payment(adyen_gate)
    replanned = {**PAYMENT, "amount": {"value": 2000, "currency": "EUR"}}
    with pytest.raises(AdyenAPIUnprocessableEntity) as refused:
        await asyncio.to_thread(
            sdk(adyen_gate).checkout.payments_api.payments,
            replanned,
            idempotency_key=op["idempotency_key"],
        )
    assert refused.value.status_code == 422
    assert refused.value.error_code == "amount_mismatch"
    assert "/amount/value is 2000, approved 1099" in str(refused.value.message)
    assert adyen.posts() == []


async def test_a_refund_keeps_the_operation_id_as_its_reference(
    adyen_gate: Opgate,  # noqa: F811
    adyen: FakeAdyen,  # noqa: F811
) -> None:
    """A modification carries no metadata: the operation id goes in its reference."""
    op = await adyen_gate.approve(
        provider="adyen",
        action="payment.refund",
        path_params={"payment": "QFQTPCQ8HXSKGK82"},
        amount=500,
        currency="EUR",
        params={"/merchantAccount": "AcmeCOM"},
    )
    refund = await asyncio.to_thread(
        sdk(adyen_gate).checkout.modifications_api.refund_captured_payment,
        {"merchantAccount": "AcmeCOM", "amount": {"value": 500, "currency": "EUR"}},
        "QFQTPCQ8HXSKGK82",
        idempotency_key=op["idempotency_key"],
    )
    assert refund.message["reference"] == op["operation_id"]
    assert (await adyen_gate.operation(op["operation_id"]))["status"] == "confirmed"


async def test_a_permanent_refusal_is_sent_once(
    adyen_gate: Opgate,  # noqa: F811
    adyen: FakeAdyen,  # noqa: F811
) -> None:
    """A payment Adyen refuses (422: no merchantAccount) fails the operation; the re-send's
    operation_failed refusal is sent once (the SDK retries nothing) and raised with opgate's
    code as errorCode."""
    op = await adyen_gate.approve(
        provider="adyen", action="payment.create", amount=1099, currency="EUR", params={}
    )
    unaccounted = {k: v for k, v in PAYMENT.items() if k != "merchantAccount"}

    def pay() -> Any:
        return sdk(adyen_gate).checkout.payments_api.payments(
            dict(unaccounted), idempotency_key=op["idempotency_key"]
        )

    with pytest.raises(AdyenAPIUnprocessableEntity):
        await asyncio.to_thread(pay)  # Adyen's own 422, passed through
    with capture_logs() as logs, pytest.raises(AdyenError) as refused:
        await asyncio.to_thread(pay)
    assert len(audits(logs)) == 1
    assert refused.value.error_code == "operation_failed"
    assert len(adyen.posts()) == 1
