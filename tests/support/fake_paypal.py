"""A fake PayPal (Orders v2, Payments v2): what opgate relies on, as PayPal documents it
(https://developer.paypal.com/docs/api/orders/v2/,
https://developer.paypal.com/api/rest/reference/idempotency/):

- OAuth 2.0 client credentials at /v1/oauth2/token; every API call needs a token it issued;
- ``PayPal-Request-Id`` returns a request's first answer for 6 hours (Orders v2), not after;
- amounts are decimal strings in the currency's exponent; anything else is a 422
  UNPROCESSABLE_ENTITY that does nothing; an unknown order or capture is a 404;
- orders keep each purchase unit's ``custom_id``; refunds keep theirs;
- a capture can be read (GET /v2/payments/captures/{id}); a refund makes it ``REFUNDED`` or
  ``PARTIALLY_REFUNDED`` (a refund of the full amount, or of less).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.fake_provider_base import Answer, FakeProvider, KeyMemory, json_answer, serving
from tests.support.token_endpoint import TokenEndpoint, add_token_route

_DECIMALS = {"JPY": 0, "HUF": 0, "TWD": 0}  # PayPal's no-decimal currencies; others two


def _error(status: int, name: str, issue: str) -> Answer:
    return Answer(status, {"name": name, "message": issue, "details": [{"issue": issue}]})


def _valid_amount(amount: Any) -> bool:
    if not isinstance(amount, dict) or not isinstance(amount.get("value"), str):
        return False
    places = _DECIMALS.get(str(amount.get("currency_code")), 2)
    pattern = r"(0|[1-9][0-9]*)" + (rf"\.[0-9]{{{places}}}" if places else "")
    return re.fullmatch(pattern, amount["value"]) is not None


@dataclass
class FakePayPal(FakeProvider):
    retention_seconds: float = 6 * 3600.0
    tokens: TokenEndpoint = field(default_factory=TokenEndpoint)

    def __post_init__(self) -> None:
        self.keys = KeyMemory(self.retention_seconds, self.now)
        self.orders: dict[str, dict[str, Any]] = {}
        self.captures: dict[str, dict[str, Any]] = {}

    async def handle(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in self.tokens.issued:
            return json_answer(_error(401, "AUTHENTICATION_FAILURE", "INVALID_TOKEN"))
        if request.method == "GET" and request.path.startswith("/v2/checkout/orders/"):
            order = self.orders.get(request.path.rsplit("/", 1)[1])
            if order is None:
                return json_answer(_error(404, "RESOURCE_NOT_FOUND", "INVALID_RESOURCE_ID"))
            return web.json_response(order)
        if request.method == "GET" and request.path.startswith("/v2/payments/captures/"):
            capture = self.captures.get(request.path.rsplit("/", 1)[1])
            if capture is None:
                return json_answer(_error(404, "RESOURCE_NOT_FOUND", "INVALID_RESOURCE_ID"))
            return web.json_response(capture)
        if request.method != "POST":
            return json_answer(_error(404, "RESOURCE_NOT_FOUND", "NOT_FOUND"))
        key = request.headers.get("PayPal-Request-Id")
        kept = self.keys.recall(key) if key else None
        if kept is not None:
            return json_answer(kept.answer)
        answer = self._act(request.path, body if isinstance(body, dict) else {})
        if key:
            self.keys.remember(key, request.path + json.dumps(body, sort_keys=True), answer)
        return json_answer(answer)

    def _act(self, path: str, body: dict[str, Any]) -> Answer:
        parts = path.split("/")
        if path == "/v2/checkout/orders":
            units = body.get("purchase_units")
            if not isinstance(units, list) or not units:
                return _error(400, "INVALID_REQUEST", "MISSING_REQUIRED_PARAMETER")
            if not all(_valid_amount(u.get("amount")) for u in units):
                return _error(422, "UNPROCESSABLE_ENTITY", "DECIMAL_PRECISION")
            order = {
                "id": secrets.token_hex(8).upper(),
                "status": "CREATED",
                "intent": body.get("intent"),
                "purchase_units": units,
            }
            self.orders[order["id"]] = order
            self.effects.append({"kind": "order", **order})
            return Answer(201, order)
        if len(parts) == 6 and parts[5] == "capture":
            order = self.orders.get(parts[4])
            if order is None:
                return _error(404, "RESOURCE_NOT_FOUND", "INVALID_RESOURCE_ID")
            if order["status"] == "COMPLETED":
                return _error(422, "UNPROCESSABLE_ENTITY", "ORDER_ALREADY_CAPTURED")
            unit = order["purchase_units"][0]
            capture = {
                "id": secrets.token_hex(8).upper(),
                "status": "COMPLETED",
                "amount": unit["amount"],
                "custom_id": unit.get("custom_id"),
            }
            self.captures[capture["id"]] = capture
            order["status"] = "COMPLETED"
            unit["payments"] = {"captures": [capture]}
            self.effects.append({"kind": "capture", **capture})
            return Answer(201, order)
        if len(parts) == 6 and parts[5] == "refund":
            capture = self.captures.get(parts[4])
            if capture is None:
                return _error(404, "RESOURCE_NOT_FOUND", "INVALID_RESOURCE_ID")
            amount = body.get("amount", capture["amount"])
            if not _valid_amount(amount):
                return _error(422, "UNPROCESSABLE_ENTITY", "DECIMAL_PRECISION")
            refund = {
                "id": secrets.token_hex(8).upper(),
                "status": "COMPLETED",
                "amount": amount,
                "custom_id": body.get("custom_id"),
            }
            full = amount["value"] == capture["amount"]["value"]
            capture["status"] = "REFUNDED" if full else "PARTIALLY_REFUNDED"
            self.effects.append({"kind": "refund", **refund})
            return Answer(201, refund)
        return _error(404, "RESOURCE_NOT_FOUND", "NOT_FOUND")


@asynccontextmanager
async def running_fake_paypal() -> AsyncIterator[FakePayPal]:
    paypal = FakePayPal()
    app = web.Application()
    add_token_route(app, paypal.tokens, "/v1/oauth2/token")
    app.router.add_route("*", "/{tail:.*}", paypal.handle)
    async with serving(app, paypal):
        paypal.tokens.url = paypal.url + "/v1/oauth2/token"
        yield paypal
