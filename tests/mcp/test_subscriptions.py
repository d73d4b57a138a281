"""subscriptions/listen with the official client: an operation's resource URI and a task id
watched on the stateless endpoint; a change made by another client (another exchange, as it
would be on another replica) is heard; another tenant's ids are never acknowledged."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated

from tests.mcp.conftest import approved_refund
from tests.support.mcp_client import http_client
from tests.support.mcp_tasks import TaskNotice, listen_to_tasks, tasks_client
from tests.support.opgate import (
    AGENT_TOKEN,
    OTHER_TENANT_TOKEN,
    SHIPPED_POLICIES,
    Opgate,
    StartOpgate,
)


async def test_a_listener_hears_its_operation_change_and_nothing_of_another_tenants(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """resourceSubscriptions: the acknowledgement names the agent's own operation (another
    tenant's listener gets it left out); executing it brings notifications/resources/updated
    for its URI."""
    op = await approved_refund(stripe_gate, localstripe_url)
    uri = f"opgate://operations/{op['operation_id']}"
    async with (
        http_client(stripe_gate.agent_url, OTHER_TENANT_TOKEN) as other,
        other.listen(resource_subscriptions=[uri]) as theirs,
    ):
        not_theirs = theirs.honored.resource_subscriptions
    async with (
        http_client(stripe_gate.agent_url, AGENT_TOKEN) as client,
        client.listen(resource_subscriptions=[uri]) as sub,
    ):
        honored = sub.honored.resource_subscriptions
        async with http_client(stripe_gate.agent_url, AGENT_TOKEN) as executor:
            await executor.call_tool("execute_operation", {"operation_id": op["operation_id"]})
        event = await asyncio.wait_for(anext(sub), 20)
    assert not not_theirs
    assert honored == [uri]
    assert event == ResourceUpdated(uri=uri)


async def test_a_task_listener_hears_the_task_as_tasks_get_answers_it(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """taskIds (the tasks extension): acknowledged for the agent's task; once executed, a
    notifications/tasks carries the completed task with its result; a listener without the
    extension is refused -32021."""
    op = await approved_refund(stripe_gate, localstripe_url)
    notices: asyncio.Queue[TaskNotice] = asyncio.Queue()
    async with (
        tasks_client(stripe_gate.agent_url, AGENT_TOKEN, notices=notices) as client,
        listen_to_tasks(client, [op["operation_id"], "op_absent_1"]) as honored,
    ):
        async with http_client(stripe_gate.agent_url, AGENT_TOKEN) as executor:
            await executor.call_tool("execute_operation", {"operation_id": op["operation_id"]})
        async with asyncio.timeout(20):
            notice = await notices.get()
            while notice.status != "completed":
                notice = await notices.get()
    async with tasks_client(stripe_gate.agent_url, AGENT_TOKEN, tasks=False) as undeclared:
        with pytest.raises(MCPError) as missing:
            async with listen_to_tasks(undeclared, [op["operation_id"]]):
                pass
    assert honored["taskIds"] == [op["operation_id"]]
    assert notice.task_id == op["operation_id"]
    extra = notice.model_extra or {}
    assert extra["result"]["structuredContent"]["next_action"] == "proceed"
    assert missing.value.error.code == -32021


async def test_stopping_opgate_ends_an_open_stream_gracefully(
    start_opgate: StartOpgate, localstripe_url: str
) -> None:
    """A listener that stops closes its open streams with their result at once (aiohttp would
    otherwise wait for them until its shutdown timeout)."""
    async with contextlib.AsyncExitStack() as gate_running:
        gate = await gate_running.enter_async_context(
            start_opgate(
                policy_dir=SHIPPED_POLICIES, upstream_overrides={"stripe": localstripe_url}
            )
        )
        op = await approved_refund(gate, localstripe_url)
        uri = f"opgate://operations/{op['operation_id']}"
        async with (
            http_client(gate.agent_url, AGENT_TOKEN) as client,
            client.listen(resource_subscriptions=[uri]) as sub,
        ):
            async with asyncio.timeout(20):
                await gate_running.aclose()
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(anext(sub), 10)
