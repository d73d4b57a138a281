"""``opgate mcp --url URL --token TOKEN``: MCP over stdio for agent runtimes that spawn their
tools, relayed to an opgate's ``/_opgate/mcp``.

The relay decides nothing and holds nothing: each tool call is one stateless exchange with
opgate, carrying the agent's token, and opgate's answer (or tool error) is handed back as it
is. So a relay outlives an opgate restart, and a replacement agent's relay needs only the
token and the operation id.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import AsyncIterator
from typing import Any, cast

import anyio
import httpx2
import mcp.types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from proxy.mcp.endpoint import MCP_PATH
from proxy.mcp.messages import malformed_request
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


class _CheckedLines:
    """stdin's lines for the SDK's reader, less the requests it would drop in silence (it
    skips a line that does not validate, and the client waits forever on that id): those
    are answered here with their JSON-RPC error, on the SDK's own writer."""

    def __init__(self) -> None:
        # UTF-8 whatever the locale says, as the SDK's own reader decodes
        cast(io.TextIOWrapper, sys.stdin).reconfigure(encoding="utf-8", errors="replace")
        self.lines = anyio.wrap_file(sys.stdin)
        self.write: MemoryObjectSendStream[SessionMessage] | None = None
        self.ready = anyio.Event()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._checked()

    async def _checked(self) -> AsyncIterator[str]:
        async for line in self.lines:
            try:
                error = malformed_request(json.loads(line))
            except (ValueError, RecursionError):  # not JSON: the SDK's to refuse
                error = None
            if error is None:
                yield line
                continue
            await self.ready.wait()
            assert self.write is not None
            await self.write.send(SessionMessage(error))


async def serve_stdio(url: str, token: str) -> None:
    server = relay_server(url, token)
    lines = _CheckedLines()
    async with stdio_server(stdin=cast(anyio.AsyncFile[str], lines)) as (read, write):
        lines.write = cast(MemoryObjectSendStream[SessionMessage], write)
        lines.ready.set()
        await server.run(read, write, server.create_initialization_options())
