"""The SDK tests' fixtures (each provider's fake, opgate in front of it) and what they approve."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from paypalserversdk.models.amount_with_breakdown import AmountWithBreakdown
from paypalserversdk.models.checkout_payment_intent import CheckoutPaymentIntent
from paypalserversdk.models.order_request import OrderRequest
from paypalserversdk.models.purchase_unit_request import PurchaseUnitRequest

from tests.support.fake_adyen import ADYEN_API_KEY, FakeAdyen, running_fake_adyen
from tests.support.fake_paypal import FakePayPal, running_fake_paypal
from tests.support.fake_square import SQUARE_TOKEN, FakeSquare, running_fake_square
from tests.support.opgate import SHIPPED_POLICIES, Opgate, StartOpgate


@pytest_asyncio.fixture(loop_scope="session")
async def stripe_gate(start_opgate: StartOpgate, localstripe_url: str) -> AsyncIterator[Opgate]:
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES, upstream_overrides={"stripe": localstripe_url}
    ) as gate:
        yield gate


async def approve_refund(gate: Opgate, charge: str, amount: int | None) -> dict[str, Any]:
    return await gate.approve(
        provider="stripe",
        action="refund.create",
        amount=amount,
        currency=None,
        params={"charge": charge},
    )


@pytest_asyncio.fixture(loop_scope="session")
async def square() -> AsyncIterator[FakeSquare]:
    async with running_fake_square() as fake:
        yield fake


@pytest_asyncio.fixture(loop_scope="session")
async def square_gate(
    start_opgate: StartOpgate, square: FakeSquare, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Opgate]:
    monkeypatch.setenv("OPGATE_SECRET_SQUARE_ACCESS_TOKEN", SQUARE_TOKEN)
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES, upstream_overrides={"square": square.url}
    ) as gate:
        yield gate


@pytest_asyncio.fixture(loop_scope="session")
async def paypal() -> AsyncIterator[FakePayPal]:
    async with running_fake_paypal() as fake:
        yield fake


@pytest_asyncio.fixture(loop_scope="session")
async def paypal_gate(
    start_opgate: StartOpgate, paypal: FakePayPal, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Opgate]:
    monkeypatch.setenv("OPGATE_SECRET_PAYPAL_CLIENT_ID", paypal.tokens.client_id)
    monkeypatch.setenv("OPGATE_SECRET_PAYPAL_CLIENT_SECRET", paypal.tokens.client_secret)
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES, upstream_overrides={"paypal": paypal.url}
    ) as gate:
        yield gate


def order(value: str) -> OrderRequest:
    amount = AmountWithBreakdown(currency_code="USD", value=value)
    return OrderRequest(
        intent=CheckoutPaymentIntent.CAPTURE, purchase_units=[PurchaseUnitRequest(amount=amount)]
    )


async def approve_order(gate: Opgate) -> dict[str, Any]:
    return await gate.approve(
        provider="paypal",
        action="order.create",
        amount=1099,
        currency="USD",
        params={"/intent": "CAPTURE"},
    )


@pytest_asyncio.fixture(loop_scope="session")
async def adyen() -> AsyncIterator[FakeAdyen]:
    async with running_fake_adyen() as fake:
        yield fake


@pytest_asyncio.fixture(loop_scope="session")
async def adyen_gate(
    start_opgate: StartOpgate, adyen: FakeAdyen, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Opgate]:
    monkeypatch.setenv("OPGATE_SECRET_ADYEN_API_KEY", ADYEN_API_KEY)
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES, upstream_overrides={"adyen": adyen.url}
    ) as gate:
        yield gate


PAYMENT = {
    "merchantAccount": "AcmeCOM",
    "reference": "order-7",
    "amount": {"value": 1099, "currency": "EUR"},
    "paymentMethod": {"type": "scheme", "encryptedCardNumber": "test_4111111111111111"},
    "returnUrl": "https://shop.example/return",
}
