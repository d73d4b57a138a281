"""Spend budgets through the real pipeline, PostgreSQL and the fault provider: what counts
against a budget, the window, shadow mode, scopes, and the remaining budget as shown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
from structlog.testing import capture_logs

from tests.support.budgets import budgeted, budgets, send, tenant_budget
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.opgate import (
    OTHER_TENANT_TOKEN,
    Opgate,
    StartOpgate,
    admin_headers,
    fault_policy,
    problem,
)


async def create(gate: Opgate, **fields: Any) -> tuple[int, dict[str, Any]]:
    body = {
        "tenant": "t1",
        "provider": "fault",
        "action": "refund.create",
        "amount": 500,
        "currency": "usd",
        "params": {"charge": "ch_1"},
        "approval_ref": "ticket-1",
        "approved_by": "alice@example.com",
        "ttl_seconds": 600,
        **fields,
    }
    async with gate.http.post(
        f"{gate.ops_url}/v1/operations", json=body, headers=admin_headers()
    ) as response:
        payload: dict[str, Any] = await response.json(content_type=None)
        return response.status, payload


async def test_a_claim_over_the_budget_is_refused_with_what_remains(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """With 1200 to spend, two refunds of 500 leave and the third is refused 403
    budget_exceeded carrying the 200 that remain; the provider sees two requests, and a new
    approval of 500 is refused early with the same remaining budget."""
    budgeted(policy_dir, tenant_budget(1200))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        ops = [await gate.approve() for _ in range(3)]
        answers = [await send(gate, op) for op in ops]
        early, refused = await create(gate)
        shown = await budgets(gate)
    assert [status for status, _ in answers] == [200, 200, 403]
    body = problem(answers[2][1])
    assert body["code"] == "budget_exceeded"
    assert (body["budget"]["remaining"], body["budget"]["spent"], body["budget"]["amount"]) == (
        200,
        1000,
        500,
    )
    assert len(fault_provider.requests) == 2
    assert (early, refused["code"], refused["budget"]["remaining"]) == (403, "budget_exceeded", 200)
    assert [(b["scope"], b["tenant"], b["spent"], b["remaining"]) for b in shown] == [
        ("tenant", "t1", 1000, 200)
    ]


async def test_a_failed_operation_gives_its_amount_back(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """A refund the provider declined (failed, no effect) does not count: the next one of the
    same amount fits a budget that holds only one."""
    budgeted(policy_dir, tenant_budget(500))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        declined, next_one = await gate.approve(), await gate.approve()
        fault_provider.script(FaultMode.FAIL)
        first, _ = await send(gate, declined)
        second, _ = await send(gate, next_one)
    assert (first, second) == (402, 200)
    assert len(fault_provider.effects) == 1


async def test_an_unknown_outcome_counts_until_settled(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """A refund whose outcome is unknown (the provider answered 500 after committing) may have
    moved the money: it keeps its amount, and the next refund is refused; once a human settles
    it as failed, the amount is free again."""
    budgeted(policy_dir, tenant_budget(500))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        unknown, blocked = await gate.approve(), await gate.approve()
        fault_provider.script(FaultMode.ERROR_AFTER_COMMIT)
        first, _ = await send(gate, unknown)
        second, body = await send(gate, blocked)
        verdict = {"verdict": "failed", "note": "no refund in the dashboard", "decided_by": "bob"}
        async with gate.http.post(
            f"{gate.ops_url}/v1/operations/{unknown['operation_id']}/resolve",
            json=verdict,
            headers=admin_headers(),
        ) as r:
            assert r.status == 200
        third, _ = await send(gate, blocked)
    assert (first, second, problem(body)["code"], third) == (502, 403, "budget_exceeded", 200)


async def test_a_resend_does_not_count_its_own_amount_twice(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """On a deduplicating provider, a re-send of a refund whose outcome is unknown is claimed
    again within a budget that holds exactly that one refund."""
    budgeted(policy_dir, tenant_budget(500), deduplicates=True)
    fault_provider.deduplicate = True
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve(ttl_seconds=600)
        fault_provider.script(FaultMode.ERROR_AFTER_COMMIT)
        first, _ = await send(gate, op)
        again, _ = await send(gate, op)
        row = await gate.operation(op["operation_id"])
    assert (first, again) == (502, 200)
    assert (row["status"], row["attempts"]) == ("confirmed", 2)
    assert len(fault_provider.effects) == 1


async def test_the_window_is_rolling_and_strict_at_its_edge(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, database_url: str
) -> None:
    """An operation claimed just over an hour ago no longer counts against a 1h budget; one
    claimed just under an hour ago still does."""
    budgeted(policy_dir, tenant_budget(500, window="1h"))
    conn = await asyncpg.connect(database_url)
    try:
        async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
            ops = [await gate.approve() for _ in range(3)]
            assert (await send(gate, ops[0]))[0] == 200
            await conn.execute(
                "UPDATE operations SET dispatched_at = now() - interval '3601 seconds'"
                " WHERE operation_id = $1",
                ops[0]["operation_id"],
            )
            assert (await send(gate, ops[1]))[0] == 200
            await conn.execute(
                "UPDATE operations SET dispatched_at = now() - interval '3599 seconds'"
                " WHERE operation_id = $1",
                ops[1]["operation_id"],
            )
            status, body = await send(gate, ops[2])
    finally:
        await conn.close()
    assert (status, problem(body)["code"]) == (403, "budget_exceeded")


async def test_report_mode_sends_and_audits_would_deny(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """A budget in report mode lets the claim over it through; its audit record says allow,
    would_deny budget_exceeded, and the provider gets both refunds."""
    budgeted(policy_dir, tenant_budget(500, mode="report"))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        first, second = await gate.approve(), await gate.approve()
        with capture_logs() as logs:
            statuses = [(await send(gate, first))[0], (await send(gate, second))[0]]
    records = [entry for entry in logs if entry["event"] == "request"]
    assert statuses == [200, 200]
    assert [r.get("would_deny") for r in records] == [None, "budget_exceeded"]
    assert [r["decision"] for r in records] == ["allow", "allow"]
    assert len(fault_provider.effects) == 2


async def test_provider_shadow_mode_reports_an_enforced_budget(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """A provider in shadow mode (mode: report) reports an enforcing budget as would_deny
    instead of refusing, at the claim and at approval time."""
    budgeted(policy_dir, tenant_budget(500), mode="report")
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        first, second = await gate.approve(), await gate.approve()
        with capture_logs() as logs:
            statuses = [(await send(gate, first))[0], (await send(gate, second))[0]]
        late, _ = await create(gate)
    records = [entry for entry in logs if entry["event"] == "request"]
    assert (statuses, late) == ([200, 200], 201)
    assert records[1]["would_deny"] == "budget_exceeded"


async def test_tenant_budgets_are_separate_and_a_provider_budget_is_shared(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """Each tenant has the whole of a tenant budget, while a provider budget is one cap over
    every tenant: t1 and t2 each send 500 of a 500 tenant budget, and the provider budget of
    1000 then refuses a third tenant-t1 operation of the 1500 that would make."""
    budgets_text = (
        "budgets:\n  - {scope: tenant, currency: usd, limit: 500, window: 24h}\n"
        "  - {scope: provider, currency: usd, limit: 1000, window: 24h}"
    )
    budgeted(policy_dir, budgets_text)
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        t1, t2 = await gate.approve(), await gate.approve(tenant="t2")
        one = (await send(gate, t1))[0]
        two = (await send(gate, t2, OTHER_TENANT_TOKEN))[0]
        third, body = await create(gate, tenant="t3")
        shown = await budgets(gate)
    assert (one, two) == (200, 200)
    assert (third, body["budget"]["scope"], body["budget"]["remaining"]) == (403, "provider", 0)
    assert sorted((b["scope"], b["tenant"], b["spent"]) for b in shown) == [
        ("provider", None, 1000),
        ("tenant", "t1", 500),
        ("tenant", "t2", 500),
    ]


async def test_an_agent_budget_needs_approvals_for_one_agent(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """With a per-agent budget, an approval for any agent of the tenant cannot be counted and
    is refused as not sendable; one for a named agent is counted against that agent only."""
    budgeted(policy_dir, "budgets: [{scope: agent, currency: usd, limit: 500, window: 24h}]")
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        anyone, refused = await create(gate)
        mine = await gate.approve(agent_id="agent-a")
        sent = (await send(gate, mine))[0]
        shown = await budgets(gate, "?tenant=t1&agent_id=agent-c")
    assert (anyone, refused["code"]) == (422, "approval_not_sendable")
    assert "agent_id" in refused["detail"]
    assert sent == 200
    assert [(b["agent_id"], b["remaining"]) for b in shown] == [("agent-c", 500)]


async def test_the_remaining_budget_is_a_metric(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """/metrics shows each budget's limit and what is left of it: the whole of a provider
    budget nothing was spent from, and a tenant's remainder once it spent."""
    budgets_text = (
        "budgets:\n  - {scope: tenant, currency: usd, limit: 1200, window: 24h}\n"
        "  - {scope: provider, currency: eur, limit: 9000, window: 7d}"
    )
    budgeted(policy_dir, budgets_text)
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        assert (await send(gate, await gate.approve()))[0] == 200
        async with gate.http.get(f"{gate.ops_url}/metrics") as response:
            text = await response.text()
    lines = set(text.splitlines())
    assert (
        'opgate_budget_limit{provider="fault",scope="tenant",currency="usd",window="24h"} 1200'
        in lines
    )
    assert (
        'opgate_budget_remaining{provider="fault",scope="tenant",currency="usd",window="24h",'
        'tenant="t1",agent=""} 700' in lines
    )
    assert (
        'opgate_budget_remaining{provider="fault",scope="provider",currency="eur",window="7d",'
        'tenant="",agent=""} 9000' in lines
    )


async def test_an_operation_approved_before_its_budget_cannot_escape_it(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """An operation for any agent, approved before a per-agent budget was declared, cannot be
    counted against it: its claim is refused budget_exceeded, nothing sent; with the provider
    in shadow mode it is sent and audited would_deny."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        enforced, reported = await gate.approve(), await gate.approve()
    agent_budget = "budgets: [{scope: agent, currency: usd, limit: 5000, window: 24h}]"
    budgeted(policy_dir, agent_budget)
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        status, body = await send(gate, enforced)
    budgeted(policy_dir, agent_budget, mode="report")
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        with capture_logs() as logs:
            shadowed, _ = await send(gate, reported)
    assert (status, problem(body)["code"]) == (403, "budget_exceeded")
    assert "agent_id" in problem(body)["detail"]
    assert shadowed == 200
    [record] = [entry for entry in logs if entry["event"] == "request"]
    assert record["would_deny"] == "budget_exceeded"
    assert len(fault_provider.effects) == 1


async def test_repeating_an_approval_that_spent_the_budget_returns_it(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """A create repeated with the same operation id and approval returns the row (200) even
    once that operation has spent the whole budget; a new one is refused budget_exceeded."""
    budgeted(policy_dir, tenant_budget(500))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve(operation_id="op-budget-repeat")
        assert (await send(gate, op))[0] == 200
        repeated, row = await create(gate, operation_id="op-budget-repeat")
        fresh, refused = await create(gate)
    assert (repeated, row["status"]) == (200, "confirmed")
    assert (fresh, refused["code"]) == (403, "budget_exceeded")
