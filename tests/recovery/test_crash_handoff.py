"""The crash handoff, end to end, with real processes: the official stripe SDK refunds through
opgate, opgate is SIGKILLed at a chosen moment, restarts, and a fresh agent process that knows
only the operation id follows the recovery protocol to the end. localstripe is the ground truth.

The moment is hit deterministically by a holding relay between opgate and localstripe: it
reports when the request has reached (or has been executed by) localstripe, and holds the
answer until the test has killed opgate.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import requests
import stripe
from aiohttp import web

from tests.support.killable_opgate import REPO, KillableOpgate, spawn_opgate
from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.opgate import ADMIN_TOKEN, AGENT_TOKEN, SHIPPED_POLICIES, process_env


@dataclass
class HoldingRelay:
    """Forwards to localstripe; for the held POST, either executes it and then withholds the
    answer (``after``) or withholds the request itself (``before``)."""

    target: str
    hold: str = "none"  # none | before | after
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    forwarded_posts: int = 0
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method == "POST" and self.hold == "before":
            self.hold = "none"
            self.reached.set()
            await self.release.wait()
            raise ConnectionResetError  # the request never reaches localstripe
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        async with (
            aiohttp.ClientSession(trust_env=False, auto_decompress=False) as http,
            http.request(
                request.method, self.target + request.path_qs, headers=headers, data=body
            ) as answer,
        ):
            payload = await answer.read()
            status, content_type = answer.status, answer.content_type
        if request.method == "POST":
            self.forwarded_posts += 1
            if self.hold == "after":
                self.hold = "none"
                self.reached.set()
                await self.release.wait()
                raise ConnectionResetError  # executed, but opgate never hears the answer
        return web.Response(status=status, body=payload, content_type=content_type)


@pytest_asyncio.fixture(loop_scope="session")
async def relay(localstripe_url: str) -> AsyncIterator[HoldingRelay]:
    holding = HoldingRelay(localstripe_url)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", holding.handle)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    holding.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield holding
    finally:
        holding.release.set()
        await runner.cleanup()


@pytest.fixture
def crash_policy_dir(tmp_path: Path) -> Path:
    """The shipped Stripe policy, adjusted to localstripe's truth (it does NOT deduplicate on
    idempotency keys) and to test time scales (short timeout and grace)."""
    text = (SHIPPED_POLICIES / "stripe.yaml").read_text()
    text = text.replace("provider_deduplicates: true", "provider_deduplicates: false")
    text = text.replace("total_seconds: 30", "total_seconds: 2")
    text = text.replace("grace_seconds: 60", "grace_seconds: 0.5")
    directory = tmp_path / "policies"
    directory.mkdir()
    (directory / "stripe.yaml").write_text(text)
    return directory


@pytest.fixture
def opgate_env(database_url: str, crash_policy_dir: Path, relay: HoldingRelay) -> dict[str, str]:
    return process_env(
        database_url,
        crash_policy_dir,
        {"stripe": relay.url},
        OPGATE_LEASE_MARGIN_SECONDS="0.5",
        OPGATE_BACKGROUND_INTERVAL_SECONDS="3600",
    )


async def approve(ops_url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(trust_env=False) as http,
        http.post(
            f"{ops_url}/v1/operations",
            json=body,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as response,
    ):
        payload: dict[str, Any] = await response.json(content_type=None)
        assert response.status == 201, payload
        return payload


def refund_approval(charge: str, **extra: Any) -> dict[str, Any]:
    return {
        "tenant": "t1",
        "provider": "stripe",
        "action": "refund.create",
        "amount": 500,
        "params": {"charge": charge},
        "approval_ref": "TICKET-9",
        "approved_by": "alice",
        "ttl_seconds": 600,
        **extra,
    }


def sdk_refund(agent_url: str, charge: str, key: str) -> None:
    """The first agent: an unmodified SDK call (it will never hear back)."""
    session = requests.Session()
    session.trust_env = False
    try:
        client = stripe.StripeClient(
            AGENT_TOKEN,
            base_addresses={"api": f"{agent_url}/stripe"},
            http_client=stripe.RequestsClient(session=session),
        )
        client.v1.refunds.create(
            params={"charge": charge, "amount": 500}, options={"idempotency_key": key}
        )
    finally:
        session.close()


async def replacement_agent(agent_url: str, operation_id: str) -> tuple[int, dict[str, Any]]:
    """A brand-new agent process that knows only the operation id."""
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
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    assert out, err.decode()
    view: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return process.returncode, view


async def crash_during_first_attempt(
    env: dict[str, str],
    relay: HoldingRelay,
    tmp_path: Path,
    charge: str,
    hold: str,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[dict[str, Any], KillableOpgate]:
    """Approve, start the SDK refund, SIGKILL opgate at the held moment, restart it."""
    monkeypatch.setattr(stripe, "enable_telemetry", False)
    first = await spawn_opgate(env, tmp_path / "opgate-1.log")
    try:
        op = await approve(first.ops_url, refund_approval(charge))
        relay.hold = hold
        agent = asyncio.create_task(
            asyncio.to_thread(sdk_refund, first.agent_url, charge, op["idempotency_key"])
        )
        await asyncio.wait_for(relay.reached.wait(), 30)
        await first.kill()
        with pytest.raises(stripe.APIConnectionError):
            await agent  # the first agent never learns what happened
    finally:
        await first.kill()
        relay.release.set()
    second = await spawn_opgate(env, tmp_path / "opgate-2.log")
    return op, second


async def test_killed_after_the_refund_the_replacement_confirms_it_without_a_second_refund(
    opgate_env: dict[str, str],
    relay: HoldingRelay,
    localstripe_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """opgate dies after localstripe refunded but before the outcome was recorded; the fresh
    agent is told to wait, then opgate reconciles, finds the refund, and the agent proceeds."""
    charge = await create_charge(localstripe_url, 2000)
    op, restarted = await crash_during_first_attempt(
        opgate_env, relay, tmp_path, charge, "after", monkeypatch
    )
    try:
        code, view = await replacement_agent(restarted.agent_url, op["operation_id"])
    finally:
        await restarted.stop()
    assert code == 0, view
    [refund] = await list_refunds(localstripe_url, charge=charge)
    assert refund["metadata"]["operation_id"] == op["operation_id"]
    assert view["operation"]["status"] == "confirmed"
    assert view["operation"]["provider_response"]["object_id"] == refund["id"]
    assert view["operation"]["settled_reason"] == "reconciled"
    assert relay.forwarded_posts == 1


async def test_killed_before_the_provider_saw_it_the_operation_is_superseded_and_completes(
    opgate_env: dict[str, str],
    relay: HoldingRelay,
    localstripe_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """opgate dies while the request is held before localstripe: reconciliation finds nothing,
    the row settles as no effect, a superseding approval is made and the replacement agent
    completes it. Exactly one refund exists."""
    charge = await create_charge(localstripe_url, 2000)
    op, restarted = await crash_during_first_attempt(
        opgate_env, relay, tmp_path, charge, "before", monkeypatch
    )
    try:
        code, view = await replacement_agent(restarted.agent_url, op["operation_id"])
        assert code == 3, view
        assert (view["operation"]["status"], view["operation"]["settled_reason"]) == (
            "failed",
            "no_effect",
        )
        assert await list_refunds(localstripe_url, charge=charge) == []
        # the approval service re-validates and approves a new operation that supersedes it
        successor = await approve(
            restarted.ops_url, refund_approval(charge, supersedes=op["operation_id"])
        )
        code, view = await replacement_agent(restarted.agent_url, successor["operation_id"])
    finally:
        await restarted.stop()
    assert code == 0, view
    [refund] = await list_refunds(localstripe_url, charge=charge)
    assert refund["metadata"]["operation_id"] == successor["operation_id"]
    assert view["operation"]["supersedes"] == op["operation_id"]
    assert view["operation"]["provider_response"]["object_id"] == refund["id"]
