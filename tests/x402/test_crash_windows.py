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

import aiohttp
import pytest
import pytest_asyncio

from proxy.x402.authorization import operation_nonce
from tests.support.killable_opgate import KillableOpgate, spawn_opgate
from tests.support.x402_chain_rpc import ChainRpc, chain_rpc
from tests.support.x402_gate import WALLET
from tests.support.x402_ledger import Ledger
from tests.support.x402_processes import approve, buy, env_for, finish_as_a_replacement
from tests.support.x402_server import PRICE, PaidApi, paid_api

RUNS = 3  # per window


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
            status, answered, _ = await buy(http, gate, operation_id)
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
