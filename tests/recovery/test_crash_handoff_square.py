"""The crash handoff for a provider that is not Stripe, end to end with real processes: the
official squareup SDK pays through opgate (the key in the body), opgate is SIGKILLed after the
fake Square committed the payment, restarts, and a fresh agent process that knows only the
operation id follows the recovery protocol: opgate finds the payment by its reference_id in
ListPayments and confirms it. Exactly one payment exists."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from aiohttp import web
from square import Square

from tests.support.crash_handoff import HoldingRelay, approve, replacement_agent
from tests.support.fake_square import SQUARE_TOKEN, FakeSquare, running_fake_square
from tests.support.killable_opgate import spawn_opgate
from tests.support.opgate import AGENT_TOKEN, SHIPPED_POLICIES, process_env


@pytest_asyncio.fixture(loop_scope="session")
async def square() -> AsyncIterator[FakeSquare]:
    async with running_fake_square() as fake:
        yield fake


@pytest_asyncio.fixture(loop_scope="session")
async def square_relay(square: FakeSquare) -> AsyncIterator[HoldingRelay]:
    holding = HoldingRelay(square.url)
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
def square_env(database_url: str, tmp_path: Path, square_relay: HoldingRelay) -> dict[str, str]:
    """The shipped Square policy at test time scales (short timeout, short grace)."""
    text = (SHIPPED_POLICIES / "square.yaml").read_text()
    text = text.replace("errors: square\n", "errors: square\ntimeouts: {total_seconds: 2}\n")
    text = text.replace("      lookups:\n", "      grace_seconds: 0.5\n      lookups:\n", 1)
    directory = tmp_path / "policies"
    directory.mkdir()
    (directory / "square.yaml").write_text(text)
    return process_env(
        database_url,
        directory,
        {"square": square_relay.url},
        OPGATE_SECRET_SQUARE_ACCESS_TOKEN=SQUARE_TOKEN,
        OPGATE_LEASE_MARGIN_SECONDS="0.5",
        OPGATE_BACKGROUND_INTERVAL_SECONDS="3600",
    )


def sdk_payment(agent_url: str, key: str) -> Any:
    """The first agent: an unmodified SDK CreatePayment (it will never hear back)."""
    with httpx.Client(trust_env=False, timeout=30) as http:
        client = Square(token=AGENT_TOKEN, base_url=f"{agent_url}/square", httpx_client=http)
        return client.payments.create(
            source_id="cnon:card-nonce-ok",
            idempotency_key=key,
            amount_money={"amount": 1099, "currency": "USD"},
            request_options={"max_retries": 0},
        )


async def test_killed_after_square_charged_the_replacement_confirms_it_without_a_second_payment(
    square_env: dict[str, str], square_relay: HoldingRelay, square: FakeSquare, tmp_path: Path
) -> None:
    """opgate dies after Square committed the payment but before the outcome was recorded; the
    restarted opgate finds it by reference_id and the fresh agent is told to proceed."""
    first = await spawn_opgate(square_env, tmp_path / "opgate-1.log")
    try:
        op = await approve(
            first.ops_url,
            {
                "tenant": "t1",
                "provider": "square",
                "action": "payment.create",
                "amount": 1099,
                "currency": "USD",
                "params": {"/source_id": "cnon:card-nonce-ok"},
                "approval_ref": "TICKET-11",
                "approved_by": "alice",
                "ttl_seconds": 600,
            },
        )
        square_relay.hold = "after"
        agent = asyncio.create_task(
            asyncio.to_thread(sdk_payment, first.agent_url, op["idempotency_key"])
        )
        await asyncio.wait_for(square_relay.reached.wait(), 30)
        await first.kill()
        with pytest.raises(httpx.HTTPError):
            await agent  # the first agent never learns what happened
    finally:
        await first.kill()
        square_relay.release.set()
    restarted = await spawn_opgate(square_env, tmp_path / "opgate-2.log")
    try:
        code, view = await replacement_agent(restarted.agent_url, op["operation_id"])
    finally:
        await restarted.stop()
    assert code == 0, view
    [payment] = square.payments_committed()
    assert payment["reference_id"] == op["operation_id"]
    assert view["operation"]["status"] == "confirmed"
    assert view["operation"]["provider_response"]["object_id"] == payment["id"]
    assert view["operation"]["settled_reason"] == "reconciled"
    assert square_relay.forwarded_posts == 1
