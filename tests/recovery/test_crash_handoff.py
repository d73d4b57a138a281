"""The crash handoff, end to end, with real processes: the official stripe SDK refunds through
opgate, opgate is SIGKILLed at a chosen moment, restarts, and a fresh agent process that knows
only the operation id follows the recovery protocol to the end. localstripe is the ground truth.

The moment is hit deterministically by a holding relay between opgate and localstripe: it
reports when the request has reached (or has been executed by) localstripe, and holds the
answer until the test has killed opgate.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import requests
import stripe

from tests.support.crash_handoff import HoldingRelay, approve, refund_approval, replacement_agent
from tests.support.killable_opgate import KillableOpgate, spawn_opgate
from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.opgate import AGENT_TOKEN


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
