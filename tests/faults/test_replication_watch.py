"""Replication judged while running, not only at start: on a real primary with a synchronous
standby (tests/support/cluster.py), a change to asynchronous replication under a running opgate
(``synchronous_standby_names`` cleared, or ``synchronous_commit`` set to ``local``) takes
``/readyz`` to 503 and refuses sends with a problem naming the setting, nothing sent; back to
synchronous, it serves again. With ``accept_async_replication`` it serves throughout."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.support.cluster import Cluster
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import ADMIN_TOKEN, AGENT_TOKEN, process_env
from tests.support.opgate_process import OpgateProcess, opgate_process
from tests.support.polling import until

SECONDS = 15.0  # how long a change may take to be seen (opgate looks every second)


async def _readyz(http: aiohttp.ClientSession, gate: OpgateProcess) -> tuple[int, dict[str, Any]]:
    async with http.get(f"{gate.ops_url}/readyz", timeout=aiohttp.ClientTimeout(total=10)) as r:
        return r.status, await r.json()


async def _send_refund(http: aiohttp.ClientSession, gate: OpgateProcess) -> tuple[int, Any]:
    """Approve a refund of a fresh charge, then send it as the agent."""
    charge = f"ch_{uuid.uuid4().hex[:10]}"
    async with http.post(
        f"{gate.ops_url}/v1/operations",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        json={
            "tenant": "t1",
            "provider": "fault",
            "action": "refund.create",
            "amount": 500,
            "currency": "usd",
            "params": {"charge": charge},
            "approval_ref": "watch",
            "approved_by": "watch",
            "ttl_seconds": 600,
        },
    ) as approved:
        op = await approved.json(content_type=None)
        assert approved.status == 201, op
    async with http.post(
        f"{gate.agent_url}/fault/v1/refunds",
        data=f"amount=500&currency=usd&charge={charge}",
        headers={
            "Authorization": f"Bearer {AGENT_TOKEN}",
            "Content-Type": "application/x-www-form-urlencoded",
            "Idempotency-Key": op["idempotency_key"],
        },
        timeout=aiohttp.ClientTimeout(total=20),
    ) as sent:
        return sent.status, await sent.json(content_type=None)


async def _set(cluster: Cluster, setting: str, value: str | None) -> None:
    """ALTER SYSTEM on the primary (RESET with None), then reload its configuration."""
    conn = await asyncpg.connect(cluster.primary.dsn())
    try:
        if value is None:
            await conn.execute(f"ALTER SYSTEM RESET {setting}")
        else:
            await conn.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


async def _until_ready(http: aiohttp.ClientSession, gate: OpgateProcess, status: int) -> Any:
    async def answered() -> dict[str, Any] | None:
        got, body = await _readyz(http, gate)
        return body if got == status else None

    return await until(answered, f"/readyz {status}", seconds=SECONDS)


@pytest.mark.parametrize(
    ("setting", "weakened", "named"),
    [
        ("synchronous_standby_names", "", "synchronous_standby_names"),
        ("synchronous_commit", "local", "synchronous_commit"),
    ],
)
async def test_replication_turned_asynchronous_while_running_stops_serving(
    cluster: Cluster,
    policies: Path,
    fault_provider: FaultProvider,
    http: aiohttp.ClientSession,
    setting: str,
    weakened: str,
    named: str,
) -> None:
    """Weakened at run time: /readyz 503 and a send refused 503 naming the setting, nothing
    reaches the provider; restored: 200 and the send goes."""
    dsn = await cluster.create_database(f"watch_{uuid.uuid4().hex[:8]}")
    env = process_env(dsn, policies, {"fault": fault_provider.url})
    async with opgate_process(env) as gate:
        status, body = await _readyz(http, gate)
        assert (status, body["replication"]) == (200, "synchronous"), body
        await _set(cluster, setting, weakened)
        try:
            body = await _until_ready(http, gate, 503)
            assert named in body["detail"], body
            before = len(fault_provider.effects)
            status, refused = await _send_refund(http, gate)
            assert status == 503, refused
            assert named in refused["detail"], refused
            assert len(fault_provider.effects) == before
        finally:
            if setting == "synchronous_commit":
                await _set(cluster, setting, None)
            cluster.set_sync(True)  # names the standby again, and waits until it is sync
        body = await _until_ready(http, gate, 200)
        assert body["replication"] == "synchronous"
        status, sent = await _send_refund(http, gate)
        assert status == 200, sent


async def test_accepted_asynchronous_replication_serves_when_it_appears(
    cluster: Cluster, policies: Path, fault_provider: FaultProvider, http: aiohttp.ClientSession
) -> None:
    """With accept_async_replication, clearing synchronous_standby_names keeps serving."""
    dsn = await cluster.create_database(f"accepted_{uuid.uuid4().hex[:8]}")
    env = process_env(
        dsn, policies, {"fault": fault_provider.url}, OPGATE_ACCEPT_ASYNC_REPLICATION="true"
    )
    async with opgate_process(env) as gate:
        cluster.set_sync(False)
        try:
            body = await until(
                lambda: _replication_is(http, gate, "asynchronous"),
                "/readyz says asynchronous",
                seconds=SECONDS,
            )
            assert body["status"] == "ready"
            status, sent = await _send_refund(http, gate)
            assert status == 200, sent
        finally:
            cluster.set_sync(True)


async def _replication_is(
    http: aiohttp.ClientSession, gate: OpgateProcess, durability: str
) -> dict[str, Any] | None:
    status, body = await _readyz(http, gate)
    return body if status == 200 and body.get("replication") == durability else None
