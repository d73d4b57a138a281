"""The gate after a timeline switch of its database (the timeline rule): a row that
existed before the switch is looked up at the provider before its next send, found -> replayed
``reconciled``, absent -> sent; a rule without lookups escalates it instead of sending it.

A lost claim is a row put back exactly as it was before its claim. The first two tests make
one on the suite's server (the row rewritten to ``created`` after a real send) and the switch by
the recorded history (tests/store/test_timelines.py); the last switches for real, on a promoted
standby."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support.cluster import missing_reason, running_cluster
from tests.support.fault_provider import FaultProvider
from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.opgate import (
    SHIPPED_POLICIES,
    Opgate,
    StartOpgate,
    admin_headers,
    fault_policy,
    problem,
)
from tests.support.pipeline import GOOD_BODY, op_header
from tests.support.preconditions import age_approval
from tests.support.timelines import pretend_the_last_timeline_was_lower

REFUND = "/fault/v1/refunds"


async def _lose_the_claim(database_url: str, operation_id: str) -> None:
    """What a failover on asynchronous replication leaves of a claim that had not reached the
    standby: the row exactly as before it."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE operations SET status = 'created', attempts = 0, dispatched_at = NULL,"
            " lease_owner = NULL, lease_until = NULL, last_outcome = NULL,"
            " provider_status = NULL, provider_object_id = NULL, response_body = NULL,"
            " response_content_type = NULL, settled_at = NULL, settled_reason = NULL,"
            " attempt_ended_at = NULL WHERE operation_id = $1",
            operation_id,
        )
    finally:
        await conn.close()


async def _send_until_settled(
    gate: Opgate, op: dict[str, Any]
) -> tuple[int, dict[str, str], bytes]:
    """The agent's re-send, repeated while opgate says the lookup is not due yet (409 with
    Retry-After: the grace since the switch), as the recovery protocol does."""
    for _ in range(50):
        status, headers, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        if status != 409 or problem(body)["code"] != "reconcile_required":
            return status, headers, body
        await asyncio.sleep(0.1)  # the Retry-After the agent is told, shortened: bounded
    raise AssertionError(f"still told to wait: {body!r}")


async def test_a_lost_claim_is_found_by_the_lookup_and_replayed(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, database_url: str
) -> None:
    """The provider has the effect of a row the switch put back to created: the send is
    answered from the provider's record, not sent again."""
    (policy_dir / "fault.yaml").write_text(
        fault_policy(deduplicates=True, grace_seconds=0, total_timeout=0.3)
    )
    overrides = {"upstream_overrides": {"fault": fault_provider.url}}
    async with start_opgate(**overrides) as gate:
        op = await gate.approve()
        status, _, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        assert status == 200
    await _lose_the_claim(database_url, op["operation_id"])
    await pretend_the_last_timeline_was_lower(database_url)
    async with start_opgate(**overrides) as gate:  # new connections: they see the switch
        status, headers, body = await _send_until_settled(gate, op)
        row = await gate.operation(op["operation_id"])
    assert status == 200, body
    assert headers["Idempotent-Replayed"] == "true"
    assert json.loads(body)["id"] == fault_provider.effects[0].id
    assert len(fault_provider.effects) == 1
    assert (row["status"], row["settled_reason"], row["attempts"]) == ("confirmed", "reconciled", 0)
    assert [e["event"] for e in row["events"]][-2:] == ["timeline_switched", "reconciled"]


async def test_an_operation_the_provider_does_not_have_is_sent_after_the_lookup(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, database_url: str
) -> None:
    """Approved before the switch and never sent: the provider's complete list shows nothing
    once the grace since the switch has passed, and the request goes, once."""
    (policy_dir / "fault.yaml").write_text(
        fault_policy(deduplicates=False, grace_seconds=0, total_timeout=0.3)
    )
    overrides = {"upstream_overrides": {"fault": fault_provider.url}}
    async with start_opgate(**overrides) as gate:
        op = await gate.approve()
        fresh_before = await gate.approve(params={"charge": "ch_2"})
    await pretend_the_last_timeline_was_lower(database_url)
    async with start_opgate(**overrides) as gate:
        fresh = await gate.approve(params={"charge": "ch_1"}, approval_ref="after")
        status, _, body = await _send_until_settled(gate, op)
        row = await gate.operation(op["operation_id"])
        # created after the switch: a first send, asked about nothing
        lookups_before = sum(r.method == "GET" for r in fault_provider.requests)
        sent, _, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(fresh))
        lookups_after = sum(r.method == "GET" for r in fault_provider.requests)
        untouched = await gate.operation(fresh_before["operation_id"])
    assert status == 200, body
    assert (row["status"], row["attempts"]) == ("confirmed", 1)
    events = [e["event"] for e in row["events"]]
    assert events[:2] == ["created", "timeline_switched"]
    assert events[-2:] == ["claimed", "confirmed"]
    claimed = next(e for e in row["events"] if e["event"] == "claimed")
    assert "after_lookup" in claimed["detail"]
    assert sent == 200
    assert lookups_after == lookups_before
    assert len(fault_provider.effects) == 2
    assert untouched["status"] == "created"  # in doubt, and still unsent: nothing asked it


async def test_a_rule_without_lookups_escalates_after_a_real_failover(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """A promoted asynchronous standby (accepted): the operation approved before it may have
    been sent, nothing can ask the provider, so its send is refused and it is escalated to a
    human, even though the policy says the provider deduplicates; nothing reaches the
    provider. (A synchronous standby that every commit needed marks nothing:
    tests/faults/test_failover_no_stall.py.)"""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=True))
    with running_cluster(sync=False) as cluster:
        dsn = await cluster.create_database()
        overrides = {
            "upstream_overrides": {"fault": fault_provider.url},
            "database_url": dsn,
            "accept_async_replication": True,
        }
        async with start_opgate(**overrides) as gate:
            op = await gate.approve()
            await asyncio.to_thread(cluster.kill_primary)
            await asyncio.to_thread(cluster.promote)
            for _ in range(100):  # the pool's dead connections answer 503 until replaced
                status, _, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
                if status != 503:
                    break
            again, _, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
            row = await gate.operation(op["operation_id"])
            async with gate.http.get(
                f"{gate.ops_url}/v1/escalations", headers=admin_headers()
            ) as answer:
                queue = (await answer.json())["escalations"]
    assert status == 409, body
    assert problem(body)["code"] == "operation_escalated"
    assert "lost timeline" in problem(body)["detail"]
    assert again == 409
    assert fault_provider.requests == []
    assert row["status"] == "created"
    assert row["escalation"] is not None
    assert [e["event"] for e in row["events"]][-2:] == ["timeline_switched", "escalated"]
    assert [v["operation"]["operation_id"] for v in queue] == [op["operation_id"]]


async def test_an_old_approval_in_doubt_is_sent_after_its_preconditions_and_its_lookup(
    start_opgate: StartOpgate, tmp_path: Path, localstripe_url: str, database_url: str
) -> None:
    """A Stripe refund approved long before the switch: the preconditions' lookup (the charge
    still refundable) and the lookup for a lost claim both precede the one send; the claim
    needs the row unchanged since the first, through the second's lease."""
    text = (SHIPPED_POLICIES / "stripe.yaml").read_text()
    text = text.replace("total_seconds: 30", "total_seconds: 0.3")
    text = text.replace("grace_seconds: 60", "grace_seconds: 0")
    policies = tmp_path / "stripe-policies"
    policies.mkdir()
    (policies / "stripe.yaml").write_text(text)
    charge = await create_charge(localstripe_url, 2000)
    overrides = {"policy_dir": policies, "upstream_overrides": {"stripe": localstripe_url}}
    async with start_opgate(**overrides) as gate:
        op = await gate.approve(
            provider="stripe", action="refund.create", amount=500, currency=None,
            params={"charge": charge},
        )  # fmt: skip
    await age_approval(database_url, op["operation_id"], 10)
    await pretend_the_last_timeline_was_lower(database_url)
    async with start_opgate(**overrides) as gate:
        for _ in range(50):
            status, _, body = await gate.send(
                "/stripe/v1/refunds",
                data=f"charge={charge}&amount=500",
                headers=op_header(op),
            )
            # refusals come in Stripe's error shape (errors: stripe)
            if status != 409 or json.loads(body)["error"]["code"] != "reconcile_required":
                break
            await asyncio.sleep(0.1)  # the Retry-After the agent is told, shortened: bounded
        row = await gate.operation(op["operation_id"])
    assert status == 200, body
    assert len(await list_refunds(localstripe_url, charge=charge)) == 1
    claimed = next(e for e in row["events"] if e["event"] == "claimed")
    assert "after_lookup" in claimed["detail"]
