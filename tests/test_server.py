"""``opgate serve`` as a process (proxy/server.py)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import pytest

from tests.support.fault_provider import FaultProvider
from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.opgate import (
    AGENT_TOKEN,
    SHIPPED_POLICIES,
    admin_headers,
    fault_policy,
    process_env,
)
from tests.support.opgate_process import opgate_process


async def test_what_started_is_kept_out_of_later_collections(
    database_url: str, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """Once serving, the objects made to start are frozen: later garbage collections do not
    walk them (a full collection walked ~130,000 of them, ~80 ms on this kind of machine)."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    environment = process_env(database_url, policy_dir, {"fault": fault_provider.url})
    async with opgate_process(environment) as gate:
        pass
    frozen = [line for line in gate.lines if line.get("event") == "opgate_startup_frozen"]
    assert len(frozen) == 1
    assert frozen[0]["objects"] > 10_000
    started = next(i for i, line in enumerate(gate.lines) if line.get("event") == "opgate_started")
    assert gate.lines.index(frozen[0]) > started  # after everything it starts with was made


async def test_the_suite_runs_on_the_event_loop_the_server_runs_on() -> None:
    """In-process tests (listeners, forward mode's tunnels, clients) run on the loop
    OPGATE_EVENT_LOOP names, asyncio when it names none (tests/conftest.py says why not the
    server's default, uvloop, which the processes the tests start run on)."""
    wanted = os.environ.get("OPGATE_EVENT_LOOP", "asyncio")
    module = type(asyncio.get_running_loop()).__module__.partition(".")[0]
    assert module == wanted


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
async def test_the_process_runs_on_the_loop_it_is_given_and_sends_an_operation_once(
    event_loop: str, database_url: str, localstripe_url: str
) -> None:
    """`opgate serve` starts on the named event loop (its start line says which), and on it an
    approved refund reaches localstripe exactly once and a repeat replays the stored answer."""
    charge = await create_charge(localstripe_url, 500)
    env = process_env(
        database_url,
        SHIPPED_POLICIES,
        {"stripe": localstripe_url},
        OPGATE_EVENT_LOOP=event_loop,
        OPGATE_BACKGROUND_INTERVAL_SECONDS="3600",
        OPGATE_POLICY_RELOAD_INTERVAL_SECONDS="0",
    )
    async with opgate_process(env) as gate, aiohttp.ClientSession(trust_env=False) as http:
        started = next(line for line in gate.lines if line.get("event") == "opgate_started")
        assert started["event_loop"] == event_loop
        approval = {
            "tenant": "t1",
            "provider": "stripe",
            "action": "refund.create",
            "amount": 200,
            "params": {"charge": charge},
            "approval_ref": f"loop-{event_loop}",
            "approved_by": "alice@example.com",
            "ttl_seconds": 600,
        }
        async with http.post(
            f"{gate.ops_url}/v1/operations", json=approval, headers=admin_headers()
        ) as r:
            assert r.status == 201, await r.text()
            operation_id = (await r.json())["operation_id"]
        answers = []
        for _ in range(2):
            async with http.post(
                f"{gate.agent_url}/stripe/v1/refunds",
                data=f"amount=200&charge={charge}",
                headers={
                    "Authorization": f"Bearer {AGENT_TOKEN}",
                    "Content-Type": "application/x-www-form-urlencoded",
                    "X-Operation-Id": operation_id,
                },
            ) as r:
                answers.append((r.status, r.headers.get("Idempotent-Replayed")))
    assert answers == [(200, None), (200, "true")]
    refunds = await list_refunds(localstripe_url, charge=charge)
    assert [refund["metadata"]["operation_id"] for refund in refunds] == [operation_id]
