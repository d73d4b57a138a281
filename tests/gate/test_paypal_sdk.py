"""The shipped PayPal policy with the official ``paypal-server-sdk`` as the agent (unmodified;
its environment's base URI is opgate, its OAuth token the agent's opgate token) and a fake
PayPal on loopback: opgate gets its own OAuth2 token, the amount is a decimal string in the
currency's exponent, custom_id carries the operation id, and refusals are the SDK's
ErrorException with opgate's code as the issue."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from paypalserversdk.configuration import Configuration, Environment, Server
from paypalserversdk.exceptions.error_exception import ErrorException
from paypalserversdk.http.auth.o_auth_2 import ClientCredentialsAuthCredentials
from paypalserversdk.models.money import Money
from paypalserversdk.models.o_auth_token import OAuthToken
from paypalserversdk.models.refund_request import RefundRequest
from paypalserversdk.paypal_serversdk_client import PaypalServersdkClient
from structlog.testing import capture_logs

from tests.support.audit_logs import audits
from tests.support.fake_paypal import FakePayPal
from tests.support.opgate import AGENT_TOKEN, Opgate
from tests.support.sdk_gates import approve_order, order, paypal, paypal_gate  # noqa: F401
from tests.support.store_calls import count_store_calls


def sdk(gate: Opgate, **retries: Any) -> PaypalServersdkClient:
    """The agent's SDK: its OAuth token is its opgate token (opgate holds PayPal's client
    credentials), its environment's base URI is opgate's route; ``retries``: the SDK's
    retry settings (max_retries, retry_methods), off by default as in the SDK."""
    token = OAuthToken(
        access_token=AGENT_TOKEN, token_type="Bearer", expiry=int(time.time()) + 3600
    )
    config = Configuration(
        environment=Environment.SANDBOX,
        client_credentials_auth_credentials=ClientCredentialsAuthCredentials(
            o_auth_client_id="agent", o_auth_client_secret="unused", o_auth_token=token
        ),
        **retries,
    )
    config.environments = {Environment.SANDBOX: {Server.DEFAULT: f"{gate.agent_url}/paypal"}}
    return PaypalServersdkClient(config=config)


async def test_an_approved_order_goes_through_once_with_the_operation_id(
    paypal_gate: Opgate,  # noqa: F811
    paypal: FakePayPal,  # noqa: F811
) -> None:
    """CreateOrder "10.99" USD approved as 1099: one order, custom_id is the operation id, the
    upstream call used opgate's own OAuth2 token, and a re-send is replayed."""
    op = await approve_order(paypal_gate)
    client = sdk(paypal_gate)

    def create() -> Any:
        return client.orders.create_order(
            {"body": order("10.99"), "paypal_request_id": op["idempotency_key"]}
        )

    first = await asyncio.to_thread(create)
    assert first.status_code == 201, first.body
    assert first.body.purchase_units[0].custom_id == op["operation_id"]
    [sent] = paypal.posts()
    assert sent.headers["Authorization"] == f"Bearer {paypal.tokens.issued[0]}"
    assert sent.headers["PayPal-Request-Id"] == op["idempotency_key"]
    assert sent.body["purchase_units"][0]["amount"] == {"currency_code": "USD", "value": "10.99"}
    again = await asyncio.to_thread(create)
    assert again.body.id == first.body.id
    assert len(paypal.effects) == 1
    assert paypal.tokens.requests == 1
    row = await paypal_gate.operation(op["operation_id"])
    assert (row["status"], row["provider_response"]["object_id"]) == ("confirmed", first.body.id)


async def test_an_order_sent_while_the_token_is_cached_calls_no_token_endpoint(
    paypal_gate: Opgate,  # noqa: F811
    paypal: FakePayPal,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first order finds no token: it is fetched once, before the claim; the row is loaded
    (by its key), then claimed. The second, with the token cached, is loaded and claimed the
    same way, with no call to the token endpoint."""
    calls = count_store_calls(paypal_gate, monkeypatch)
    client = sdk(paypal_gate)
    for n, value in enumerate(("10.99", "10.99")):
        op = await approve_order(paypal_gate)
        sent = await asyncio.to_thread(
            client.orders.create_order,
            {"body": order(value), "paypal_request_id": op["idempotency_key"]},
        )
        assert sent.status_code == 201, sent.body
        if n == 0:
            assert calls == Counter({"load_by_key": 1, "claim": 1})
            calls.clear()
    assert calls == Counter({"load_by_key": 1, "claim": 1})
    assert paypal.tokens.requests == 1
    assert [p.headers["Authorization"] for p in paypal.posts()] == [
        f"Bearer {paypal.tokens.issued[0]}"
    ] * 2


@pytest.mark.parametrize("value", ["20.00", "10.990", "10.9"])
async def test_a_replanned_amount_is_the_sdks_error_exception_with_opgates_code(
    paypal_gate: Opgate,  # noqa: F811
    paypal: FakePayPal,  # noqa: F811
    value: str,
) -> None:
    """Another amount, or the approved one spelt otherwise: ErrorException (422
    UNPROCESSABLE_ENTITY) whose detail issue is amount_mismatch; PayPal sees nothing."""
    op = await approve_order(paypal_gate)
    with pytest.raises(ErrorException) as refused:
        await asyncio.to_thread(
            sdk(paypal_gate).orders.create_order,
            {"body": order(value), "paypal_request_id": op["idempotency_key"]},
        )
    assert refused.value.response_code == 422
    assert refused.value.name == "UNPROCESSABLE_ENTITY"
    assert refused.value.details[0].issue == "amount_mismatch"
    assert paypal.posts() == []


async def test_capture_and_refund_through_opgate(
    paypal_gate: Opgate,  # noqa: F811
    paypal: FakePayPal,  # noqa: F811
) -> None:
    """An approved capture, then a partial refund of "5.00" with custom_id set by opgate."""
    op = await approve_order(paypal_gate)
    created = await asyncio.to_thread(
        sdk(paypal_gate).orders.create_order,
        {"body": order("10.99"), "paypal_request_id": op["idempotency_key"]},
    )
    capture_op = await paypal_gate.approve(
        provider="paypal",
        action="order.capture",
        path_params={"order": created.body.id},
        amount=None,
        currency=None,
        params={},
    )
    captured = await asyncio.to_thread(
        sdk(paypal_gate).orders.capture_order,
        {"id": created.body.id, "paypal_request_id": capture_op["idempotency_key"]},
    )
    assert captured.status_code == 201, captured.body
    capture_id = captured.body.purchase_units[0].payments.captures[0].id
    refund_op = await paypal_gate.approve(
        provider="paypal",
        action="capture.refund",
        path_params={"capture": capture_id},
        amount=500,
        currency="USD",
        params={},
    )
    refunded = await asyncio.to_thread(
        sdk(paypal_gate).payments.refund_captured_payment,
        {
            "capture_id": capture_id,
            "paypal_request_id": refund_op["idempotency_key"],
            "body": RefundRequest(amount=Money(currency_code="USD", value="5.00")),
        },
    )
    assert refunded.status_code == 201, refunded.body
    assert refunded.body.custom_id == refund_op["operation_id"]
    assert [e["kind"] for e in paypal.effects] == ["order", "capture", "refund"]


async def test_a_failing_token_endpoint_fails_closed_in_paypals_shape(
    paypal_gate: Opgate,  # noqa: F811
    paypal: FakePayPal,  # noqa: F811
) -> None:
    """When PayPal's token endpoint fails, nothing is sent and nothing is claimed: the SDK
    raises ErrorException with credential_unavailable (503), and the approval still stands."""
    paypal.tokens.fail_with = 500
    op = await approve_order(paypal_gate)
    with pytest.raises(ErrorException) as refused:
        await asyncio.to_thread(
            sdk(paypal_gate).orders.create_order,
            {"body": order("10.99"), "paypal_request_id": op["idempotency_key"]},
        )
    assert refused.value.response_code == 503
    assert refused.value.details[0].issue == "credential_unavailable"
    assert paypal.posts() == []
    assert (await paypal_gate.operation(op["operation_id"]))["status"] == "created"
    paypal.tokens.fail_with = None
    created = await asyncio.to_thread(
        sdk(paypal_gate).orders.create_order,
        {"body": order("10.99"), "paypal_request_id": op["idempotency_key"]},
    )
    assert created.status_code == 201
    answer = created.text if hasattr(created, "text") else str(created.body)
    assert all(token not in answer for token in paypal.tokens.issued)


async def test_a_permanent_refusal_is_sent_once_by_a_retrying_sdk(
    paypal_gate: Opgate,  # noqa: F811
    paypal: FakePayPal,  # noqa: F811
) -> None:
    """A capture of an order PayPal does not know fails the operation (404); with the SDK's
    retries on, POST included (it retries 408, 413, 429 and 5xx), the re-send's
    operation_failed refusal is sent once: ErrorException 409 with opgate's code."""
    op = await paypal_gate.approve(
        provider="paypal",
        action="order.capture",
        path_params={"order": "ABSENT0RDER"},
        amount=None,
        currency=None,
        params={},
    )
    client = sdk(paypal_gate, max_retries=2, retry_methods=["GET", "PUT", "POST"])

    def capture() -> Any:
        return client.orders.capture_order(
            {"id": "ABSENT0RDER", "paypal_request_id": op["idempotency_key"]}
        )

    with pytest.raises(ErrorException) as absent:
        await asyncio.to_thread(capture)
    assert absent.value.response_code == 404  # PayPal's own answer, passed through
    with capture_logs() as logs, pytest.raises(ErrorException) as refused:
        await asyncio.to_thread(capture)
    assert len(audits(logs)) == 1
    assert refused.value.response_code == 409
    assert refused.value.details[0].issue == "operation_failed"
