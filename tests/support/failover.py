"""An approved refund's life through a running opgate process, as the failover tests drive it:
approved through the operations API, read through the recovery protocol, sent as read."""

from __future__ import annotations

import uuid
from typing import Any

import aiohttp

from tests.support.opgate import ADMIN_TOKEN, AGENT_TOKEN

__all__ = ["approve", "recovery_view", "send_approved"]


async def approve(http: aiohttp.ClientSession, ops_url: str, index: int) -> str:
    """A refund approved through the operations API; its operation id (answered 201)."""
    async with http.post(
        f"{ops_url}/v1/operations",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        json={
            "tenant": "t1",
            "provider": "fault",
            "action": "refund.create",
            "amount": 100 + index,
            "currency": "usd",
            "params": {"charge": f"ch_{uuid.uuid4().hex[:10]}"},
            "approval_ref": f"T-{index}",
            "approved_by": "failover",
            "ttl_seconds": 600,
        },
        timeout=aiohttp.ClientTimeout(total=10),
    ) as answer:
        payload: dict[str, Any] = await answer.json(content_type=None)
        assert answer.status == 201, payload
        return str(payload["operation_id"])


async def recovery_view(
    http: aiohttp.ClientSession, agent_url: str, operation_id: str
) -> tuple[int, dict[str, Any]]:
    async with http.get(
        f"{agent_url}/_opgate/v1/operations/{operation_id}",
        headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
        timeout=aiohttp.ClientTimeout(total=10),
    ) as answer:
        body: dict[str, Any] = await answer.json(content_type=None)
        return answer.status, body


async def send_approved(
    http: aiohttp.ClientSession, agent_url: str, request: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """One send of the approved request as the recovery read gives it."""
    async with http.request(
        request["method"],
        agent_url + request["path"],
        data=request.get("form"),
        json=request.get("json"),
        headers={**request["headers"], "Authorization": f"Bearer {AGENT_TOKEN}"},
        timeout=aiohttp.ClientTimeout(total=30),
    ) as answer:
        body: dict[str, Any] = await answer.json(content_type=None)
        return answer.status, body
