"""A fake Adyen Checkout API: what opgate relies on, as Adyen documents it
(https://docs.adyen.com/development-resources/api-idempotency/,
https://docs.adyen.com/api-explorer/Checkout/71/overview):

- ``X-API-Key`` authenticates; the ``Idempotency-Key`` header (at most 64 characters, else a
  422) returns a key's first answer for the retention window (Adyen: at least 31 days);
- a missing merchantAccount is a 422 validation error (``errorCode``) and does nothing;
- /payments keeps ``metadata``; refunds and cancels keep the caller's ``reference``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.support.fake_provider_base import Answer, FakeProvider, KeyMemory, json_answer, serving

ADYEN_API_KEY = "AQE-test-api-key"


def _validation(code: str, message: str, status: int = 422) -> Answer:
    return Answer(
        status, {"status": status, "errorCode": code, "message": message, "errorType": "validation"}
    )


@dataclass
class FakeAdyen(FakeProvider):
    retention_seconds: float | None = 31 * 86400.0

    def __post_init__(self) -> None:
        self.keys = KeyMemory(self.retention_seconds, self.now)

    async def handle(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        if request.headers.get("X-API-Key") != ADYEN_API_KEY:
            return json_answer(
                Answer(401, {"status": 401, "errorCode": "000", "errorType": "security"})
            )
        if request.method != "POST" or not isinstance(body, dict):
            return json_answer(_validation("702", "a JSON object is required", 400))
        key = request.headers.get("Idempotency-Key")
        if key is not None and len(key) > 64:
            return json_answer(_validation("704", "Idempotency-Key is longer than 64"))
        fingerprint = request.path + json.dumps(body, sort_keys=True)
        kept = self.keys.recall(key) if key else None
        if kept is not None:
            return json_answer(kept.answer, {"Idempotent-Replayed": "true"})
        answer = self._act(request.path, body)
        if key:
            self.keys.remember(key, fingerprint, answer)
        return json_answer(answer)

    def _act(self, path: str, body: dict[str, Any]) -> Answer:
        if not body.get("merchantAccount"):
            return _validation("167", "Required field 'merchantAccount' is not provided.")
        psp = secrets.token_hex(8).upper()
        if path == "/payments":
            effect = {
                "pspReference": psp,
                "resultCode": "Authorised",
                "amount": body.get("amount"),
                "merchantReference": body.get("reference"),
                "metadata": body.get("metadata", {}),
            }
            self.effects.append({"kind": "payment", **effect})
            return Answer(200, effect)
        parts = path.split("/")  # /payments/{psp}/refunds | cancels
        if len(parts) == 4 and parts[3] in ("refunds", "cancels"):
            effect = {
                "pspReference": psp,
                "paymentPspReference": parts[2],
                "status": "received",
                "merchantAccount": body["merchantAccount"],
                "reference": body.get("reference"),
                "amount": body.get("amount"),
            }
            self.effects.append({"kind": parts[3][:-1], **effect})
            return Answer(201, effect)
        return _validation("000", f"no endpoint {path}", 404)


@asynccontextmanager
async def running_fake_adyen() -> AsyncIterator[FakeAdyen]:
    adyen = FakeAdyen()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", adyen.handle)
    async with serving(app, adyen):
        yield adyen
