"""The recovery protocol through MCP alone: a replacement agent that has only the tools
reaches every branch of next_action (send, proceed, wait, retry, reconcile,
new_approval_required, escalated) and follows it, against the fault provider."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.mcp_client import http_client, refused_code, structured
from tests.support.mcp_recovery_agent import follow_next_action
from tests.support.opgate import AGENT_TOKEN, Opgate, StartOpgate, fault_policy
from tests.support.polling import until


async def test_send_then_proceed(fault_gate: Opgate, fault_provider: FaultProvider) -> None:
    """A fresh operation says send; executing it settles it, and the agent proceeds."""
    op = await fault_gate.approve()
    async with http_client(fault_gate.agent_url, AGENT_TOKEN) as client:
        steps, view = await follow_next_action(client, op["operation_id"])
    assert steps == ["send", "proceed"]
    assert view["operation"]["provider_response"]["object_id"] == fault_provider.effects[0].id
    assert len(fault_provider.effects) == 1


async def test_wait_while_an_attempt_is_in_flight(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """While the first execution is held at the provider, a second agent is told to wait
    (with a time to ask again) and refused as in flight; once it answers, proceed."""
    op = await fault_gate.approve()
    operation_id = op["operation_id"]
    fault_provider.mode = FaultMode.STALL_AFTER_COMMIT
    async with (
        http_client(fault_gate.agent_url, AGENT_TOKEN) as first,
        http_client(fault_gate.agent_url, AGENT_TOKEN) as second,
    ):
        held = asyncio.create_task(
            first.call_tool("execute_operation", {"operation_id": operation_id})
        )

        async def stalled() -> bool:
            return fault_provider.stalled == 1

        await until(stalled, "stalled", seconds=20)
        waiting = structured(
            await second.call_tool("get_operation", {"operation_id": operation_id})
        )
        in_flight = await second.call_tool("execute_operation", {"operation_id": operation_id})
        fault_provider.release()
        answered = await held
        steps, _ = await follow_next_action(second, operation_id)
    assert waiting["next_action"] == "wait"
    assert waiting["retry_after_seconds"] >= 1
    assert refused_code(in_flight) == "operation_in_flight"
    assert structured(answered)["next_action"] == "proceed"
    assert steps == ["proceed"]
    assert len(fault_provider.effects) == 1


async def test_retry_after_an_unknown_outcome_at_a_deduplicating_provider(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """A 5xx after the provider committed leaves the outcome unknown; the provider
    deduplicates the key, so the agent is told retry, and the re-send returns the same effect."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=True))
    fault_provider.deduplicate = True
    fault_provider.script(FaultMode.ERROR_AFTER_COMMIT)
    async with (
        start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate,
        http_client(gate.agent_url, AGENT_TOKEN) as client,
    ):
        op = await gate.approve()
        unknown = await client.call_tool("execute_operation", {"operation_id": op["operation_id"]})
        steps, view = await follow_next_action(client, op["operation_id"])
    assert refused_code(unknown) == "outcome_unknown"
    assert structured(unknown)["recovery"]["next_action"] == "retry"
    assert steps == ["retry", "proceed"]
    assert len(fault_provider.effects) == 1
    assert view["operation"]["provider_response"]["object_id"] == fault_provider.effects[0].id


async def test_reconcile_until_the_provider_shows_the_effect(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """At a provider that does not deduplicate, an unknown outcome says reconcile: opgate
    looks the effect up when the agent reads (a failed lookup says ask again later), finds
    it, and the agent proceeds without a second effect."""
    (policy_dir / "fault.yaml").write_text(
        fault_policy(deduplicates=False, grace_seconds=0, max_attempts=5, retry_seconds=0.05)
    )
    # the POST commits and answers 500; the first lookup fails too; later ones answer
    fault_provider.script(FaultMode.ERROR_AFTER_COMMIT, FaultMode.ERROR_AFTER_COMMIT)
    async with (
        start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate,
        http_client(gate.agent_url, AGENT_TOKEN) as client,
    ):
        op = await gate.approve()
        unknown = await client.call_tool("execute_operation", {"operation_id": op["operation_id"]})
        steps, view = await follow_next_action(client, op["operation_id"])
    assert structured(unknown)["recovery"]["next_action"] == "reconcile"
    assert steps == ["reconcile", "proceed"]
    assert view["operation"]["settled_reason"] == "reconciled"
    assert len(fault_provider.effects) == 1
    assert [r.method for r in fault_provider.requests].count("POST") == 1


async def test_new_approval_required_after_the_provider_refused(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """A provider refusal (402) settles the operation as failed: the answer carries it,
    next_action is new_approval_required, and executing again is refused as failed."""
    op = await fault_gate.approve()
    fault_provider.mode = FaultMode.FAIL
    async with http_client(fault_gate.agent_url, AGENT_TOKEN) as client:
        refused = await client.call_tool("execute_operation", {"operation_id": op["operation_id"]})
        steps, view = await follow_next_action(client, op["operation_id"])
        again = await client.call_tool("execute_operation", {"operation_id": op["operation_id"]})
    answer = structured(refused)
    assert refused.is_error
    assert answer["provider_response"]["status"] == 402
    assert (answer["operation"]["status"], answer["next_action"]) == (
        "failed",
        "new_approval_required",
    )
    assert steps == ["new_approval_required"]
    assert view["operation"]["status"] == "failed"
    assert refused_code(again) == "operation_failed"
    assert fault_provider.effects == []


async def test_escalated_when_the_provider_cannot_be_asked(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """Every lookup fails: the background loop escalates the operation to a human, the agent
    following next_action stops at escalated, and executing it is refused as escalated."""
    (policy_dir / "fault.yaml").write_text(
        fault_policy(deduplicates=False, grace_seconds=0, max_attempts=1, retry_seconds=0.05)
    )
    fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT  # the POST and every lookup: 500
    async with (
        start_opgate(
            upstream_overrides={"fault": fault_provider.url}, background_interval_seconds=0.05
        ) as gate,
        http_client(gate.agent_url, AGENT_TOKEN) as client,
    ):
        op = await gate.approve()
        await client.call_tool("execute_operation", {"operation_id": op["operation_id"]})
        steps, view = await follow_next_action(client, op["operation_id"])
        refused = await client.call_tool("execute_operation", {"operation_id": op["operation_id"]})
    assert steps[-1] == "escalated"
    assert set(steps) <= {"reconcile", "wait", "escalated"}
    assert view["operation"]["escalation"] is not None
    assert refused_code(refused) == "operation_escalated"
    assert [r.method for r in fault_provider.requests].count("POST") == 1
