"""Escalation webhooks signed the Standard Webhooks way, verified by the `standardwebhooks`
reference library against a real receiver; without a configured key, nothing unsigned leaves."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.console.helpers import escalated
from tests.support.opgate import StartOpgate, fault_policy
from tests.support.webhooks import Receiver

SECRET = "whsec_" + base64.b64encode(b"a-webhook-key-of-32-bytes-012345").decode()


async def test_an_escalation_notice_is_signed_standard_webhooks_style(
    start_opgate: StartOpgate,
    policy_dir: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The notice carries webhook-id, webhook-timestamp and webhook-signature, which the
    standardwebhooks library verifies with the configured whsec_ secret; a changed body or
    another secret does not verify."""
    monkeypatch.setenv("OPGATE_SECRET_WEBHOOK_KEY", SECRET)
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        background_interval_seconds=0.05, escalation_webhook_url=receiver.url
    ) as gate:
        op = await escalated(gate)
        await asyncio.wait_for(receiver.arrived.wait(), 20)
    body, headers = receiver.received[0]
    verified: dict[str, Any] = Webhook(SECRET).verify(body, headers)
    assert verified["operation"]["operation_id"] == op["operation_id"]
    assert verified["event"] == "operation_escalated"
    assert headers["webhook-id"] == f"ntf_{verified['notification_id']}"
    assert headers["webhook-signature"].startswith("v1,")
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body.replace(b"escalated", b"confirmed"), headers)
    other = "whsec_" + base64.b64encode(b"another-key-of-32-bytes-01234567").decode()
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(body, headers)


async def test_without_a_webhook_key_no_unsigned_notice_leaves(
    start_opgate: StartOpgate,
    policy_dir: Path,
    receiver: Receiver,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No webhook_key secret: the notice is kept undelivered with the reason, never sent
    unsigned."""
    monkeypatch.delenv("OPGATE_SECRET_WEBHOOK_KEY")
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        background_interval_seconds=0.05, escalation_webhook_url=receiver.url
    ) as gate:
        op = await escalated(gate)
        conn = await asyncpg.connect(database_url)
        try:
            deadline = asyncio.get_running_loop().time() + 20
            while True:
                error = await conn.fetchval(
                    "SELECT last_error FROM escalation_notifications WHERE operation_id = $1",
                    op["operation_id"],
                )
                if error is not None:
                    break
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
        finally:
            await conn.close()
    assert "webhook_key" in error
    assert receiver.received == []
