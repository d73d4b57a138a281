"""``/readyz`` answers within its budget (below a Kubernetes probe's default 1 s timeout)
whatever holds the pool: on a real primary whose synchronous standby is stopped, with every
pooled connection held by an approval whose commit waits for that standby, it says 503 in
time, and 200 again once the standby is back."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from tests.support.cluster import Cluster
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import ADMIN_TOKEN, process_env
from tests.support.opgate_process import opgate_process
from tests.support.polling import until

PROBE_TIMEOUT_SECONDS = 1.0  # Kubernetes' default timeoutSeconds
POOL = 2
HOLDERS = 4  # more approvals than connections: every one of the pool's is held


async def _readyz(http: aiohttp.ClientSession, ops_url: str) -> tuple[int, dict[str, Any], float]:
    """/readyz's status and body, and how long it took to answer."""
    started = time.monotonic()
    async with http.get(f"{ops_url}/readyz", timeout=aiohttp.ClientTimeout(total=30)) as answer:
        body: dict[str, Any] = await answer.json()
        return answer.status, body, time.monotonic() - started


async def _approve(http: aiohttp.ClientSession, ops_url: str) -> int:
    async with http.post(
        f"{ops_url}/v1/operations",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        json={
            "tenant": "t1",
            "provider": "fault",
            "action": "refund.create",
            "amount": 100,
            "currency": "usd",
            "params": {"charge": f"ch_{uuid.uuid4().hex[:10]}"},
            "approval_ref": "held",
            "approved_by": "probe",
            "ttl_seconds": 600,
        },
        timeout=aiohttp.ClientTimeout(total=30),
    ) as answer:
        return answer.status


async def _until_commits_wait(cluster: Cluster, database: str, count: int) -> None:
    """Until ``count`` of the database's backends wait for the synchronous standby."""
    conn = await asyncpg.connect(cluster.primary.dsn(database))

    async def waiting() -> bool:
        found: int = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND datname = $1",
            database,
        )
        return found >= count

    try:
        await until(waiting, f"{count} commits wait for the standby", seconds=20)
    finally:
        await conn.close()


async def test_readyz_answers_503_within_a_second_while_commits_hold_the_pool(
    cluster: Cluster, policies: Path, fault_provider: FaultProvider, http: aiohttp.ClientSession
) -> None:
    """The standby stopped and every pooled connection waiting for it: /readyz answers 503
    in under a second (it answered after the pool's acquire timeout); standby back, 200."""
    database = f"budget_{uuid.uuid4().hex[:8]}"
    dsn = await cluster.create_database(database)
    env = process_env(dsn, policies, {"fault": fault_provider.url}, OPGATE_POOL_MAX_SIZE=str(POOL))
    async with opgate_process(env) as gate:
        status, body, _ = await _readyz(http, gate.ops_url)
        assert status == 200, body
        cluster.stop_standby()
        holders: list[asyncio.Task[int]] = []
        try:
            holders = [asyncio.create_task(_approve(http, gate.ops_url)) for _ in range(HOLDERS)]
            await _until_commits_wait(cluster, database, POOL)
            status, body, took = await _readyz(http, gate.ops_url)
            assert status == 503, body
            assert took < PROBE_TIMEOUT_SECONDS, f"/readyz took {took:.2f} s: {body}"
        finally:
            cluster.start_standby()
            await asyncio.gather(*holders, return_exceptions=True)
        status, body, took = await _readyz(http, gate.ops_url)
        assert (status, body["replication"]) == (200, "synchronous"), body
        assert took < PROBE_TIMEOUT_SECONDS
