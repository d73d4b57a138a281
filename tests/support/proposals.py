"""An approver, a proposal document, and deciding a proposal through the operations API."""

from __future__ import annotations

from typing import Any

from tests.support.opgate import (
    Opgate,
)

APPROVER_TOKEN = "opg_test_approver_olga_0123456789"


OWNER_TOKEN = "opg_test_approver_otto_0123456789"


PROPOSAL: dict[str, Any] = {
    "provider": "fault",
    "action": "refund.create",
    "amount": 500,
    "currency": "usd",
    "params": {"charge": "ch_1"},
    "reason": "the customer was charged twice for order 1042",
}


def approver_headers(token: str = APPROVER_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def decide(
    gate: Opgate, proposal_id: str, verdict: str, token: str = APPROVER_TOKEN, **body: Any
) -> tuple[int, Any]:
    async with gate.http.post(
        f"{gate.ops_url}/v1/proposals/{proposal_id}/{verdict}",
        json=body,
        headers=approver_headers(token),
    ) as response:
        return response.status, await response.json(content_type=None)
