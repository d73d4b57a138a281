"""A database failover under synchronous replication: real opgate processes on a real primary
with a real streaming standby (tests/support/cluster.py), a provider that does not deduplicate.

Readiness and start-up follow the replication (no sync standby: /readyz 503; asynchronous
standbys: no start unless accepted), and a primary killed mid-stream then a standby promoted
makes no second effect and loses no approval. One failover round in CI;
``OPGATE_FAILOVER_ROUNDS=N`` runs N.
"""

from __future__ import annotations

import asyncio
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
from tests.support.opgate import fault_policy, process_env
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
