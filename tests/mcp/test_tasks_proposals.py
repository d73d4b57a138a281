"""propose_operation as a task of the MCP tasks extension, with the official client: the task
is the proposal (its id), input_required with the console's approval page as a URL
elicitation while nobody has decided, completed naming the operation once approved (a task of
its own), completed with isError once declined; tasks/cancel withdraws a pending proposal
(cancelled) and is refused once it is decided; tasks/update takes only the answer to that
elicitation, never a decision."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from tests.console.helpers import escalated
from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.mcp_tasks import (
    CreatedTask,
    cancel_task,
    get_task,
    propose_as_task,
    tasks_client,
    update_task,
)
from tests.support.opgate import (
    ADMIN_TOKEN,
    AGENT_TOKEN,
    OTHER_TENANT_TOKEN,
    SHIPPED_POLICIES,
    Opgate,
    StartOpgate,
)

CONSOLE = "https://console.example.test/console"


@pytest_asyncio.fixture(loop_scope="session")
async def gate(start_opgate: StartOpgate, localstripe_url: str) -> AsyncIterator[Opgate]:
    """opgate in front of localstripe, its console said to be at CONSOLE."""
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES,
        upstream_overrides={"stripe": localstripe_url},
        console_url=CONSOLE,
    ) as gate:
        yield gate


async def decide(gate: Opgate, proposal_id: str, verdict: str) -> None:
    async with gate.http.post(
        f"{gate.ops_url}/v1/proposals/{proposal_id}/{verdict}",
        json={"decided_by": "alice@example.com"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        assert response.status in (200, 201), await response.text()


async def refund_proposal(localstripe_url: str) -> dict[str, Any]:
    return {
        "provider": "stripe",
        "action": "refund.create",
        "amount": 500,
        "params": {"charge": await create_charge(localstripe_url, 2000)},
        "reason": "the customer was charged twice",
    }


async def test_a_proposal_task_waits_on_the_console_page_then_names_its_operation(
    gate: Opgate, localstripe_url: str
) -> None:
    """The handle is the proposal id, input_required; tasks/get asks the user (URL mode) to
    open the proposal's console page; once approved the task is completed with the operation
    id and next_action send, and that operation is a task of its own (working: not sent)."""
    arguments = await refund_proposal(localstripe_url)
    async with tasks_client(gate.agent_url, AGENT_TOKEN, url_elicitation=True) as client:
        created = await propose_as_task(client, arguments)
        assert isinstance(created, CreatedTask), created
        waiting = await get_task(client, created.task_id)
        await decide(gate, created.task_id, "approve")
        done = await get_task(client, created.task_id)
        operation_id = done["result"]["structuredContent"]["operation_id"]
        operation = await get_task(client, operation_id)
    async with tasks_client(gate.agent_url, AGENT_TOKEN) as no_url:
        plain = await propose_as_task(no_url, arguments)
        assert isinstance(plain, CreatedTask)
        unasked = await get_task(no_url, plain.task_id)
    assert created.task_id.startswith("prop_")
    assert created.status == "input_required"
    assert waiting["status"] == "input_required"
    # kept, never discarded: the extension's TTL is retention, not the pending expiry
    assert (created.model_extra or {})["ttlMs"] is None
    assert waiting["ttlMs"] is None
    asked = waiting["inputRequests"]["approval"]
    assert asked["method"] == "elicitation/create"
    assert asked["params"]["mode"] == "url"
    assert asked["params"]["url"] == f"{CONSOLE}/proposals/{created.task_id}"
    assert done["status"] == "completed", done
    assert done["result"]["isError"] is False
    view = done["result"]["structuredContent"]
    assert (view["status"], view["next_action"]) == ("approved", "send")
    assert operation["status"] == "working"
    assert operation["taskId"] == operation_id
    assert (unasked["status"], unasked["inputRequests"]) == ("input_required", {})
    assert await list_refunds(localstripe_url, charge=arguments["params"]["charge"]) == []


async def test_a_declined_proposal_task_completes_as_a_tool_error_and_cannot_be_cancelled(
    gate: Opgate, localstripe_url: str
) -> None:
    """Declined: completed with isError and new_approval_required (never failed: the
    extension keeps failed for JSON-RPC errors); tasks/cancel of it is refused
    mcp_task_not_cancellable saying it is declined; another tenant's is not found."""
    arguments = await refund_proposal(localstripe_url)
    async with tasks_client(gate.agent_url, AGENT_TOKEN) as client:
        declined = await propose_as_task(client, arguments)
        assert isinstance(declined, CreatedTask)
        await decide(gate, declined.task_id, "decline")
        ended = await get_task(client, declined.task_id)
        with pytest.raises(MCPError) as refused:
            await cancel_task(client, declined.task_id)
    async with tasks_client(gate.agent_url, OTHER_TENANT_TOKEN) as other:
        with pytest.raises(MCPError) as theirs:
            await get_task(other, declined.task_id)
        with pytest.raises(MCPError) as not_theirs:
            await cancel_task(other, declined.task_id)
    assert ended["status"] == "completed", ended
    assert ended["result"]["isError"] is True
    assert ended["result"]["structuredContent"]["next_action"] == "new_approval_required"
    assert refused.value.error.code == -32602
    assert refused.value.error.data["code"] == "mcp_task_not_cancellable"
    assert "declined" in refused.value.error.message
    for unknown in (theirs, not_theirs):
        assert unknown.value.error.code == -32602
        assert unknown.value.error.message == "Failed to retrieve task: Task not found"


async def test_cancelling_a_pending_proposal_task_withdraws_the_proposal(
    gate: Opgate, localstripe_url: str
) -> None:
    """tasks/cancel of a pending proposal's task withdraws the proposal (nothing can have
    left): the task reads cancelled, the proposal withdrawn, an approval after it is refused
    proposal_not_pending, and a second cancel is refused mcp_task_not_cancellable."""
    arguments = await refund_proposal(localstripe_url)
    async with tasks_client(gate.agent_url, AGENT_TOKEN) as client:
        pending = await propose_as_task(client, arguments)
        assert isinstance(pending, CreatedTask)
        acknowledged = await cancel_task(client, pending.task_id)
        cancelled = await get_task(client, pending.task_id)
        with pytest.raises(MCPError) as twice:
            await cancel_task(client, pending.task_id)
    async with gate.http.post(
        f"{gate.ops_url}/v1/proposals/{pending.task_id}/approve",
        json={"decided_by": "alice@example.com"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        approval = (response.status, await response.json())
    assert acknowledged["resultType"] == "complete"
    assert cancelled["status"] == "cancelled", cancelled
    assert "inputRequests" not in cancelled
    assert "withdrawn" in cancelled["statusMessage"]
    assert approval[0] == 409
    assert approval[1]["code"] == "proposal_not_pending"
    assert twice.value.error.data["code"] == "mcp_task_not_cancellable"
    assert "withdrawn" in twice.value.error.message
    assert await list_refunds(localstripe_url, charge=arguments["params"]["charge"]) == []


async def test_update_takes_the_answer_to_the_elicitation_and_never_a_decision(
    gate: Opgate, localstripe_url: str
) -> None:
    """tasks/update answering the approval elicitation (accept) is acknowledged and changes
    nothing; a response carrying content (an attempt to decide) is refused
    mcp_task_input_refused; a key never asked is ignored, as the extension says; an unknown
    task is -32602; a client without the extension is -32021."""
    arguments = await refund_proposal(localstripe_url)
    async with tasks_client(gate.agent_url, AGENT_TOKEN, url_elicitation=True) as client:
        created = await propose_as_task(client, arguments)
        assert isinstance(created, CreatedTask)
        accepted = await update_task(client, created.task_id, {"approval": {"action": "accept"}})
        ignored = await update_task(client, created.task_id, {"other": {"action": "decline"}})
        with pytest.raises(MCPError) as deciding:
            await update_task(
                client,
                created.task_id,
                {"approval": {"action": "accept", "content": {"approved": True}}},
            )
        with pytest.raises(MCPError) as unknown:
            await update_task(client, "prop_absent_1", {"approval": {"action": "accept"}})
        after = await get_task(client, created.task_id)
    async with tasks_client(gate.agent_url, AGENT_TOKEN, tasks=False) as undeclared:
        inline = await propose_as_task(undeclared, arguments)
        with pytest.raises(MCPError) as missing:
            await update_task(undeclared, created.task_id, {"approval": {"action": "accept"}})
    assert accepted.get("resultType") == "complete"
    assert ignored.get("resultType") == "complete"
    assert deciding.value.error.code == -32602
    assert deciding.value.error.data["code"] == "mcp_task_input_refused"
    assert unknown.value.error.code == -32602
    assert after["status"] == "input_required"
    assert isinstance(inline, CallToolResult)
    assert missing.value.error.code == -32021


async def test_an_escalated_operation_task_asks_the_client_nothing(
    gate: Opgate, localstripe_url: str
) -> None:
    """An escalated operation's task is input_required with no inputRequests even for a
    client that declared URL elicitation, with console_url set: the on-call human resolves
    it on the console, not the client's user (docs/mcp.md says why); its statusMessage says
    so; ttlMs stays null."""
    charge = await create_charge(localstripe_url, 2000)
    op = await escalated(
        gate, provider="stripe", action="refund.create", currency=None, params={"charge": charge}
    )
    async with tasks_client(gate.agent_url, AGENT_TOKEN, url_elicitation=True) as client:
        task = await get_task(client, op["operation_id"])
    assert task["status"] == "input_required", task
    assert task["inputRequests"] == {}
    assert task["statusMessage"].startswith("escalated: ")
    assert "a human resolves it on opgate's console" in task["statusMessage"]
    assert "nothing is asked of this client" in task["statusMessage"]
    assert task["ttlMs"] is None
