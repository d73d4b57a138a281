"""An opgate that accepts the tests' signed mandates (tests/support/mandates.py): the issuer
settings naming the person's key, a presentation, and the provider request it approves, sent
exactly as opgate answered it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
from joserfc.jwk import ECKey

from tests.support.mandates import Signer
from tests.support.opgate import AGENT_TOKEN, Opgate, fault_policy
from tests.support.opgate_process import OpgateProcess

AUDIENCE = "opgate.test"
PERSON = Signer("surface-2026")
# A payment on the fault provider whose policy names what carries a mandate's payee,
# instrument and reference (``mandate``): the call the tests' mandates approve
PAYMENT_RULE = """\
  - name: payment.create
    method: POST
    path: /v1/payments
    body: form
    amount: amount
    currency: currency
    params: [destination, source, reference]
    free: ['metadata[*]', description]
    mandate: {payee: destination, payment_instrument: source, reference: reference}
"""


def mandate_policy() -> str:
    """The fault provider's policy (tests/support/opgate.py) with the payment rule above."""
    text = fault_policy(deduplicates=False)
    return text.replace("\nrules:\n", "\nrules:\n" + PAYMENT_RULE, 1)


def mandate_settings(tmp_path: Path, provider: str = "fault") -> dict[str, Any]:
    """Mandates of PERSON accepted for tenant t1, paid through ``provider``."""
    key_file = tmp_path / "receipt-key.json"
    key_file.write_text(json.dumps(ECKey.generate_key("P-256").as_dict(private=True)))
    return {
        "mandate_issuers": [
            {
                "name": "surface",
                "tenants": ["t1"],
                "jwks": PERSON.jwks,
                "payees": {"acct_merchant": provider},
            }
        ],
        "mandate_audience": AUDIENCE,
        "receipt_key_file": key_file,
    }


async def present(
    gate: Opgate | OpgateProcess,
    http: aiohttp.ClientSession,
    mandate: str,
    token: str = AGENT_TOKEN,
    **fields: Any,
) -> tuple[int, dict[str, Any]]:
    body = {
        "mandate": mandate,
        "provider": "fault",
        "action": "payment.create",
        **fields,
    }
    async with http.post(
        f"{gate.agent_url}/_opgate/v1/mandates",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
    ) as response:
        return response.status, json.loads(await response.read())


async def issued_nonce(
    gate: Opgate | OpgateProcess, http: aiohttp.ClientSession, token: str = AGENT_TOKEN
) -> str:
    """A nonce opgate hands out for the agent's next key binding (AP2: the verifier's
    challenge)."""
    async with http.post(
        f"{gate.agent_url}/_opgate/v1/mandates/nonces",
        headers={"Authorization": f"Bearer {token}"},
    ) as response:
        body = await response.json()
        assert response.status == 201, body
    assert body["audience"] == AUDIENCE
    nonce: str = body["nonce"]
    return nonce


async def send_exactly(
    gate: Opgate | OpgateProcess, http: aiohttp.ClientSession, request: dict[str, Any]
) -> int:
    body = "&".join(f"{k}={v}" for k, v in request["form"].items())
    headers = {
        **request["headers"],
        "Authorization": f"Bearer {AGENT_TOKEN}",
        "Content-Type": "application/x-www-form-urlencoded",
    }
    async with http.post(gate.agent_url + request["path"], data=body, headers=headers) as r:
        await r.read()
        return r.status
