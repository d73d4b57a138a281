"""The shipped Square policy with the official ``squareup`` SDK as the agent (unmodified, its
base_url pointed at opgate) and a fake Square on loopback: the key travels in the body, the
operation id lands in reference_id, and refusals are the SDK's own ApiError with opgate's code."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from square import Square
from square.core.api_error import ApiError
from structlog.testing import capture_logs

from tests.support.audit_logs import audits
from tests.support.fake_square import SQUARE_TOKEN, FakeSquare
from tests.support.opgate import AGENT_TOKEN, Opgate
from tests.support.sdk_gates import square, square_gate  # noqa: F401


@pytest.fixture
def sdk(square_gate: Opgate) -> Iterator[Square]:  # noqa: F811
    """The agent's SDK: its token is its opgate token, its base_url is opgate's route."""
    with httpx.Client(trust_env=False, timeout=30) as http:
        yield Square(
            token=AGENT_TOKEN, base_url=f"{square_gate.agent_url}/square", httpx_client=http
        )


async def approve_payment(gate: Opgate, amount: int = 1099) -> dict[str, Any]:
    return await gate.approve(
        provider="square",
        action="payment.create",
        amount=amount,
        currency="USD",
        params={"/source_id": "cnon:card-nonce-ok"},
    )


async def test_an_approved_payment_goes_through_once_with_the_operation_id(
    square_gate: Opgate,  # noqa: F811
    sdk: Square,
    square: FakeSquare,  # noqa: F811
) -> None:
    """CreatePayment with the approved key in the body: one payment at Square, reference_id is
    the operation id, no Idempotency-Key header was added, and a re-send is replayed."""
    op = await approve_payment(square_gate)

    def pay() -> Any:
        return sdk.payments.create(
            source_id="cnon:card-nonce-ok",
            idempotency_key=op["idempotency_key"],
            amount_money={"amount": 1099, "currency": "USD"},
            note="order 7",
        )

    first = await asyncio.to_thread(pay)
    assert first.payment is not None
    assert first.payment.reference_id == op["operation_id"]
    [sent] = square.posts()
    assert sent.body["idempotency_key"] == op["idempotency_key"]
    assert "Idempotency-Key" not in sent.headers
    assert sent.headers["Authorization"] == f"Bearer {SQUARE_TOKEN}"
    again = await asyncio.to_thread(pay)
    assert again.payment is not None
    assert again.payment.id == first.payment.id
    assert len(square.payments_committed()) == 1
    row = await square_gate.operation(op["operation_id"])
    assert (row["status"], row["provider_response"]["object_id"]) == ("confirmed", first.payment.id)


async def test_a_replanned_amount_is_the_sdks_api_error_with_opgates_code(
    square_gate: Opgate,  # noqa: F811
    sdk: Square,
    square: FakeSquare,  # noqa: F811
) -> None:
    """Another amount is refused before Square sees anything: ApiError, status 422, and
    errors[0].code == amount_mismatch with opgate's sentence."""
    op = await approve_payment(square_gate)
    with pytest.raises(ApiError) as refused:
        await asyncio.to_thread(
            sdk.payments.create,
            source_id="cnon:card-nonce-ok",
            idempotency_key=op["idempotency_key"],
            amount_money={"amount": 2000, "currency": "USD"},
        )
    assert refused.value.status_code == 422
    [error] = refused.value.errors
    assert error.code == "amount_mismatch"
    assert error.detail == "/amount_money/amount is 2000, approved 1099"
    assert square.posts() == []


async def test_a_payment_is_cancelled_by_operation_id(
    square_gate: Opgate,  # noqa: F811
    sdk: Square,
    square: FakeSquare,  # noqa: F811
) -> None:
    """CancelPayment takes no key: the SDK names the operation with X-Operation-Id."""
    op = await approve_payment(square_gate)
    paid = await asyncio.to_thread(
        sdk.payments.create,
        source_id="cnon:card-nonce-ok",
        idempotency_key=op["idempotency_key"],
        amount_money={"amount": 1099, "currency": "USD"},
    )
    assert paid.payment is not None
    assert paid.payment.id is not None
    cancel = await square_gate.approve(
        provider="square",
        action="payment.cancel",
        path_params={"payment": paid.payment.id},
        amount=None,
        currency=None,
        params={},
    )
    cancelled = await asyncio.to_thread(
        sdk.payments.cancel,
        payment_id=paid.payment.id,
        request_options={"additional_headers": {"X-Operation-Id": cancel["operation_id"]}},
    )
    assert cancelled.payment is not None
    assert cancelled.payment.status == "CANCELED"
    assert (await square_gate.operation(cancel["operation_id"]))["status"] == "confirmed"


async def test_a_permanent_refusal_is_sent_once_and_keeps_opgates_status_in_the_body(
    square_gate: Opgate,  # noqa: F811
    sdk: Square,
    square: FakeSquare,  # noqa: F811
) -> None:
    """A declined card fails the operation; the SDK's re-send is refused operation_failed,
    and Square's SDK (which retries 408, 409, 429 and 5xx) sends that refusal once: a 400
    ApiError whose body keeps opgate's 409 and code."""
    op = await square_gate.approve(
        provider="square",
        action="payment.create",
        amount=1099,
        currency="USD",
        params={"/source_id": "cnon:card-nonce-declined"},
    )

    def pay() -> Any:
        return sdk.payments.create(
            source_id="cnon:card-nonce-declined",
            idempotency_key=op["idempotency_key"],
            amount_money={"amount": 1099, "currency": "USD"},
        )

    with pytest.raises(ApiError) as declined:
        await asyncio.to_thread(pay)
    assert declined.value.status_code == 402  # Square's own answer, passed through
    with capture_logs() as logs, pytest.raises(ApiError) as refused:
        await asyncio.to_thread(pay)
    assert len(audits(logs)) == 1
    assert refused.value.status_code == 400
    [error] = refused.value.errors
    assert error.code == "operation_failed"
    assert isinstance(refused.value.body, dict)
    assert (refused.value.body["status"], refused.value.body["code"]) == (409, "operation_failed")
    assert len(square.posts()) == 1
