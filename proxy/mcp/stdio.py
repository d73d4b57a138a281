"""``opgate mcp --url URL --token TOKEN``: MCP over stdio for agent runtimes that spawn their
tools, relayed to an opgate's ``/_opgate/mcp``.

The relay decides nothing and holds nothing: each tool call is one stateless exchange with
opgate, carrying the agent's token, and opgate's answer (or tool error) is handed back as it
is. So a relay outlives an opgate restart, and a replacement agent's relay needs only the
token and the operation id.
"""

from __future__ import annotations

from typing import Any

import httpx2
import mcp.types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from proxy.mcp.endpoint import MCP_PATH
from proxy.mcp.tools import TOOLS

# opgate answers an execution after the provider does: as long as its longest provider timeout
_READ_TIMEOUT_SECONDS = 300.0


def endpoint_url(url: str) -> str:
    """The agent listener's address, or the endpoint's own: both name the endpoint."""
    base = url.rstrip("/")
    return base if base.endswith(MCP_PATH) else base + MCP_PATH


def relay_server(url: str, token: str) -> Server[Any]:
    endpoint = endpoint_url(url)

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(TOOLS))

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        timeout = httpx2.Timeout(30.0, read=_READ_TIMEOUT_SECONDS)
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=timeout, trust_env=False) as http,
            Client(streamable_http_client(endpoint, http_client=http)) as opgate,
        ):
            return await opgate.call_tool(params.name, params.arguments)

    return Server(
        "opgate",
        instructions=(
            "opgate's approved operations as tools. Never compose a mutating request: "
            "execute_operation sends exactly the approved one. Follow next_action."
        ),
        on_list_tools=list_tools,
        on_call_tool=on_call_tool,
    )


async def serve_stdio(url: str, token: str) -> None:
    server = relay_server(url, token)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
