"""Crash windows of an x402 payment with real processes: opgate (``python -m proxy serve``)
SIGKILLed by the paid API (the SDK's resource server and exact facilitator over the in-memory
token) when the paid request arrives, before anything is verified, or once it has settled,
before the answer; or the answer lost with opgate alive. A replacement opgate process and a
replacement agent holding only the operation id then finish it (the agent's recovery read,
then the send it advises): exactly one settlement per operation in the ledger, every run."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from proxy.x402.authorization import operation_nonce
from tests.support.killable_opgate import KillableOpgate, spawn_opgate
from tests.support.opgate import AGENT_TOKEN, admin_headers, process_env
from tests.support.x402_chain_rpc import ChainRpc, chain_rpc
from tests.support.x402_gate import REPORT, WALLET, paid_policy, terms
from tests.support.x402_ledger import Ledger
from tests.support.x402_server import PRICE, PaidApi, paid_api

RUNS = 3  # per window
HANG_GUARD_SECONDS = 90.0
AGENT = {"Authorization": f"Bearer {AGENT_TOKEN}"}


@pytest_asyncio.fixture(loop_scope="session")
async def ledger() -> Ledger:
    chain = Ledger(now=lambda: int(time.time()))
    chain.fund(WALLET.address, 100 * PRICE)
    return chain


@pytest_asyncio.fixture(loop_scope="session")
async def api(ledger: Ledger) -> AsyncIterator[PaidApi]:
    async with paid_api(ledger) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="session")
async def node(ledger: Ledger) -> AsyncIterator[ChainRpc]:
    async with chain_rpc(ledger) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(trust_env=False) as session:
        yield session


def env_for(database_url: str, tmp_path: Path, api: PaidApi, node: ChainRpc) -> dict[str, str]:
    """A process's settings: the paid API's policy with a 3 s provider timeout (the killed
    process's lease lapses 3.5 s after its claim), reconciliation reading the node."""
    policy_dir = tmp_path / "policies"
    policy_dir.mkdir(exist_ok=True)
    policy = paid_policy(chain_rpc=True, expiry_margin=0).replace(
        "classify:", "timeouts: {total_seconds: 3}\nclassify:"
    )
    (policy_dir / "paid.yaml").write_text(policy)
    return process_env(
        database_url,
        policy_dir,
        {"paid": api.base},
        OPGATE_SECRET_PAID_WALLET=WALLET.key.hex(),
        OPGATE_SECRET_PAID_RPC=node.url,
        OPGATE_LEASE_MARGIN_SECONDS="0.5",
    )


async def approve(http: aiohttp.ClientSession, gate: KillableOpgate, api: PaidApi) -> str:
    body = {
        "tenant": "t1",
        "provider": "paid",
        "action": "report.buy",
        "params": terms(f"{api.base}/report"),
        "approval_ref": "ticket-x402",
        "approved_by": "alice@example.com",
        "ttl_seconds": 600,
    }
    async with http.post(
        f"{gate.ops_url}/v1/operations", json=body, headers=admin_headers()
    ) as response:
        created: dict[str, Any] = await response.json(content_type=None)
        assert response.status == 201, created
    operation_id: str = created["operation_id"]
    return operation_id


async def buy(
    http: aiohttp.ClientSession, gate: KillableOpgate, operation_id: str
) -> tuple[int, dict[str, Any]]:
    """The agent's request; a dropped connection (its opgate killed) is (0, {})."""
    try:
        async with http.get(
            f"{gate.agent_url}{REPORT}",
            headers={"X-Operation-Id": operation_id, "Proxy-Authorization": AGENT["Authorization"]},
        ) as response:
            return response.status, await response.json(content_type=None)
    except aiohttp.ClientError:
        return 0, {}


async def finish_as_a_replacement(
    http: aiohttp.ClientSession, gate: KillableOpgate, operation_id: str
) -> dict[str, Any]:
    """A replacement agent with only the operation id: it reads the operation (which
    reconciles it when due) and sends it when told to, until it is settled."""
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while True:
        assert time.monotonic() < deadline, "the operation was not settled in time"
        async with http.get(
            f"{gate.agent_url}/_opgate/v1/operations/{operation_id}", headers=AGENT
        ) as response:
            view: dict[str, Any] = await response.json()
            assert response.status == 200, view
        if view["operation"]["status"] in ("confirmed", "failed"):
            return view
        if view["next_action"] in ("send", "retry"):
            await buy(http, gate, operation_id)
        await asyncio.sleep(0.25)  # polling the recovery read, bounded by the deadline


@pytest.mark.parametrize("window", ["killed_on_arrival", "killed_after_settlement", "lost"])
async def test_every_crash_window_settles_each_operation_exactly_once(
    database_url: str,
    tmp_path: Path,
    api: PaidApi,
    ledger: Ledger,
    node: ChainRpc,
    http: aiohttp.ClientSession,
    window: str,
) -> None:
    """RUNS operations, each hit by ``window``, each finished by a replacement process and a
    replacement agent: the ledger holds exactly one settlement per operation, each under the
    operation's own nonce, and nothing else."""
    env = env_for(database_url, tmp_path, api, node)
    logs = tmp_path / "opgate.log"
    gate = await spawn_opgate(env, logs)
    operations: list[str] = []
    try:
        for _ in range(RUNS):
            operation_id = await approve(http, gate, api)
            operations.append(operation_id)
            victim = gate

            async def kill(victim: KillableOpgate = victim) -> None:
                await victim.kill()

            if window == "killed_on_arrival":
                # the paid request arrives and is never read: its authorization (valid 1 s)
                # must expire unused before reconciliation may release it
                api.max_timeout_seconds, api.crash_on_arrival = 1, kill
            elif window == "killed_after_settlement":
                api.crash_after_settlement = kill
            else:
                api.lose_answers = 1
            status, answered = await buy(http, gate, operation_id)
            api.max_timeout_seconds = 300
            if window == "lost":
                assert status == 502
            else:
                # killed mid-request (the agent's connection dropped as it died)
                assert (status, answered) == (0, {})
                assert await asyncio.wait_for(gate.process.wait(), 30) == -9
                gate = await spawn_opgate(env, logs)  # the replacement process
            view = await finish_as_a_replacement(http, gate, operation_id)
            assert view["operation"]["status"] == "confirmed", view
    finally:
        await gate.stop()
    paid = Counter("0x" + s.nonce.hex() for s in ledger.settlements)
    expected = {operation_nonce(operation_id): 1 for operation_id in operations}
    assert dict(paid) == expected
