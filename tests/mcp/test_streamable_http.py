"""The official MCP client over Streamable HTTP at /_opgate/mcp, against a real opgate and
localstripe: the tools, their annotations, and an approved refund executed exactly once."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from structlog.testing import capture_logs

from tests.mcp.conftest import approved_refund, revoke
from tests.support.localstripe_server import list_refunds
from tests.support.mcp_client import http_client, refused_code, structured
from tests.support.opgate import AGENT_TOKEN, OTHER_TENANT_TOKEN, Opgate

MODES = ["auto", "legacy"]  # the 2026-07-28 single exchange, and the initialize handshake


@pytest.mark.parametrize("mode", MODES)
async def test_the_tools_are_listed_with_truthful_annotations_and_output_schemas(
    stripe_gate: Opgate, mode: str
) -> None:
    """Reads are read-only; execute is destructive and idempotent; proposing adds a proposal
    (not destructive, not idempotent); every tool has an output schema."""
    async with http_client(stripe_gate.agent_url, AGENT_TOKEN, mode=mode) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == {
        "list_operations",
        "get_operation",
        "execute_operation",
        "propose_operation",
        "get_proposal",
    }
    for name in ("list_operations", "get_operation", "get_proposal"):
        annotations = tools[name].annotations
        assert annotations is not None
        assert annotations.read_only_hint is True
    execute = tools["execute_operation"].annotations
    assert execute is not None
    assert (execute.read_only_hint, execute.destructive_hint, execute.idempotent_hint) == (
        False,
        True,
        True,
    )
    propose = tools["propose_operation"].annotations
    assert propose is not None
    assert (propose.read_only_hint, propose.destructive_hint, propose.idempotent_hint) == (
        False,
        False,
        False,
    )
    assert all(tool.output_schema for tool in tools.values())
    assert tools["execute_operation"].input_schema["required"] == ["operation_id"]


async def test_the_handshake_names_opgate_and_its_version(stripe_gate: Opgate) -> None:
    """A client that asks who it talks to learns opgate and the version that answers."""
    handshake = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    async with stripe_gate.http.post(
        f"{stripe_gate.agent_url}/_opgate/mcp",
        json=handshake,
        headers={
            "Authorization": f"Bearer {AGENT_TOKEN}",
            "Accept": "application/json, text/event-stream",
        },
    ) as response:
        answer = await response.json()
    assert answer["result"]["serverInfo"] == {"name": "opgate", "version": version("opgate")}


@pytest.mark.parametrize("mode", MODES)
async def test_execute_refunds_once_with_the_operation_id_and_a_repeat_replays(
    stripe_gate: Opgate, localstripe_url: str, mode: str
) -> None:
    """execute_operation makes exactly one refund at localstripe, carrying
    metadata.operation_id; executing it again answers the stored refund and sends nothing."""
    op = await approved_refund(stripe_gate, localstripe_url)
    operation_id = op["operation_id"]
    async with http_client(stripe_gate.agent_url, AGENT_TOKEN, mode=mode) as client:
        first = await client.call_tool("execute_operation", {"operation_id": operation_id})
        again = await client.call_tool("execute_operation", {"operation_id": operation_id})
    [refund] = await list_refunds(localstripe_url, charge=op["params"]["charge"])
    assert refund["metadata"]["operation_id"] == operation_id
    assert refund["amount"] == 500
    done, replayed = structured(first), structured(again)
    assert not first.is_error
    assert not again.is_error
    assert done["provider_response"]["status"] == 200
    assert done["provider_response"]["replayed"] is False
    assert done["provider_response"]["body"]["id"] == refund["id"]
    assert (done["operation"]["status"], done["next_action"]) == ("confirmed", "proceed")
    assert replayed["provider_response"]["replayed"] is True
    assert replayed["provider_response"]["body"]["id"] == refund["id"]
    assert replayed["next_action"] == "proceed"


async def test_an_execution_leaves_one_audit_record_from_the_mcp_listener(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """The pipeline's record of the composed request says listener mcp, the rule, the agent
    and the operation; the exchange that carried it adds no second one (other exchanges, such
    as the client listing the tools, have their own records, naming no operation)."""
    op = await approved_refund(stripe_gate, localstripe_url)
    async with http_client(stripe_gate.agent_url, AGENT_TOKEN) as client:
        with capture_logs() as logs:
            await client.call_tool("execute_operation", {"operation_id": op["operation_id"]})
    records = [entry for entry in logs if entry["event"] == "request"]
    [record] = [entry for entry in records if entry["operation_id"] is not None]
    assert {entry["rule"] for entry in records if entry is not record} <= {"mcp"}
    assert record["listener"] == "mcp"
    assert (record["rule"], record["agent_id"], record["operation_id"]) == (
        "refund.create",
        "agent-a",
        op["operation_id"],
    )
    assert (record["decision"], record["status_after"]) == ("allow", "confirmed")


async def test_another_tenants_operation_is_indistinguishable_from_an_unknown_one(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """Executing or reading another tenant's operation is told exactly what an id that does
    not exist is told, and nothing reaches localstripe."""
    op = await approved_refund(stripe_gate, localstripe_url)
    theirs, absent = op["operation_id"], "op_does_not_exist_0123456789"
    async with http_client(stripe_gate.agent_url, OTHER_TENANT_TOKEN) as client:
        answers = {}
        for tool in ("execute_operation", "get_operation"):
            for operation_id in (theirs, absent):
                result = await client.call_tool(tool, {"operation_id": operation_id})
                problem = structured(result)
                shown = {**problem, "detail": problem["detail"].replace(operation_id, "ID")}
                answers[tool, operation_id] = (result.is_error, shown)
    for tool in ("execute_operation", "get_operation"):
        assert answers[tool, theirs] == answers[tool, absent]
        assert answers[tool, theirs][1]["code"] == "operation_unknown"
    assert await list_refunds(localstripe_url, charge=op["params"]["charge"]) == []


async def test_a_revoked_operation_is_refused_with_its_code(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """A revoked approval is a tool error carrying approval_revoked; nothing is sent."""
    op = await approved_refund(stripe_gate, localstripe_url)
    await revoke(stripe_gate, op["operation_id"])
    async with http_client(stripe_gate.agent_url, AGENT_TOKEN) as client:
        result = await client.call_tool("execute_operation", {"operation_id": op["operation_id"]})
    assert refused_code(result) == "approval_revoked"
    assert structured(result)["recovery"]["next_action"] == "new_approval_required"
    assert await list_refunds(localstripe_url, charge=op["params"]["charge"]) == []


async def test_without_a_valid_token_the_endpoint_refuses_before_the_protocol(
    stripe_gate: Opgate,
) -> None:
    """No token, or a wrong one: 401 problem+json agent_unauthenticated, with its record."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for headers in ({}, {"Authorization": "Bearer opg_not_a_real_token"}):
        with capture_logs() as logs:
            async with stripe_gate.http.post(
                f"{stripe_gate.agent_url}/_opgate/mcp", json=body, headers=headers
            ) as response:
                status, payload = response.status, await response.json(content_type=None)
                content_type = response.content_type
        assert (status, content_type) == (401, "application/problem+json")
        assert payload["code"] == "agent_unauthenticated"
        [record] = [entry for entry in logs if entry["event"] == "request"]
        assert (record["listener"], record["reason"]) == ("mcp", "agent_unauthenticated")


async def test_get_and_list_show_the_row_next_action_and_the_exact_request(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """get_operation gives the row, next_action send and the request execute would send;
    list_operations lists it among the agent's unsettled operations."""
    op = await approved_refund(stripe_gate, localstripe_url)
    async with http_client(stripe_gate.agent_url, AGENT_TOKEN) as client:
        got = await client.call_tool("get_operation", {"operation_id": op["operation_id"]})
        listed = await client.call_tool("list_operations", {})
    view = structured(got)
    assert (view["operation"]["status"], view["next_action"]) == ("created", "send")
    assert view["request"]["path"] == "/stripe/v1/refunds"
    assert view["request"]["form"] == {"amount": "500", "charge": op["params"]["charge"]}
    ids = [entry["operation"]["operation_id"] for entry in structured(listed)["operations"]]
    assert op["operation_id"] in ids


async def test_exchanges_the_endpoint_does_not_serve_are_refused_with_a_record(
    stripe_gate: Opgate,
) -> None:
    """A GET (no stream: stateless) or DELETE is 405, a body that is not JSON is a JSON-RPC
    parse error, another content type is problem+json: each with mcp_request_invalid on
    record, and none hangs."""
    url = f"{stripe_gate.agent_url}/_opgate/mcp"
    headers = {
        "Authorization": f"Bearer {AGENT_TOKEN}",
        "Accept": "application/json, text/event-stream",
    }
    sent = [
        ("GET", None, None),
        ("DELETE", None, None),
        ("POST", b"not json", "application/json"),
        ("POST", b"{}", "text/plain"),
    ]
    answers = []
    with capture_logs() as logs:
        for method, body, content_type in sent:
            extra = {"Content-Type": content_type} if content_type else {}
            async with stripe_gate.http.request(
                method, url, data=body, headers={**headers, **extra}
            ) as response:
                payload = await response.json(content_type=None)
                answers.append((response.status, response.content_type, payload))
    assert [(status, kind) for status, kind, _ in answers] == [
        (405, "application/problem+json"),
        (405, "application/problem+json"),
        (400, "application/json"),
        (400, "application/problem+json"),
    ]
    assert answers[0][2]["code"] == answers[3][2]["code"] == "mcp_request_invalid"
    assert answers[2][2]["error"]["code"] == -32700  # JSON-RPC: parse error
    records = [entry for entry in logs if entry["event"] == "request"]
    assert [(r["reason"], r["response_status"]) for r in records] == [
        ("mcp_request_invalid", 405),
        ("mcp_request_invalid", 405),
        ("mcp_request_invalid", 400),
        ("mcp_request_invalid", 400),
    ]


@pytest.mark.parametrize("mode", MODES)
async def test_every_http_exchange_leaves_exactly_one_audit_record(
    stripe_gate: Opgate, localstripe_url: str, mode: str
) -> None:
    """Handshakes, listings, reads, executions, replays and refusals: as many records as the
    client made HTTP requests, each from the mcp listener."""
    op = await approved_refund(stripe_gate, localstripe_url)
    arguments = {"operation_id": op["operation_id"]}
    sent: list[str] = []
    with capture_logs() as logs:
        async with http_client(stripe_gate.agent_url, AGENT_TOKEN, mode=mode, sent=sent) as client:
            await client.list_tools()
            await client.call_tool("get_operation", arguments)
            await client.call_tool("execute_operation", arguments)
            await client.call_tool("execute_operation", arguments)
            await client.call_tool("list_operations", {})
            await client.call_tool("execute_operation", {"operation_id": "op_absent"})
    records = [entry for entry in logs if entry["event"] == "request"]
    assert len(records) == len(sent) >= 6
    assert {entry["listener"] for entry in records} == {"mcp"}


async def test_a_request_with_a_null_id_is_refused_invalid_request(stripe_gate: Opgate) -> None:
    """``"id": null`` is not a notification: JSON-RPC -32600 (invalid request), denied on
    record."""
    body = {"jsonrpc": "2.0", "id": None, "method": "tools/list", "params": {}}
    with capture_logs() as logs:
        async with stripe_gate.http.post(
            f"{stripe_gate.agent_url}/_opgate/mcp",
            json=body,
            headers={
                "Authorization": f"Bearer {AGENT_TOKEN}",
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2025-06-18",
            },
        ) as response:
            payload = await response.json(content_type=None)
    assert payload["error"]["code"] == -32600, payload
    assert payload["id"] is None
    [record] = [entry for entry in logs if entry["event"] == "request"]
    assert (record["decision"], record["reason"]) == ("deny", "mcp_request_invalid")


async def test_the_401_tells_an_mcp_client_to_send_authorization_bearer(
    stripe_gate: Opgate,
) -> None:
    """MCP clients send Authorization: Bearer; the refusal's next_action says exactly that."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with stripe_gate.http.post(f"{stripe_gate.agent_url}/_opgate/mcp", json=body) as answer:
        payload = await answer.json(content_type=None)
    assert answer.status == 401
    assert "Authorization: Bearer" in payload["next_action"]
    assert "Proxy-Authorization" not in payload["next_action"]
