"""The fake PayPal, Square and Adyen reproduce what opgate relies on: where each reads the
key, that a repeated key returns the first answer within the retention window and acts anew
after it, and which refusals leave no effect. Driven straight, with a real HTTP client."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp

from tests.support.fake_adyen import ADYEN_API_KEY, running_fake_adyen
from tests.support.fake_paypal import running_fake_paypal
from tests.support.fake_square import SQUARE_TOKEN, running_fake_square


async def post(
    http: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str]
) -> tuple[int, Any]:
    async with http.post(url, json=body, headers=headers) as answer:
        return answer.status, await answer.json()


async def test_square_reads_the_key_from_the_body_within_its_window() -> None:
    """Same body key: the first payment again; a header key is ignored; after the window the
    key is new; a different body under a kept key is IDEMPOTENCY_KEY_REUSED; a decline charges
    nothing."""
    auth = {"Authorization": f"Bearer {SQUARE_TOKEN}"}
    body = {"idempotency_key": "k1", "source_id": "cnon:ok", "amount_money": {"amount": 5}}
    async with running_fake_square(retention_seconds=60) as square, aiohttp.ClientSession() as http:
        url = square.url + "/v2/payments"
        first = await post(http, url, body, auth)
        again = await post(http, url, body, {**auth, "Idempotency-Key": "other"})
        assert first == again
        assert first[0] == 200
        reused = await post(http, url, {**body, "note": "x"}, auth)
        assert (reused[0], reused[1]["errors"][0]["code"]) == (400, "IDEMPOTENCY_KEY_REUSED")
        square.advance(60)
        later = await post(http, url, body, auth)
        assert later[1]["payment"]["id"] != first[1]["payment"]["id"]
        declined = await post(
            http,
            url,
            {**body, "idempotency_key": "k2", "source_id": "cnon:card-nonce-declined"},
            auth,
        )
        assert declined[0] == 402
        assert len(square.payments_committed()) == 2
        async with http.get(url, headers=auth) as listed:
            payments = (await listed.json())["payments"]
        assert [p["id"] for p in payments] == [later[1]["payment"]["id"], first[1]["payment"]["id"]]


async def test_adyen_reads_the_key_from_the_header_for_31_days() -> None:
    """Idempotency-Key replays the first answer until 31 days have passed; a validation error
    (no merchantAccount) does nothing; a key over 64 characters is refused."""
    auth = {"X-API-Key": ADYEN_API_KEY, "Idempotency-Key": "k1"}
    body = {"merchantAccount": "AcmeCOM", "amount": {"value": 5, "currency": "EUR"}}
    async with running_fake_adyen() as adyen, aiohttp.ClientSession() as http:
        url = adyen.url + "/payments"
        first = await post(http, url, body, auth)
        adyen.advance(31 * 86400 - 1)
        assert await post(http, url, body, auth) == first
        adyen.advance(1)
        assert (await post(http, url, body, auth))[1]["pspReference"] != first[1]["pspReference"]
        invalid = await post(
            http, url, {"amount": body["amount"]}, {**auth, "Idempotency-Key": "k2"}
        )
        assert (invalid[0], invalid[1]["errorType"]) == (422, "validation")
        too_long = await post(http, url, body, {**auth, "Idempotency-Key": "k" * 65})
        assert too_long[0] == 422
        assert len(adyen.effects) == 2


async def test_paypal_needs_its_token_and_keeps_request_ids_for_6_hours() -> None:
    """An API call needs a token from /v1/oauth2/token; PayPal-Request-Id replays for 6 hours;
    a badly spelt amount is a 422 with no order."""
    async with running_fake_paypal() as paypal, aiohttp.ClientSession() as http:
        url = paypal.url + "/v2/checkout/orders"
        order = {
            "intent": "CAPTURE",
            "purchase_units": [{"amount": {"currency_code": "USD", "value": "1.00"}}],
        }
        assert (await post(http, url, order, {"Authorization": "Bearer forged"}))[0] == 401
        basic = base64.b64encode(
            f"{paypal.tokens.client_id}:{paypal.tokens.client_secret}".encode()
        ).decode()
        async with http.post(
            paypal.url + "/v1/oauth2/token",
            data={"grant_type": "client_credentials"},
            headers={"Authorization": f"Basic {basic}"},
        ) as answer:
            token = (await answer.json())["access_token"]
        headers = {"Authorization": f"Bearer {token}", "PayPal-Request-Id": "r1"}
        first = await post(http, url, order, headers)
        assert first[0] == 201
        paypal.advance(6 * 3600 - 1)
        assert await post(http, url, order, headers) == first
        paypal.advance(1)
        assert (await post(http, url, order, headers))[1]["id"] != first[1]["id"]
        bad = {"purchase_units": [{"amount": {"currency_code": "USD", "value": "1.0"}}]}
        assert (await post(http, url, bad, {**headers, "PayPal-Request-Id": "r2"}))[0] == 422
        assert len(paypal.effects) == 2
