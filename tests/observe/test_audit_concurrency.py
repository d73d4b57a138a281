"""The audit chains under real concurrency: two opgate processes, one database."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import asyncpg

from tests.support.fault_provider import FaultProvider
from tests.support.opgate import (
    AGENT_TOKEN,
    REFUND_APPROVAL,
    admin_headers,
    fault_policy,
    process_env,
)
from tests.support.opgate_process import OpgateProcess, opgate_process

AUDIT_KEY = "concurrency-audit-key-0123456789"
OPERATIONS = 200


def _environment(database_url: str, policy_dir: Path, upstream: str, name: str) -> dict[str, str]:
    return process_env(
        database_url,
        policy_dir,
        {"fault": upstream},
        OPGATE_INSTANCE_ID=name,
        OPGATE_SECRET_AUDIT_KEY=AUDIT_KEY,
        OPGATE_AUDIT_CHECKPOINT_SECONDS="0.2",  # checkpoints race the traffic
        OPGATE_BACKGROUND_INTERVAL_SECONDS="3600",
        OPGATE_POLICY_RELOAD_INTERVAL_SECONDS="0",
        OPGATE_POOL_MAX_SIZE="10",
        # all 200 requests per process come from one agent at once: admit them all
        OPGATE_MAX_REQUESTS_IN_FLIGHT_PER_AGENT=str(OPERATIONS),
    )


async def _approve(http: aiohttp.ClientSession, gate: OpgateProcess) -> str:
    async with http.post(
        f"{gate.ops_url}/v1/operations", json=REFUND_APPROVAL, headers=admin_headers()
    ) as r:
        assert r.status == 201
        operation_id: str = (await r.json())["operation_id"]
        return operation_id


async def _refund(http: aiohttp.ClientSession, gate: OpgateProcess, operation_id: str) -> int:
    """The agent's send, repeated as an agent repeats a 503 (on a loaded machine 400 sends at
    once can meet a store that did not answer in time: nothing was sent then)."""
    for _ in range(20):
        async with http.post(
            f"{gate.agent_url}/fault/v1/refunds",
            data="amount=500&currency=usd&charge=ch_1",
            headers={
                "Authorization": f"Bearer {AGENT_TOKEN}",
                "Content-Type": "application/x-www-form-urlencoded",
                "X-Operation-Id": operation_id,
            },
        ) as r:
            await r.read()
            if r.status != 503:
                return r.status
    return 503


async def test_two_processes_and_200_operations_produce_a_chain_that_verifies(
    database_url: str, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """200 operations, each sent at once through BOTH processes (one claim wins, the other is
    told in flight or replayed), with checkpoints written concurrently: every record is
    chained, exactly once, and `opgate audit verify` finds the log intact."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    env_a = _environment(database_url, policy_dir, fault_provider.url, "gate-a")
    env_b = _environment(database_url, policy_dir, fault_provider.url, "gate-b")
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        opgate_process(env_a) as gate_a,
        opgate_process(env_b) as gate_b,
        aiohttp.ClientSession(trust_env=False, connector=connector) as http,
    ):
        gates = (gate_a, gate_b)
        ids = await asyncio.gather(*(_approve(http, gates[i % 2]) for i in range(OPERATIONS)))
        statuses = await asyncio.gather(*(_refund(http, gate, op) for op in ids for gate in gates))
    assert len(fault_provider.effects) == OPERATIONS
    assert Counter(statuses)[200] >= OPERATIONS
    assert set(statuses) <= {200, 409}

    conn = await asyncpg.connect(database_url)
    try:
        per_stream = dict(
            await conn.fetch("SELECT stream, count(*) FROM audit_log GROUP BY stream")
        )
        checkpoint_writers = {
            r["writer"] for r in await conn.fetch("SELECT writer FROM audit_checkpoints")
        }
    finally:
        await conn.close()
    # created, claimed, confirmed, and the record of the request that claimed it, written with
    # the settle (migration 0022)
    assert all(per_stream[op] == 4 for op in ids)
    # one record per other request (the one each operation's claim refused or replayed), and
    # each writer's `started` record
    assert per_stream["requests/gate-a"] + per_stream["requests/gate-b"] == OPERATIONS + 2
    assert per_stream["policy"] == 2
    assert checkpoint_writers == {"gate-a", "gate-b"}

    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "audit",
        "verify",
        "--database-url",
        database_url,
        env={"OPGATE_SECRET_AUDIT_KEY": AUDIT_KEY, "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, out
    records = sum(per_stream.values())
    assert out.decode().startswith(f"ok: {records} records")
    assert "signatures verified" in out.decode()
