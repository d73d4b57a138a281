"""Two opgate replicas (two ``python -m proxy serve`` processes on one PostgreSQL) racing for
the same x402 operation, in front of the SDK's resource server and exact facilitator over the
in-memory token: the same operation's request goes to both at once, round after round, whether
opgate pays or the agent does (the same PAYMENT-SIGNATURE, minted by the SDK's own client, to
both; or two the SDK minted, one to each). Exactly one settlement per operation in the
ledger; one authorization per operation reaches the paid API; the replica that lost gets the
stored outcome or a 409 (in flight, or the operation bound to another authorization), never a
payment of its own."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from proxy.x402.authorization import operation_nonce
from tests.support.killable_opgate import spawn_opgate
from tests.support.x402_chain_rpc import ChainRpc
from tests.support.x402_gate import WALLET
from tests.support.x402_ledger import Ledger
from tests.support.x402_processes import (
    AGENT_WALLET,
    agent_payments,
    approve,
    buy,
    env_for,
    nonce_of,
)
from tests.support.x402_server import PRICE, PaidApi

# per mode, each raced by the two replicas: 4 in CI; the figures in docs/x402.md are of
# OPGATE_X402_RUNS=3 (10 operations per mode)
OPERATIONS = 10 if int(os.environ.get("OPGATE_X402_RUNS", "1")) > 1 else 4


@pytest_asyncio.fixture(loop_scope="session")
async def ledger() -> Ledger:
    chain = Ledger(now=lambda: int(time.time()))
    chain.fund(WALLET.address, 100 * PRICE)
    chain.fund(AGENT_WALLET.address, 100 * PRICE)
    return chain


def lost_the_race(answer: tuple[int, dict[str, Any], dict[str, str]]) -> str:
    """How the replica that did not pay answered: the stored outcome, in flight, or (two
    authorizations) the operation bound to the other one."""
    status, body, headers = answer
    if status == 200:
        assert (body, headers["X-Operation-Status"]) == ({"report": "ok"}, "confirmed")
        return "stored_outcome"
    assert (status, body["code"]) in {
        (409, "operation_in_flight"),
        (422, "payment_authorization_mismatch"),
    }, answer
    return str(body["code"])


@pytest.mark.parametrize("payer", ["opgate", "agent", "agent_two_payments"])
async def test_two_replicas_racing_settle_each_operation_exactly_once(
    database_url: str,
    tmp_path: Path,
    api: PaidApi,
    ledger: Ledger,
    node: ChainRpc,
    http: aiohttp.ClientSession,
    payer: str,
) -> None:
    """OPERATIONS operations, each sent to both replicas at once: the ledger holds exactly one
    settlement per operation, under the operation's one nonce; the paid API saw one
    authorization per operation; one replica answered it paid, the other from the stored
    outcome or with a 409 (422 for another authorization)."""
    env = env_for(database_url, tmp_path, api, node, payer=payer.split("_")[0])
    first, second = await asyncio.gather(
        spawn_opgate(env, tmp_path / "replica-1.log"),
        spawn_opgate(env, tmp_path / "replica-2.log"),
    )
    nonces: dict[str, set[str]] = {}  # operation id -> the nonces it may be paid under
    losers: Counter[str] = Counter()
    try:
        for _ in range(OPERATIONS):
            operation_id = await approve(http, first, api)
            payments: list[str | None] = [None, None]
            if payer == "agent":  # the same authorization to both
                payments = [*await agent_payments(http, first, operation_id, 1)] * 2
            elif payer == "agent_two_payments":  # one to each
                payments = [*await agent_payments(http, first, operation_id, 2)]
            nonces[operation_id] = (
                {nonce_of(p) for p in payments if p is not None}
                if payer != "opgate"
                else {operation_nonce(operation_id)}
            )
            answers = await asyncio.gather(
                buy(http, first, operation_id, payments[0]),
                buy(http, second, operation_id, payments[1]),
            )
            paid = [a for a in answers if a[0] == 200 and "PAYMENT-RESPONSE" in a[2]]
            assert len(paid) == 1, answers
            losers[lost_the_race(answers[1 - answers.index(paid[0])])] += 1
    finally:
        await asyncio.gather(first.stop(), second.stop())
    settled = ["0x" + s.nonce.hex() for s in ledger.settlements]
    per_operation = Counter(op for op, its in nonces.items() for n in settled if n in its)
    assert per_operation == dict.fromkeys(nonces, 1)
    assert len(settled) == OPERATIONS  # and nothing else was settled
    # one authorization per operation reached the paid API: the loser's never did
    sent = {nonce_of(header) for header in api.payment_headers_seen}
    assert len(sent) == len(set(api.payment_headers_seen)) == OPERATIONS
    assert sent == set(settled)
    assert sum(losers.values()) == OPERATIONS
