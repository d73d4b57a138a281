"""A database failover under synchronous replication: real opgate processes on a real primary
with a real streaming standby (tests/support/cluster.py), a provider that does not deduplicate.

Readiness and start-up follow the replication (no sync standby: /readyz 503; asynchronous
standbys: no start unless accepted), and a primary killed mid-stream then a standby promoted
makes no second effect and loses no approval. One failover round in CI;
``OPGATE_FAILOVER_ROUNDS=N`` runs N.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.support.cluster import Cluster, missing_reason, running_cluster
from tests.support.fault_provider import FaultProvider
from tests.support.killable_opgate import REPO
from tests.support.opgate import ADMIN_TOKEN, AGENT_TOKEN, fault_policy, process_env
from tests.support.opgate_process import opgate_process


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    directory = tmp_path / "policies"
    directory.mkdir()
    (directory / "fault.yaml").write_text(
        fault_policy(deduplicates=False, total_timeout=2, grace_seconds=0.5, max_attempts=4)
    )
    return directory


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(trust_env=False) as session:
        yield session


async def readyz(http: aiohttp.ClientSession, ops_url: str) -> tuple[int, dict[str, Any]]:
    async with http.get(f"{ops_url}/readyz", timeout=aiohttp.ClientTimeout(total=10)) as answer:
        body: dict[str, Any] = await answer.json()
        return answer.status, body


async def test_readyz_is_503_while_no_sync_standby_acknowledges_commits(
    cluster: Cluster, policies: Path, fault_provider: FaultProvider, http: aiohttp.ClientSession
) -> None:
    """With synchronous_standby_names set and the standby stopped, /readyz says 503 within its
    commit timeout (claims would hang); with the standby back, 200 and 'synchronous'."""
    dsn = await cluster.create_database(f"ready_{uuid.uuid4().hex[:8]}")
    env = process_env(
        dsn,
        policies,
        {"fault": fault_provider.url},
        OPGATE_READINESS_COMMIT_TIMEOUT_SECONDS="0.5",
    )
    async with opgate_process(env) as gate:
        status, body = await readyz(http, gate.ops_url)
        assert status == 200, body
        cluster.stop_standby()
        try:
            status, body = await readyz(http, gate.ops_url)
            assert status == 503, body
            assert "not acknowledged" in body["detail"], body
        finally:
            cluster.start_standby()
        status, body = await readyz(http, gate.ops_url)
        assert (status, body["replication"]) == (200, "synchronous"), body


async def test_single_node_is_said_at_start_and_in_readyz(
    database_url: str, policies: Path, fault_provider: FaultProvider, http: aiohttp.ClientSession
) -> None:
    """A single PostgreSQL (no standby, no synchronous names): a warning at start, a note in
    /readyz's body, and opgate serves."""
    env = process_env(database_url, policies, {"fault": fault_provider.url})
    async with opgate_process(env) as gate:
        status, body = await readyz(http, gate.ops_url)
        said = [line for line in gate.lines if line.get("event") == "opgate_replication"]
    assert status == 200, body
    assert body["replication"] == "single_node"
    assert "single PostgreSQL node" in body["replication_note"]
    assert [(line["level"], line["durability"]) for line in said] == [("warning", "single_node")]


async def test_asynchronous_standby_refuses_start_unless_accepted(
    policies: Path, fault_provider: FaultProvider, http: aiohttp.ClientSession
) -> None:
    """Asynchronous standbys only: `opgate serve` exits 2 with one line; with
    OPGATE_ACCEPT_ASYNC_REPLICATION=true it serves and says 'asynchronous'."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with running_cluster(sync=False) as fresh:
        dsn = await fresh.create_database("opgate")
        env = process_env(dsn, policies, {"fault": fault_provider.url})
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proxy",
            "serve",
            cwd=REPO,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("OPGATE_")},
                **env,
                "OPGATE_AGENT_LISTEN": "127.0.0.1:0",
                "OPGATE_OPS_LISTEN": "127.0.0.1:0",
                "OPGATE_FORWARD_LISTEN": "",
                "OPGATE_WORKERS": "1",
            },
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(process.communicate(), 60)
        lines = err.decode().strip().splitlines()
        assert process.returncode == 2, lines
        assert len(lines) == 1, lines
        assert "asynchronous standby" in lines[0]
        assert "accept_async_replication" in lines[0]

        accepted = {**env, "OPGATE_ACCEPT_ASYNC_REPLICATION": "true"}
        async with opgate_process(accepted) as gate:
            status, body = await readyz(http, gate.ops_url)
        assert (status, body["replication"]) == (200, "asynchronous"), body


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


async def follow_recovery(agent_url: str, operation_id: str) -> tuple[int, dict[str, Any]]:
    """A replacement agent process (tests/support/recovery_agent.py): its exit code and view."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.recovery_agent",
        agent_url,
        AGENT_TOKEN,
        operation_id,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    lines = out.decode().strip().splitlines()
    view: dict[str, Any] = json.loads(lines[-1]) if lines else {"stderr": err.decode()[-2000:]}
    return process.returncode, view


async def test_claim_cut_off_at_its_commit_is_sent_once_after_recovery(
    cluster: Cluster, policies: Path, fault_provider: FaultProvider, http: aiohttp.ClientSession
) -> None:
    """A claim whose commit no standby acknowledged (the statement timed out: 503 "nothing was
    sent", the row committed locally) is released as not_sent once the store answers: the
    recovery protocol sends it exactly once and it ends confirmed, not failed."""
    dsn = await cluster.create_database(f"cut_{uuid.uuid4().hex[:8]}")
    env = process_env(
        dsn,
        policies,
        {"fault": fault_provider.url},
        OPGATE_STATEMENT_TIMEOUT_MS="1000",
        OPGATE_LEASE_MARGIN_SECONDS="0.3",  # the lease (2.3 s) expires within the test
        OPGATE_BACKGROUND_INTERVAL_SECONDS="0.2",
    )
    async with opgate_process(env) as gate:
        operation_id = await approve(http, gate.ops_url, 1)
        _, view = await recovery_view(http, gate.agent_url, operation_id)
        cluster.stop_standby()
        try:
            status, problem = await send_approved(http, gate.agent_url, view["request"])
        finally:
            cluster.start_standby()
        assert (status, problem.get("code")) == (503, "store_unavailable"), problem
        assert fault_provider.requests == []  # nothing was sent
        code, final = await follow_recovery(gate.agent_url, operation_id)
    effects = [e for e in fault_provider.effects if e.operation_id == operation_id]
    assert (code, final["operation"]["status"]) == (0, "confirmed"), final
    assert len(effects) == 1
