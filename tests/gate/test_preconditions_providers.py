"""The shipped PayPal and Square preconditions against their fakes: a capture or payment
refunded behind opgate's back after the approval stops the agent's refund, and an untouched
one is refunded once (policies/paypal.yaml, policies/square.yaml)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from tests.support.fake_paypal import FakePayPal, running_fake_paypal
from tests.support.fake_square import SQUARE_TOKEN, FakeSquare, running_fake_square
from tests.support.opgate import SHIPPED_POLICIES, Opgate, StartOpgate, problem


@pytest_asyncio.fixture(loop_scope="session")
async def paypal() -> AsyncIterator[FakePayPal]:
    async with running_fake_paypal() as fake:
        yield fake


@pytest_asyncio.fixture(loop_scope="session")
async def square() -> AsyncIterator[FakeSquare]:
    async with running_fake_square() as fake:
        yield fake


@pytest_asyncio.fixture(loop_scope="session")
async def gate(
    start_opgate: StartOpgate,
    paypal: FakePayPal,
    square: FakeSquare,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Opgate]:
    monkeypatch.setenv("OPGATE_SECRET_PAYPAL_CLIENT_ID", paypal.tokens.client_id)
    monkeypatch.setenv("OPGATE_SECRET_PAYPAL_CLIENT_SECRET", paypal.tokens.client_secret)
    monkeypatch.setenv("OPGATE_SECRET_SQUARE_ACCESS_TOKEN", SQUARE_TOKEN)
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES,
        upstream_overrides={"paypal": paypal.url, "square": square.url},
    ) as running:
        yield running


async def age_approval(database_url: str, operation_id: str) -> None:
    """The approval was given an hour ago (past the rules' recheck_after_seconds)."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE operations SET created_at = now() - interval '1 hour' WHERE operation_id = $1",
            operation_id,
        )
    finally:
        await conn.close()


def paypal_capture(paypal: FakePayPal) -> str:
    """A completed 10.00 USD capture at PayPal (as an earlier order's capture left it)."""
    capture_id = f"CAP{len(paypal.captures)}"
    paypal.captures[capture_id] = {
        "id": capture_id,
        "status": "COMPLETED",
        "amount": {"currency_code": "USD", "value": "10.00"},
        "custom_id": None,
    }
    return capture_id


async def send_paypal_refund(gate: Opgate, capture_id: str, op: dict[str, Any]) -> Any:
    return await gate.send(
        f"/paypal/v2/payments/captures/{capture_id}/refund",
        data=json.dumps({"amount": {"currency_code": "USD", "value": "5.00"}}),
        headers={"X-Operation-Id": op["operation_id"]},
        content_type="application/json",
    )


@pytest.mark.parametrize("refunded_meanwhile", [True, False], ids=["refunded", "untouched"])
async def test_paypal_capture_refund_asks_paypal_first(
    gate: Opgate, paypal: FakePayPal, database_url: str, refunded_meanwhile: bool
) -> None:
    """An old approval to refund 5.00 of a capture: refused precondition_failed when the
    capture was fully refunded from the dashboard since, sent once when it was not."""
    capture_id = paypal_capture(paypal)
    op = await gate.approve(
        provider="paypal",
        action="capture.refund",
        path_params={"capture": capture_id},
        amount=500,
        currency="USD",
        params={},
    )
    await age_approval(database_url, op["operation_id"])
    if refunded_meanwhile:  # a human, in PayPal's dashboard
        paypal._act(f"/v2/payments/captures/{capture_id}/refund", {})
    status, _, body = await send_paypal_refund(gate, capture_id, op)
    refunds = [e for e in paypal.effects if e["kind"] == "refund"]
    if refunded_meanwhile:
        assert status == 409, body
        assert problem(body)["code"] == "precondition_failed"
        [lookup] = problem(body)["precondition"]["lookups"]
        assert lookup["path"] == f"/v2/payments/captures/{capture_id}"
        assert lookup["assertions"][0]["values"] == {"/status": "REFUNDED"}
        assert len(refunds) == 1  # the human's only
    else:
        assert status == 201, body
        assert [r["custom_id"] for r in refunds] == [op["operation_id"]]


@pytest.mark.parametrize("refunded_meanwhile", [True, False], ids=["cancelled", "untouched"])
async def test_square_payment_refund_asks_square_first(
    gate: Opgate, square: FakeSquare, database_url: str, refunded_meanwhile: bool
) -> None:
    """An old approval to refund a payment: refused when the payment is no longer COMPLETED
    (cancelled meanwhile), sent once when it still is."""
    answer = square._create_payment(
        {"source_id": "cnon:card-nonce-ok", "amount_money": {"amount": 1000, "currency": "USD"}}
    )
    payment_id = answer.body["payment"]["id"]
    op = await gate.approve(
        provider="square",
        action="payment.refund",
        amount=400,
        currency="USD",
        params={"/payment_id": payment_id},
    )
    await age_approval(database_url, op["operation_id"])
    if refunded_meanwhile:
        square._cancel(payment_id)
    status, _, body = await gate.send(
        "/square/v2/refunds",
        data=json.dumps(
            {
                "idempotency_key": op["idempotency_key"],
                "payment_id": payment_id,
                "amount_money": {"amount": 400, "currency": "USD"},
            }
        ),
        headers={"X-Operation-Id": op["operation_id"]},
        content_type="application/json",
    )
    refunds = [e for e in square.effects if e["kind"] == "refund"]
    if refunded_meanwhile:
        # 400 in Square's dialect: its SDK re-sends every 409 (opgate's 409 stays in the body)
        assert status == 400, body
        refused = json.loads(body)
        assert (refused["status"], refused["code"]) == (409, "precondition_failed")
        [lookup] = refused["precondition"]["lookups"]
        assert lookup["assertions"][0]["values"] == {"/payment/status": "CANCELED"}
        assert refunds == []
    else:
        assert status == 200, body
        assert [r["payment_id"] for r in refunds] == [payment_id]
