"""The official MCP client (``mcp``) connected to opgate: over Streamable HTTP with the agent's
token, or over stdio by spawning ``opgate mcp`` the way a local agent runtime does."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from tests.support.environment import inherited
from tests.support.paths import REPO


@contextlib.asynccontextmanager
async def http_client(
    agent_url: str, token: str, *, mode: str = "auto", sent: list[str] | None = None
) -> AsyncIterator[Client]:
    """``mode``: "auto" (the SDK's default: the 2026-07-28 exchange) or "legacy" (the
    initialize handshake most deployed clients still use). ``sent`` collects the method of
    every HTTP request the client makes."""

    async def count(request: httpx2.Request) -> None:
        if sent is not None:
            sent.append(request.method)

    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx2.Timeout(30.0, read=60.0),
            trust_env=False,
            event_hooks={"request": [count]},
        ) as http,
        Client(
            streamable_http_client(f"{agent_url}/_opgate/mcp", http_client=http), mode=mode
        ) as client,
    ):
        yield client


@contextlib.asynccontextmanager
async def stdio_client(
    agent_url: str, token: str, *, extensions: list[Any] | None = None
) -> AsyncIterator[Client]:
    """``opgate mcp --url ... --token ...`` as a child process; the client stops it on exit.
    ``extensions``: the client's (``ClientExtension``), e.g. the tasks extension's."""
    env = inherited()
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "proxy", "mcp", "--url", agent_url, "--token", token],
        cwd=REPO,
        env=env,
    )
    async with Client(server, extensions=extensions) as client:
        yield client


def structured(result: CallToolResult) -> dict[str, Any]:
    content = result.structured_content
    assert isinstance(content, dict), result
    return content


def refused_code(result: CallToolResult) -> str:
    """The stable code of a tool error (fails if the call was not refused)."""
    assert result.is_error, result
    code: str = structured(result)["code"]
    return code
