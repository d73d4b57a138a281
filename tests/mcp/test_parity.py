"""No new way around the checks: for the same operation in the same state, every refusal the
HTTP path gives an agent that sends the approved request, MCP's execute_operation gives with
the same code (and nothing reaches the provider)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.mcp.conftest import revoke
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.mcp_client import http_client, refused_code, structured
from tests.support.opgate import (
    AGENT_TOKEN,
    OTHER_TENANT_TOKEN,
    Opgate,
    StartOpgate,
    fault_policy,
)
from tests.support.polling import until

APPROVED_FORM = "amount=500&currency=usd&charge=ch_1"


async def http_code(
    gate: Opgate, op: dict[str, Any], token: str = AGENT_TOKEN, form: str = APPROVED_FORM
) -> str:
    """The code the HTTP path refuses ``form`` (the approved request's, unless told) with."""
    status, _, body = await gate.send(
        "/fault/v1/refunds",
        data=form,
        headers={"X-Operation-Id": op["operation_id"], "Idempotency-Key": op["idempotency_key"]},
        token=token,
    )
    assert status >= 400, body
    code: str = json.loads(body)["code"]
    return code


async def mcp_code(
    gate: Opgate,
    op: dict[str, Any],
    token: str = AGENT_TOKEN,
    free_fields: dict[str, Any] | None = None,
) -> str:
    arguments: dict[str, Any] = {"operation_id": op["operation_id"]}
    if free_fields is not None:
        arguments["free_fields"] = free_fields
    async with http_client(gate.agent_url, token) as client:
        return refused_code(await client.call_tool("execute_operation", arguments))


async def expire(database_url: str, operation_id: str) -> None:
    """Test setup: the approval's expiry moved into the past, as time would."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE operations SET expires_at = now() - interval '1 second'"
            " WHERE operation_id = $1",
            operation_id,
        )
    finally:
        await conn.close()


Setup = Callable[[Opgate, FaultProvider, str], Awaitable[dict[str, Any]]]


async def created(gate: Opgate, provider: FaultProvider, database_url: str) -> dict[str, Any]:
    return await gate.approve()


async def revoked(gate: Opgate, provider: FaultProvider, database_url: str) -> dict[str, Any]:
    op = await gate.approve()
    await revoke(gate, op["operation_id"])
    return op


async def expired(gate: Opgate, provider: FaultProvider, database_url: str) -> dict[str, Any]:
    op = await gate.approve()
    await expire(database_url, op["operation_id"])
    return op


async def bound_to_another_agent(
    gate: Opgate, provider: FaultProvider, database_url: str
) -> dict[str, Any]:
    return await gate.approve(agent_id="agent-c")


async def failed(gate: Opgate, provider: FaultProvider, database_url: str) -> dict[str, Any]:
    op = await gate.approve()
    provider.mode = FaultMode.FAIL
    async with http_client(gate.agent_url, AGENT_TOKEN) as client:
        await client.call_tool("execute_operation", {"operation_id": op["operation_id"]})
    return op


async def unknown_outcome(
    gate: Opgate, provider: FaultProvider, database_url: str
) -> dict[str, Any]:
    """Committed, answered 500: unknown, and the provider does not deduplicate."""
    op = await gate.approve()
    provider.mode = FaultMode.ERROR_AFTER_COMMIT
    async with http_client(gate.agent_url, AGENT_TOKEN) as client:
        await client.call_tool("execute_operation", {"operation_id": op["operation_id"]})
    return op


# scenario: (state, token, the HTTP form, the same change as MCP free_fields, code)
CASES: list[tuple[str, Setup, str, str, dict[str, Any] | None, str]] = [
    ("revoked", revoked, AGENT_TOKEN, APPROVED_FORM, None, "approval_revoked"),
    ("expired", expired, AGENT_TOKEN, APPROVED_FORM, None, "approval_expired"),
    ("another tenant", created, OTHER_TENANT_TOKEN, APPROVED_FORM, None, "operation_unknown"),
    (
        "bound to another agent",
        bound_to_another_agent,
        AGENT_TOKEN,
        APPROVED_FORM,
        None,
        "operation_unknown",
    ),
    (
        "field outside free",
        created,
        AGENT_TOKEN,
        APPROVED_FORM + "&description=more",
        {"description": "more"},
        "parameter_unexpected",
    ),
    (
        "approved amount changed",
        created,
        AGENT_TOKEN,
        "amount=2000&currency=usd&charge=ch_1",
        {"amount": "2000"},
        "amount_mismatch",
    ),
    (
        "approved parameter changed",
        created,
        AGENT_TOKEN,
        "amount=500&currency=usd&charge=ch_2",
        {"charge": "ch_2"},
        "parameter_mismatch",
    ),
    (
        "injected field set",
        created,
        AGENT_TOKEN,
        APPROVED_FORM + "&metadata%5Boperation_id%5D=op_other",
        {"metadata[operation_id]": "op_other"},
        "injection_conflict",
    ),
    ("failed", failed, AGENT_TOKEN, APPROVED_FORM, None, "operation_failed"),
    ("unknown outcome", unknown_outcome, AGENT_TOKEN, APPROVED_FORM, None, "reconcile_required"),
]


@pytest.mark.parametrize(
    ("scenario", "setup", "token", "form", "free_fields", "expected"),
    CASES,
    ids=[case[0] for case in CASES],
)
async def test_the_same_refusal_through_http_and_mcp(
    fault_gate: Opgate,
    fault_provider: FaultProvider,
    database_url: str,
    scenario: str,
    setup: Setup,
    token: str,
    form: str,
    free_fields: dict[str, Any] | None,
    expected: str,
) -> None:
    """The refusal code for the approved request through HTTP equals execute_operation's,
    and neither sends anything."""
    op = await setup(fault_gate, fault_provider, database_url)
    posts = len([r for r in fault_provider.requests if r.method == "POST"])
    via_http = await http_code(fault_gate, op, token, form)
    via_mcp = await mcp_code(fault_gate, op, token, free_fields)
    assert via_http == via_mcp == expected
    assert len([r for r in fault_provider.requests if r.method == "POST"]) == posts


async def test_in_flight_is_refused_alike(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """While an execution is held at the provider, HTTP and MCP both refuse a second
    attempt with operation_in_flight."""
    op = await fault_gate.approve()
    fault_provider.mode = FaultMode.STALL_AFTER_COMMIT
    async with http_client(fault_gate.agent_url, AGENT_TOKEN) as client:
        held = asyncio.create_task(
            client.call_tool("execute_operation", {"operation_id": op["operation_id"]})
        )

        async def stalled() -> bool:
            return fault_provider.stalled == 1

        await until(stalled, "stalled", seconds=20)
        via_http = await http_code(fault_gate, op)
        via_mcp = await mcp_code(fault_gate, op)
        fault_provider.release()
        await held
    assert via_http == via_mcp == "operation_in_flight"
    assert len(fault_provider.effects) == 1


async def test_a_free_field_the_rule_allows_is_sent(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """free_fields within the rule's free patterns are sent with the approved fields."""
    op = await fault_gate.approve()
    async with http_client(fault_gate.agent_url, AGENT_TOKEN) as client:
        result = await client.call_tool(
            "execute_operation",
            {"operation_id": op["operation_id"], "free_fields": {"reason": "duplicate"}},
        )
    assert structured(result)["next_action"] == "proceed"
    [effect] = fault_provider.effects
    [sent] = [r for r in fault_provider.requests if r.method == "POST"]
    assert sent.fields["reason"] == "duplicate"
    assert sent.fields["amount"] == "500"
    assert effect.id == structured(result)["provider_response"]["body"]["id"]


def with_policy_lines(policy_dir: Path, lines: str) -> None:
    """The fault policy with provider-level ``lines`` (budgets, rate limits) added."""
    text = fault_policy(deduplicates=False).replace("rules:\n", f"{lines}\nrules:\n", 1)
    (policy_dir / "fault.yaml").write_text(text)


async def test_a_spent_budget_is_refused_alike(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """A claim the tenant's budget cannot cover is refused budget_exceeded through HTTP and
    through MCP alike (the budget is checked in the claim, for either)."""
    with_policy_lines(
        policy_dir, "budgets: [{scope: tenant, currency: usd, limit: 700, window: 24h}]"
    )
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        first, second = await gate.approve(), await gate.approve()
        async with http_client(gate.agent_url, AGENT_TOKEN) as client:
            spent = await client.call_tool(
                "execute_operation", {"operation_id": first["operation_id"]}
            )
        via_http = await http_code(gate, second)
        via_mcp = await mcp_code(gate, second)
    assert structured(spent)["next_action"] == "proceed"
    assert via_http == via_mcp == "budget_exceeded"
    assert len(fault_provider.effects) == 1


async def test_an_agent_over_its_in_flight_limit_is_refused_alike(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """With one request of the agent allowed in flight at the provider and one held there,
    another operation's request is refused rate_limited through HTTP and MCP alike."""
    with_policy_lines(policy_dir, "rate_limits: {per_agent: {in_flight: 1}}")
    fault_provider.mode = FaultMode.STALL_AFTER_COMMIT
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        held_op, other = await gate.approve(), await gate.approve()
        async with http_client(gate.agent_url, AGENT_TOKEN) as client:
            held = asyncio.create_task(
                client.call_tool("execute_operation", {"operation_id": held_op["operation_id"]})
            )

            async def stalled() -> bool:
                return fault_provider.stalled == 1

            await until(stalled, "stalled", seconds=20)
            via_http = await http_code(gate, other)
            via_mcp = await mcp_code(gate, other)
            fault_provider.release()
            await held
    assert via_http == via_mcp == "rate_limited"
    assert len(fault_provider.effects) == 1
