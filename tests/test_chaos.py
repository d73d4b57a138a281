"""Chaos with nothing lost: three opgate processes on one PostgreSQL, many agents sending
approved operations and duplicates of them to random replicas, replicas SIGKILLed and
restarted at random moments, and a provider that sometimes answers 500 after committing.

Bounded in count and time, loopback only. When the load stops and reconciliation has run:
every operation is confirmed, failed with no effect, or escalated; no operation has more than
one effect at the provider; every confirmed operation's effect exists; the audit chain verifies.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.killable_opgate import REPO, KillableOpgate, spawn_opgate
from tests.support.opgate import ADMIN_TOKEN, AGENT_TOKEN, fault_policy, process_env

OPERATIONS = 120
REPLICAS = 3
KILLS = 6
LOAD_SECONDS = 8.0
SETTLE_SECONDS = 60.0
SEED = int(os.environ.get("OPGATE_CHAOS_SEED", "20261129"))


class Cluster:
    """Three replicas; any of them may be down at any moment."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.replicas: list[KillableOpgate | None] = [None] * REPLICAS
        self.kills = 0
        self.starts = 0

    async def start(self, index: int) -> None:
        self.starts += 1
        self.replicas[index] = await spawn_opgate(
            self.env, self.logs / f"replica-{index}-{self.starts}.log"
        )

    def any_url(self, rng: random.Random, kind: str = "agent") -> str | None:
        up = [r for r in self.replicas if r is not None and r.process.returncode is None]
        if not up:
            return None
        chosen = rng.choice(up)
        return chosen.agent_url if kind == "agent" else chosen.ops_url

    async def kill_and_restart(self, index: int) -> None:
        replica = self.replicas[index]
        if replica is not None:
            await replica.kill()
            self.kills += 1
        self.replicas[index] = None
        await self.start(index)

    async def stop(self) -> None:
        for replica in self.replicas:
            if replica is not None:
                await replica.kill()


async def approve(http: aiohttp.ClientSession, ops_url: str, index: int) -> dict[str, Any]:
    async with http.post(
        f"{ops_url}/v1/operations",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        json={
            "tenant": "t1",
            "provider": "fault",
            "action": "refund.create",
            "amount": 100 + index,
            "currency": "usd",
            "params": {"charge": f"ch_{index}"},
            "approval_ref": f"T-{index}",
            "approved_by": "chaos",
            "ttl_seconds": 600,
        },
    ) as response:
        assert response.status == 201
        payload: dict[str, Any] = await response.json()
        return payload


async def send_approved(http: aiohttp.ClientSession, url: str, request: dict[str, Any]) -> None:
    """One send of the approved request; whatever happens, the row will say."""
    try:
        async with http.request(
            request["method"],
            url + request["path"],
            data=request["form"],
            headers={**request["headers"], "Authorization": f"Bearer {AGENT_TOKEN}"},
            timeout=aiohttp.ClientTimeout(total=10),
        ) as response:
            await response.read()
    except (aiohttp.ClientError, TimeoutError):
        pass  # the replica died under us


async def agent(
    cluster: Cluster,
    op: dict[str, Any],
    rng: random.Random,
    deadline: float,
    duplicates: Counter[str],
    start_after: float,
) -> str:
    """A replacement agent following the recovery protocol against random replicas, firing
    a duplicate of the approved request now and then."""
    await asyncio.sleep(start_after)  # agents arrive spread over the load period
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(trust_env=False, connector=connector) as http:
        while time.monotonic() < deadline:
            url = cluster.any_url(rng)
            if url is None:
                await asyncio.sleep(0.05)  # every replica is restarting: ask again shortly
                continue
            try:
                async with http.get(
                    f"{url}/_opgate/v1/operations/{op['operation_id']}",
                    headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as response:
                    if response.status != 200:
                        await asyncio.sleep(0.05)
                        continue
                    view = await response.json()
            except (aiohttp.ClientError, TimeoutError):
                continue
            action = view["next_action"]
            if action in ("proceed", "new_approval_required", "escalated"):
                return str(action)
            if action in ("send", "retry"):
                sends = 2 if rng.random() < 0.3 else 1  # a duplicate, to a random replica
                duplicates[op["operation_id"]] += sends - 1
                await asyncio.gather(
                    *(
                        send_approved(http, cluster.any_url(rng) or url, view["request"])
                        for _ in range(sends)
                    )
                )
                continue
            await asyncio.sleep(min(float(view.get("retry_after_seconds") or 0.1), 1.0))
    return "unfinished"


@pytest.fixture
def chaos_env(database_url: str, tmp_path: Path, fault_provider: FaultProvider) -> dict[str, str]:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "fault.yaml").write_text(
        fault_policy(deduplicates=False, total_timeout=2, grace_seconds=0.5, max_attempts=4)
    )
    return process_env(
        database_url,
        policies,
        {"fault": fault_provider.url},
        OPGATE_LEASE_MARGIN_SECONDS="0.3",
        OPGATE_BACKGROUND_INTERVAL_SECONDS="0.2",
        OPGATE_DRAIN_SECONDS="1",
        OPGATE_SECRET_AUDIT_KEY="chaos-audit-key-not-a-real-secret",
        OPGATE_AUDIT_CHECKPOINT_SECONDS="0.5",
    )


async def test_chaos_loses_nothing_and_duplicates_nothing(
    chaos_env: dict[str, str], tmp_path: Path, fault_provider: FaultProvider, database_url: str
) -> None:
    """Under kills, restarts, 500-after-commit and duplicate sends, every operation ends
    settled or escalated with at most one effect, and the audit chain verifies."""
    rng = random.Random(SEED)
    # The provider commits, then answers 500, one time in eight (lookups included).
    modes = [
        FaultMode.ERROR_AFTER_COMMIT if rng.random() < 0.125 else FaultMode.OK for _ in range(2000)
    ]
    fault_provider.script(*modes)
    cluster = Cluster(chaos_env, tmp_path)
    duplicates: Counter[str] = Counter()
    try:
        for index in range(REPLICAS):
            await cluster.start(index)
        async with aiohttp.ClientSession(trust_env=False) as http:
            ops = [
                await approve(http, cluster.any_url(rng, "ops") or "", i) for i in range(OPERATIONS)
            ]
        deadline = time.monotonic() + LOAD_SECONDS + SETTLE_SECONDS
        fault_provider.answer_delay_seconds = 0.15  # kills land between commit and answer
        agents = [
            asyncio.create_task(
                agent(
                    cluster,
                    op,
                    random.Random(SEED + i),
                    deadline,
                    duplicates,
                    start_after=rng.uniform(0, LOAD_SECONDS),
                )
            )
            for i, op in enumerate(ops)
        ]
        for _ in range(KILLS):  # the chaos: bounded in count and time
            await asyncio.sleep(rng.uniform(0.3, LOAD_SECONDS / KILLS))  # random kill moments
            await cluster.kill_and_restart(rng.randrange(REPLICAS))
        endings = Counter(await asyncio.gather(*agents))
        rows = await final_rows(database_url)
        verified = await verify_audit(chaos_env)
    finally:
        await cluster.stop()
        fault_provider.release()

    effects_per_op = Counter(e.operation_id for e in fault_provider.effects)
    statuses = Counter("escalated" if r["escalated_at"] else r["status"] for r in rows.values())
    figures = {
        "operations": OPERATIONS,
        "duplicates_sent": sum(duplicates.values()),
        "kills": cluster.kills,
        "provider_requests": len(fault_provider.requests),
        "effects": len(fault_provider.effects),
        "statuses": dict(statuses),
        "agent_endings": dict(endings),
        "settled_by": dict(Counter(r["settled_reason"] for r in rows.values())),
        "resent_attempts": sum(max(0, r["attempts"] - 1) for r in rows.values()),
        "seed": SEED,
    }
    print(f"\nchaos figures: {json.dumps(figures)}")
    assert endings["unfinished"] == 0, figures
    assert set(statuses) <= {"confirmed", "failed", "escalated"}, figures
    assert max(effects_per_op.values(), default=0) <= 1, effects_per_op.most_common(3)
    by_id = {e.id: e for e in fault_provider.effects}
    for operation_id, row in rows.items():
        if row["status"] == "confirmed":
            effect = by_id.get(row["provider_object_id"])
            assert effect is not None, (operation_id, row)
            assert effect.operation_id == operation_id
        if row["status"] == "failed":
            assert effects_per_op[operation_id] == 0, (operation_id, row)
    assert cluster.kills == KILLS
    assert verified == 0


async def final_rows(database_url: str) -> dict[str, dict[str, Any]]:
    conn = await asyncpg.connect(database_url)
    try:
        records = await conn.fetch(
            "SELECT operation_id, status, escalated_at, provider_object_id, settled_reason,"
            " attempts FROM operations"
        )
    finally:
        await conn.close()
    return {r["operation_id"]: dict(r) for r in records}


async def verify_audit(env: dict[str, str]) -> int:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "audit",
        "verify",
        cwd=REPO,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, (out.decode(), err.decode())
    return process.returncode
