"""Operations as MCP resources with the official client: the template, the agent's unsettled
operations listed, one read as get_operation reads it, another tenant's not found."""

from __future__ import annotations

import json

import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import TextResourceContents

from tests.mcp.conftest import approved_refund
from tests.support.mcp_client import http_client
from tests.support.opgate import AGENT_TOKEN, OTHER_TENANT_TOKEN, Opgate


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_an_operation_is_a_read_only_resource_of_its_own_agent(
    stripe_gate: Opgate, localstripe_url: str, mode: str
) -> None:
    """The template opgate://operations/{operation_id}; the unsettled operation is listed;
    reading it gives the row, next_action send and the exact request; another tenant reading
    it gets what an unknown id gets."""
    op = await approved_refund(stripe_gate, localstripe_url)
    uri = f"opgate://operations/{op['operation_id']}"
    async with http_client(stripe_gate.agent_url, AGENT_TOKEN, mode=mode) as client:
        templates = await client.list_resource_templates()
        listed = await client.list_resources()
        read = await client.read_resource(uri)
    async with http_client(stripe_gate.agent_url, OTHER_TENANT_TOKEN, mode=mode) as other:
        with pytest.raises(MCPError) as theirs:
            await other.read_resource(uri)
        with pytest.raises(MCPError) as absent:
            await other.read_resource("opgate://operations/op_absent_1")
    [template] = templates.resource_templates
    assert template.uri_template == "opgate://operations/{operation_id}"
    assert uri in {str(resource.uri) for resource in listed.resources}
    [contents] = read.contents
    assert isinstance(contents, TextResourceContents)
    view = json.loads(contents.text)
    assert (view["operation"]["operation_id"], view["next_action"]) == (op["operation_id"], "send")
    assert view["request"]["path"] == "/stripe/v1/refunds"
    assert theirs.value.error.code == absent.value.error.code == -32602
    assert theirs.value.error.message == absent.value.error.message
