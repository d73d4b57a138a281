"""A fake Square Payments API: what opgate relies on, as Square documents it
(https://developer.squareup.com/reference/square/payments-api):

- the idempotency key is the JSON body's ``idempotency_key`` (required; a header is ignored);
  a repeated key with the same request returns the first answer, with a different one it is
  400 ``IDEMPOTENCY_KEY_REUSED``; the fake forgets keys after ``retention_seconds``;
- ``source_id: cnon:card-nonce-declined`` is 402 ``CARD_DECLINED`` and charges nothing;
- CreatePayment keeps ``reference_id`` and ``note``; ListPayments (newest first) finds them;
- RefundPayment and CancelPayment (no key) act on a known payment, 404 otherwise.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.support.fake_provider_base import (
    Answer,
    FakeProvider,
    KeyMemory,
    json_answer,
    serving,
)

SQUARE_TOKEN = "sq0atp-test-token"


def _error(status: int, category: str, code: str, detail: str) -> Answer:
    return Answer(status, {"errors": [{"category": category, "code": code, "detail": detail}]})


@dataclass
class FakeSquare(FakeProvider):
    retention_seconds: float | None = 86400.0

    def __post_init__(self) -> None:
        self.keys = KeyMemory(self.retention_seconds, self.now)
        self.payments: dict[str, dict[str, Any]] = {}

    def payments_committed(self) -> list[dict[str, Any]]:
        return [e for e in self.effects if e["kind"] == "payment"]

    async def handle(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        if request.headers.get("Authorization") != f"Bearer {SQUARE_TOKEN}":
            return json_answer(_error(401, "AUTHENTICATION_ERROR", "UNAUTHORIZED", "bad token"))
        path = request.path
        if request.method == "GET" and path == "/v2/payments":
            newest = sorted(self.payments.values(), key=lambda p: p["created_seq"], reverse=True)
            return web.json_response({"payments": newest})
        if request.method == "GET" and path.startswith("/v2/payments/"):
            found = self.payments.get(path.rsplit("/", 1)[1])
            if found is None:
                return json_answer(_error(404, "INVALID_REQUEST_ERROR", "NOT_FOUND", "no such"))
            return web.json_response({"payment": found})
        if request.method == "POST" and path.endswith("/cancel"):
            return json_answer(self._cancel(path.split("/")[3]))
        if request.method == "POST" and path in ("/v2/payments", "/v2/refunds"):
            return json_answer(self._keyed(path, body))
        return json_answer(_error(404, "INVALID_REQUEST_ERROR", "NOT_FOUND", path))

    def _keyed(self, path: str, body: Any) -> Answer:
        if not isinstance(body, dict) or not isinstance(body.get("idempotency_key"), str):
            return _error(400, "INVALID_REQUEST_ERROR", "MISSING_REQUIRED_PARAMETER", "key")
        key = body["idempotency_key"]
        fingerprint = path + json.dumps(body, sort_keys=True)
        kept = self.keys.recall(key)
        if kept is not None:
            if kept.fingerprint != fingerprint:
                return _error(400, "INVALID_REQUEST_ERROR", "IDEMPOTENCY_KEY_REUSED", key)
            return kept.answer
        answer = self._create_payment(body) if path == "/v2/payments" else self._refund(body)
        self.keys.remember(key, fingerprint, answer)
        return answer

    def _create_payment(self, body: dict[str, Any]) -> Answer:
        if body.get("source_id") == "cnon:card-nonce-declined":
            return _error(402, "PAYMENT_METHOD_ERROR", "CARD_DECLINED", "declined")
        payment: dict[str, Any] = {
            "id": "pay_" + secrets.token_hex(8),
            "status": "COMPLETED",
            "amount_money": body.get("amount_money"),
            "source_type": "CARD",
            "reference_id": body.get("reference_id"),
            "note": body.get("note"),
            "created_seq": len(self.effects),
        }
        self.payments[payment["id"]] = payment
        self.effects.append({"kind": "payment", **payment})
        return Answer(200, {"payment": payment})

    def _refund(self, body: dict[str, Any]) -> Answer:
        if body.get("payment_id") not in self.payments:
            return _error(404, "INVALID_REQUEST_ERROR", "NOT_FOUND", "no such payment")
        refund = {
            "id": "ref_" + secrets.token_hex(8),
            "status": "PENDING",
            "payment_id": body["payment_id"],
            "amount_money": body.get("amount_money"),
            "reason": body.get("reason"),
        }
        self.effects.append({"kind": "refund", **refund})
        return Answer(200, {"refund": refund})

    def _cancel(self, payment_id: str) -> Answer:
        payment = self.payments.get(payment_id)
        if payment is None:
            return _error(404, "INVALID_REQUEST_ERROR", "NOT_FOUND", "no such payment")
        payment["status"] = "CANCELED"
        self.effects.append({"kind": "cancel", "payment_id": payment_id})
        return Answer(200, {"payment": payment})


@asynccontextmanager
async def running_fake_square(
    retention_seconds: float | None = 86400.0,
) -> AsyncIterator[FakeSquare]:
    square = FakeSquare(retention_seconds=retention_seconds)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", square.handle)
    async with serving(app, square):
        yield square
