"""Running wide and stopping gracefully: ``opgate serve --workers N`` and SIGTERM draining,
with real processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.killable_opgate import KillableOpgate, spawn_opgate
from tests.support.opgate import (
    ADMIN_TOKEN,
    AGENT_TOKEN,
    REFUND_APPROVAL,
    fault_policy,
    process_env,
)

GOOD_BODY = "amount=500&currency=usd&charge=ch_1"


@pytest.fixture
def env(database_url: str, tmp_path: Path, fault_provider: FaultProvider) -> dict[str, str]:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "fault.yaml").write_text(fault_policy(deduplicates=False, total_timeout=30))
    return process_env(
        database_url,
        policies,
        {"fault": fault_provider.url},
        OPGATE_BACKGROUND_INTERVAL_SECONDS="3600",
    )


async def approve(http: aiohttp.ClientSession, gate: KillableOpgate) -> dict[str, Any]:
    async with http.post(
        f"{gate.ops_url}/v1/operations",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        json=REFUND_APPROVAL,
    ) as response:
        assert response.status == 201
        payload: dict[str, Any] = await response.json()
        return payload


async def refund(gate: KillableOpgate, op: dict[str, Any]) -> tuple[int, str]:
    """One request on a connection of its own (so the kernel may hand it to any worker)."""
    async with (
        aiohttp.ClientSession(
            trust_env=False, connector=aiohttp.TCPConnector(force_close=True)
        ) as http,
        http.post(
            f"{gate.agent_url}/fault/v1/refunds",
            data=GOOD_BODY,
            headers={
                "Authorization": f"Bearer {AGENT_TOKEN}",
                "Content-Type": "application/x-www-form-urlencoded",
                "X-Operation-Id": op["operation_id"],
            },
        ) as response,
    ):
        return response.status, response.headers.get("X-Operation-Status", "")


async def row(http: aiohttp.ClientSession, gate_ops_url: str, operation_id: str) -> dict[str, Any]:
    async with http.get(
        f"{gate_ops_url}/v1/operations/{operation_id}",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        payload: dict[str, Any] = await response.json()
        return payload


def worker_pids(log: Path) -> list[int]:
    for line in log.read_text().splitlines():
        if '"workers_started"' in line:
            pids: list[int] = json.loads(line)["pids"]
            return pids
    return []


BATCHES_UNTIL_BOTH_CLAIM = 20


async def test_workers_share_the_ports_and_a_dead_worker_is_replaced(
    env: dict[str, str], tmp_path: Path, fault_provider: FaultProvider
) -> None:
    """Two workers serve the same ports (claims come from both), a SIGKILLed worker is
    replaced without the service going away, and SIGTERM stops them all cleanly."""
    log = tmp_path / "opgate.log"
    gate = await spawn_opgate({**env, "OPGATE_WORKERS": "2"}, log)
    fresh_connections = aiohttp.TCPConnector(force_close=True)  # a dead worker's keep-alive
    try:
        async with aiohttp.ClientSession(trust_env=False, connector=fresh_connections) as http:
            # The kernel does not promise to spread a given number of connections over two
            # accepting processes: send concurrent batches until both workers have claimed
            # one, bounded by a count.
            claimers: set[str] = set()
            sent = 0
            for _ in range(BATCHES_UNTIL_BOTH_CLAIM):
                ops = [await approve(http, gate) for _ in range(20)]
                results = await asyncio.gather(*(refund(gate, op) for op in ops))
                assert {status for status, _ in results} == {200}
                sent += len(ops)
                rows = [await row(http, gate.ops_url, op["operation_id"]) for op in ops]
                claimers |= {
                    event["actor"]
                    for r in rows
                    for event in r["events"]
                    if event["event"] == "claimed"
                }
                if len(claimers) == 2:
                    break
            assert len(claimers) == 2, claimers  # both workers claimed operations
            first, second = await asyncio.to_thread(worker_pids, log)
            os.kill(first, signal.SIGKILL)
            await wait_for_log(log, '"worker_replaced"')
            more = [await approve(http, gate) for _ in range(10)]
            statuses = {s for s, _ in await asyncio.gather(*(refund(gate, op) for op in more))}
            assert statuses == {200}
    finally:
        code = await gate.stop()
    assert code == 0
    assert len(fault_provider.effects) == sent + 10
    assert second > 0


async def test_sigterm_drains_in_flight_requests(
    env: dict[str, str], tmp_path: Path, fault_provider: FaultProvider
) -> None:
    """On SIGTERM opgate stops accepting, lets the request in flight finish (the row is
    confirmed and the agent gets its answer), then exits 0."""
    gate = await spawn_opgate(
        {**env, "OPGATE_WORKERS": "1", "OPGATE_DRAIN_SECONDS": "20"}, tmp_path / "opgate.log"
    )
    try:
        async with aiohttp.ClientSession(trust_env=False) as http:
            op = await approve(http, gate)
            fault_provider.mode = FaultMode.STALL_AFTER_COMMIT
            in_flight = asyncio.create_task(refund(gate, op))
            await fault_provider.in_flight.wait()
            gate.process.send_signal(signal.SIGTERM)
            await wait_refused(gate.agent_url)  # no longer accepting
            fault_provider.release()
            assert await in_flight == (200, "confirmed")
            code = await asyncio.wait_for(gate.process.wait(), 30)
    finally:
        await gate.kill()  # nothing left behind if an assertion failed
    assert code == 0
    assert len(fault_provider.effects) == 1


async def test_a_request_cut_off_at_the_drain_deadline_stays_dispatched(
    env: dict[str, str], tmp_path: Path, fault_provider: FaultProvider, database_url: str
) -> None:
    """A request still in flight at the deadline is cut off: the row stays dispatched
    (unknown), never failed, and the process exits."""
    gate = await spawn_opgate(
        {**env, "OPGATE_WORKERS": "1", "OPGATE_DRAIN_SECONDS": "0.5"}, tmp_path / "opgate.log"
    )
    try:
        async with aiohttp.ClientSession(trust_env=False) as http:
            op = await approve(http, gate)
            fault_provider.mode = FaultMode.STALL_AFTER_COMMIT
            in_flight = asyncio.create_task(refund(gate, op))
            await fault_provider.in_flight.wait()
            gate.process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(gate.process.wait(), 30)
            with pytest.raises(aiohttp.ClientError):
                await in_flight
    finally:
        await gate.kill()
    fault_provider.release()
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        status = await conn.fetchval(
            "SELECT status FROM operations WHERE operation_id = $1", op["operation_id"]
        )
    finally:
        await conn.close()
    assert status == "dispatched"
    assert len(fault_provider.effects) == 1


async def wait_for_log(log: Path, needle: str) -> None:
    """Bounded poll of a process's log for a line."""
    for _ in range(200):
        if needle in await asyncio.to_thread(log.read_text):
            return
        await asyncio.sleep(0.05)  # polling a condition with a bound
    raise AssertionError(f"{needle} never logged")


async def wait_refused(url: str) -> None:
    """Bounded poll until a new connection is refused. Each probe opens a connection of its
    own: a connection kept alive from an earlier probe is not a new one. A probe neither
    answered nor refused within a second is given up and the next one made. A probe that
    reached the listener as it closed used to be held unanswered for the whole drain
    (proxy/gate/shutdown.py), past the provider's timeout of the request in flight, which then
    ended unknown (504) instead of confirmed; should that come back, this test still tells
    the drain's own behaviour apart."""
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=1)
    async with aiohttp.ClientSession(trust_env=False, connector=connector) as http:
        for _ in range(200):
            try:
                async with http.get(f"{url}/_opgate/v1/operations", timeout=timeout):
                    pass
            except TimeoutError:
                continue
            except aiohttp.ClientConnectionError:
                return
            await asyncio.sleep(0.05)  # polling a condition with a bound
    raise AssertionError("opgate kept accepting after SIGTERM")


def requests_total(metrics_text: str) -> float:
    """The sum of every opgate_requests_total series in one scrape."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics_text.splitlines()
        if line.startswith("opgate_requests_total{")
    )


async def test_metrics_count_every_worker_whichever_answers_the_scrape(
    env: dict[str, str], tmp_path: Path, fault_provider: FaultProvider
) -> None:
    """With two workers, any scrape of /metrics counts the requests both served: twenty
    scrapes give one value (a counter that jumps between workers' values reads as resets)."""
    gate = await spawn_opgate({**env, "OPGATE_WORKERS": "2"}, tmp_path / "opgate.log")
    fresh_connections = aiohttp.TCPConnector(force_close=True)  # each scrape a new accept
    try:
        async with aiohttp.ClientSession(trust_env=False, connector=fresh_connections) as http:
            ops = [await approve(http, gate) for _ in range(30)]
            results = await asyncio.gather(*(refund(gate, op) for op in ops))
            assert {status for status, _ in results} == {200}

            async def scrape() -> float:
                async with http.get(f"{gate.ops_url}/metrics") as response:
                    return requests_total(await response.text())

            for _ in range(200):  # workers share their counts within a second; bounded
                if await scrape() == 30:
                    break
                await asyncio.sleep(0.05)  # polling interval of a bounded wait
            scrapes = [await scrape() for _ in range(20)]
    finally:
        code = await gate.stop()
    assert code == 0
    assert scrapes == [30.0] * 20
