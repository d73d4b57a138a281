"""The crash hand-off bed: a relay that holds the provider's answer, opgate's environment, and
the replacement agent that takes over."""

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
from aiohttp import web

from tests.support.opgate import ADMIN_TOKEN, AGENT_TOKEN, SHIPPED_POLICIES, process_env
from tests.support.paths import REPO


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
