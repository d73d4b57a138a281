"""Fail closed on the database: when the primary stops answering mid-run, mutating requests get
503 and nothing reaches the provider. The database really goes away: opgate's connections run
through a TCP relay that the test cuts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tests.support.fault_provider import FaultProvider
from tests.support.opgate import StartOpgate, fault_policy, problem
from tests.support.pg_relay import TcpRelay, dsn_through_relay, relay_target

GOOD_BODY = "amount=500&currency=usd&charge=ch_1"


@pytest_asyncio.fixture(loop_scope="session")
async def relay(database_url: str) -> AsyncIterator[tuple[TcpRelay, str]]:
    relay = TcpRelay()
    host, port = await relay.start(*relay_target(database_url))
    try:
        yield relay, dsn_through_relay(database_url, host, port)
    finally:
        await relay.stop()


async def test_database_gone_means_nothing_is_sent(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    relay: tuple[TcpRelay, str],
) -> None:
    """With the database unreachable, approved requests get 503 store_unavailable and the
    provider sees nothing; once it is back, the same request goes through exactly once."""
    cuttable, relayed_dsn = relay
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        database_url=relayed_dsn,
        upstream_overrides={"fault": fault_provider.url},
        pool_acquire_timeout_seconds=1.0,
    ) as gate:
        op = await gate.approve()
        headers = {"X-Operation-Id": op["operation_id"]}
        await cuttable.cut()
        for _ in range(3):  # pooled connections die first, then new ones are refused
            status, _, body = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=headers)
            assert (status, problem(body)["code"]) == (503, "store_unavailable")
        async with gate.http.get(f"{gate.ops_url}/readyz") as ready:
            assert ready.status == 503
        assert fault_provider.requests == []
        await cuttable.restore()
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=headers)
        assert status == 200
    assert len(fault_provider.effects) == 1
