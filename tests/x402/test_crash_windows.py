"""Crash windows of an x402 payment with real processes: opgate (``python -m proxy serve``)
SIGKILLed by the paid API (the SDK's resource server and exact facilitator over the in-memory
token) when the paid request arrives, before anything is verified, or once it has settled,
before the answer; or the answer lost with opgate alive. A replacement opgate process and a
replacement agent holding only the operation id then finish it (the agent's recovery read,
then the send it advises): exactly one settlement per operation in the ledger, every run.
One run per window by default; ``OPGATE_X402_RUNS=N`` runs N."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from pathlib import Path

import aiohttp
import asyncpg
import pytest
import pytest_asyncio

from proxy.x402.authorization import operation_nonce
from tests.support.killable_opgate import KillableOpgate, spawn_opgate
from tests.support.x402_chain_rpc import ChainRpc
from tests.support.x402_gate import WALLET
from tests.support.x402_ledger import Ledger
from tests.support.x402_processes import (
    AGENT_WALLET,
    agent_payments,
    approve,
    buy,
    env_for,
    finish_as_a_replacement,
    nonce_of,
)
from tests.support.x402_server import PRICE, PaidApi

# One run per window in CI; the figures in docs/x402.md are of OPGATE_X402_RUNS=3.
RUNS = int(os.environ.get("OPGATE_X402_RUNS", "1"))  # per window
KILLED_BEFORE_PAID_SEND = "tests.support.opgate_killed_before_paid_send"


@pytest_asyncio.fixture(loop_scope="session")
async def ledger() -> Ledger:
    chain = Ledger(now=lambda: int(time.time()))
    chain.fund(WALLET.address, 100 * PRICE)
    return chain


@pytest.mark.parametrize(
    "window",
    [
        "killed_on_arrival",
        "killed_after_settlement",
        "lost",
        "killed_after_settlement_kept_by_payment_id",
        "lost_kept_by_payment_id",
    ],
)
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
    operation's own nonce, and nothing else. ``..._kept_by_payment_id``: the paid API keeps
    its answers by the payment-identifier extension's id, and the operation is settled with
    its own answer, recovered by sending the kept payment again (x402_answer_recovered);
    otherwise a paid operation whose answer was lost is settled x402_paid_answer_lost."""
    env = env_for(database_url, tmp_path, api, node)
    api.payment_ids = window.endswith("_kept_by_payment_id")
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
            elif window.startswith("killed_after_settlement"):
                api.crash_after_settlement = kill
            else:
                api.lose_answers = 1
            status, answered, _ = await buy(http, gate, operation_id)
            api.max_timeout_seconds = 300
            if window.startswith("lost"):
                assert status == 502
            else:
                # killed mid-request (the agent's connection dropped as it died)
                assert (status, answered) == (0, {})
                assert await asyncio.wait_for(gate.process.wait(), 30) == -9
                gate = await spawn_opgate(env, logs)  # the replacement process
            view = await finish_as_a_replacement(http, gate, operation_id)
            assert view["operation"]["status"] == "confirmed", view
            if window != "killed_on_arrival":
                assert view["operation"]["settled_reason"] == (
                    "x402_answer_recovered" if api.payment_ids else "x402_paid_answer_lost"
                ), view
    finally:
        await gate.stop()
    paid = Counter("0x" + s.nonce.hex() for s in ledger.settlements)
    expected = {operation_nonce(operation_id): 1 for operation_id in operations}
    assert dict(paid) == expected


async def kept_header(database_url: str, operation_id: str) -> str | None:
    """The payment kept on the operation's row (None: none)."""
    conn = await asyncpg.connect(database_url)
    try:
        header: str | None = await conn.fetchval(
            "SELECT header FROM x402_payments WHERE operation_id = $1", operation_id
        )
        return header
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("payer", "window"),
    [
        ("opgate", "resent_as_stored"),
        ("agent", "resent_as_stored"),
        ("opgate", "released_after_expiry"),
    ],
)
async def test_killed_between_keeping_the_payment_and_sending_it(
    database_url: str,
    tmp_path: Path,
    api: PaidApi,
    ledger: Ledger,
    node: ChainRpc,
    http: aiohttp.ClientSession,
    payer: str,
    window: str,
) -> None:
    """RUNS operations, each with opgate SIGKILLed once the signed payment is committed to the
    operation's row and before the paid request leaves (the test-support entry point
    opgate_killed_before_paid_send), then finished by a replacement process and a replacement
    agent holding only the operation id: one settlement per operation in the ledger.
    ``resent_as_stored`` (a policy that lets opgate re-send an unknown outcome): the paid API
    receives the kept payment, byte for byte, and no other. ``released_after_expiry`` (the
    default policy): the kept authorization (valid 1 s) expires unused, reconciliation proves
    it unpaid and releases it, and the one new authorization has the operation's same nonce."""
    ledger.fund(AGENT_WALLET.address, 100 * PRICE)
    env = env_for(
        database_url, tmp_path, api, node, payer=payer, deduplicates=window == "resent_as_stored"
    )
    logs = tmp_path / "opgate.log"
    operations: list[str] = []
    kept: dict[str, str] = {}
    for _ in range(RUNS):
        gate = await spawn_opgate(env, logs, module=KILLED_BEFORE_PAID_SEND)
        try:
            operation_id = await approve(http, gate, api)
            operations.append(operation_id)
            payment = None
            if payer == "agent":
                [payment] = await agent_payments(http, gate, operation_id, 1)
            if window == "released_after_expiry":
                api.max_timeout_seconds = 1  # its authorization is valid for 1 s
            sent_before = len(api.payment_headers_seen)
            assert await buy(http, gate, operation_id, payment) == (0, {}, {})
            assert await asyncio.wait_for(gate.process.wait(), 30) == -9
        finally:
            await gate.kill()
        api.max_timeout_seconds = 300
        assert len(api.payment_headers_seen) == sent_before  # nothing left before the kill
        header = await kept_header(database_url, operation_id)
        assert header is not None  # kept before the kill
        assert payment is None or header == payment
        kept[operation_id] = header
        replacement = await spawn_opgate(env, logs)
        try:
            view = await finish_as_a_replacement(http, replacement, operation_id)
        finally:
            await replacement.stop()
        assert view["operation"]["status"] == "confirmed", view
    settled = Counter("0x" + s.nonce.hex() for s in ledger.settlements)
    nonces = {op: nonce_of(header) for op, header in kept.items()}
    assert settled == Counter(nonces.values())
    assert set(settled.values()) == {1}
    if payer == "opgate":
        assert nonces == {op: operation_nonce(op) for op in operations}
    if window == "resent_as_stored":  # the kept payment, as kept, and nothing else
        assert api.payment_headers_seen == [kept[op] for op in operations]
    else:  # one new authorization per operation, under the same nonce as the kept one
        assert len(api.payment_headers_seen) == RUNS
        assert [nonce_of(h) for h in api.payment_headers_seen] == [nonces[op] for op in operations]
        assert not set(api.payment_headers_seen) & set(kept.values())
