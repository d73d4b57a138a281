"""An approval whose insert committed while the application was answered 503 (the database's
reply lost with its connection, as in a failover) is not approved twice when the application
retries it with the same ``Idempotency-Key``: against a real PostgreSQL behind a relay that
swallows the server's reply to the insert and cuts the connection."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest_asyncio

from tests.support.opgate import REFUND_APPROVAL, Opgate, StartOpgate, admin_headers, fault_policy
from tests.support.pg_relay import TcpRelay, dsn_through_relay, relay_target


@pytest_asyncio.fixture(loop_scope="session")
async def relayed_gate(
    start_opgate: StartOpgate, policy_dir: Path, database_url: str
) -> AsyncIterator[tuple[Opgate, TcpRelay]]:
    """opgate whose database connections go through a cuttable relay."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    relay = TcpRelay()
    host, port = await relay.start(*relay_target(database_url))
    try:
        async with start_opgate(database_url=dsn_through_relay(database_url, host, port)) as gate:
            yield gate, relay
    finally:
        await relay.stop()


async def _approve(gate: Opgate, body: dict[str, Any], key: str) -> tuple[int, dict[str, Any]]:
    async with gate.http.post(
        f"{gate.ops_url}/v1/operations",
        json=body,
        headers={**admin_headers(), "Idempotency-Key": f'"{key}"'},
    ) as response:
        return response.status, await response.json(content_type=None)


async def _operations_with_ref(database_url: str, approval_ref: str) -> list[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT operation_id FROM operations WHERE approval_ref = $1", approval_ref
        )
    finally:
        await conn.close()
    return [row["operation_id"] for row in rows]


async def test_an_approval_answered_503_then_retried_with_its_key_is_created_once(
    relayed_gate: tuple[Opgate, TcpRelay], database_url: str
) -> None:
    """The insert commits, its reply is lost (503); the retry with the same key answers the
    operation that was created, and no second one exists."""
    gate, relay = relayed_gate
    marker = "lost-approval-" + secrets.token_hex(6)  # bound only to the insert
    body = {**REFUND_APPROVAL, "approval_ref": marker}
    key = "app-retry-" + secrets.token_hex(6)
    relay.lose_reply_to(marker.encode())
    first = await _approve(gate, body, key)
    assert relay.replies_lost == 1, "the relay never lost the insert's answer"
    assert (first[0], first[1]["code"]) == (503, "store_unavailable")
    stored = await _operations_with_ref(database_url, marker)
    assert len(stored) == 1, "the insert did not commit"
    retried = await _approve(gate, body, key)
    assert retried[0] in (200, 201), retried
    assert retried[1]["operation_id"] == stored[0]
    assert await _operations_with_ref(database_url, marker) == stored
