"""A promotion where nothing can have been lost stalls nothing (proxy/store/promotion.py): the
promoted standby was the synchronous standby every commit needed, so the operations approved
before the switch are sent on the new primary at once, not answered 409 reconcile_required
for grace_seconds + total_seconds; a crash and a planned switchover (the primary shut down
cleanly, then the standby promoted, as Patroni's switchover does) alike. Where the standby
was asynchronous, the switch still puts every unsettled operation in doubt.

Real processes: a PostgreSQL primary with a streaming standby on loopback
(tests/support/cluster.py), opgate given both hosts, a provider that does not deduplicate.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.cluster import Cluster, missing_reason, running_cluster
from tests.support.failover import approve, recovery_view, send_approved
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import fault_policy, process_env
from tests.support.opgate_process import OpgateProcess, opgate_process
from tests.support.polling import until

GRACE_SECONDS = 60  # a marked operation would wait this long (plus total_seconds) to be sent


@pytest.fixture
def patient_policies(tmp_path: Path) -> Path:
    directory = tmp_path / "policies"
    directory.mkdir()
    (directory / "fault.yaml").write_text(
        fault_policy(deduplicates=False, total_timeout=2, grace_seconds=GRACE_SECONDS)
    )
    return directory


async def _send_once_answered(
    http: aiohttp.ClientSession, gate: OpgateProcess, request: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """Sends until the store answers (503 store_unavailable, nothing sent, while the pool
    reconnects to the new primary); the first answer that is not that."""
    answered: list[tuple[int, dict[str, Any]]] = []

    async def answers() -> bool:
        status, body = await send_approved(http, gate.agent_url, request)
        if (status, body.get("code")) == (503, "store_unavailable"):
            return False
        answered.append((status, body))
        return True

    await until(answers, "the promoted standby answers a send", 30)
    return answered[0]


async def _approved_then_switched(
    cluster: Cluster,
    gate: OpgateProcess,
    http: aiohttp.ClientSession,
    switch: str,
) -> list[dict[str, Any]]:
    """Three approvals, the first sent before the switch; the recovery reads (requests) of
    the two left, to be sent after it."""
    operations = [await approve(http, gate.ops_url, i) for i in range(3)]
    requests = []
    for operation_id in operations:
        _, view = await recovery_view(http, gate.agent_url, operation_id)
        requests.append(view["request"])
    status, _ = await send_approved(http, gate.agent_url, requests[0])
    assert status == 200
    if switch == "switchover":
        await asyncio.to_thread(cluster.primary.stop, "fast")
    else:
        await asyncio.to_thread(cluster.kill_primary)
    await asyncio.to_thread(cluster.promote)
    return requests[1:]


@pytest.mark.parametrize("switch", ["crash", "switchover"])
async def test_a_synchronous_promotion_stalls_no_send(
    switch: str,
    patient_policies: Path,
    fault_provider: FaultProvider,
    http: aiohttp.ClientSession,
) -> None:
    """The synchronous standby promoted (after a crash, or a clean shutdown): operations
    approved before are sent at once, exactly once, and the switch is logged as proven."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with running_cluster(sync=True) as cluster:
        dsn = await cluster.create_database("opgate")
        env = process_env(dsn, patient_policies, {"fault": fault_provider.url})
        async with opgate_process(env) as gate:
            left = await _approved_then_switched(cluster, gate, http, switch)
            answers = [await _send_once_answered(http, gate, request) for request in left]
            switched = [line for line in gate.lines if line.get("event") == "timeline_switched"]
    assert [status for status, _ in answers] == [200, 200], answers
    effects = [e.operation_id for e in fault_provider.effects]
    assert len(effects) == len(set(effects)) == 3
    assert [(s["operations_in_doubt"], s["nothing_lost"]) for s in switched] == [(0, True)]
    assert "'opgate_standby'" in switched[0]["proof"]


async def test_an_asynchronous_promotion_still_marks(
    patient_policies: Path, fault_provider: FaultProvider, http: aiohttp.ClientSession
) -> None:
    """An accepted asynchronous standby promoted: what was unsettled is in doubt (409
    reconcile_required until the lookup's grace is over), nothing sent unasked."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with running_cluster(sync=False) as cluster:
        dsn = await cluster.create_database("opgate")
        env = process_env(
            dsn,
            patient_policies,
            {"fault": fault_provider.url},
            OPGATE_ACCEPT_ASYNC_REPLICATION="true",
        )
        async with opgate_process(env) as gate:
            left = await _approved_then_switched(cluster, gate, http, "crash")
            answers = [await _send_once_answered(http, gate, request) for request in left]
            switched = [line for line in gate.lines if line.get("event") == "timeline_switched"]
    assert [(status, body.get("code")) for status, body in answers] == [
        (409, "reconcile_required")
    ] * 2, answers
    assert len(fault_provider.effects) == 1
    assert [(s["operations_in_doubt"], s["nothing_lost"]) for s in switched] == [(2, False)]
    assert "asynchronous replication accepted" in switched[0]["proof"]
