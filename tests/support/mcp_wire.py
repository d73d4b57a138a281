"""Raw JSON-RPC to opgate's ``/_opgate/mcp``, written as the specification spells it (no SDK):
the 2026-07-28 single exchange with its ``_meta`` envelope and its ``MCP-Protocol-Version``,
``Mcp-Method`` and ``Mcp-Name`` headers, for tests that must send what a client would not
(a tampered ``requestState``, a foreign ``Origin``)."""

from __future__ import annotations

import itertools
from typing import Any

import aiohttp

MODERN = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
URL_ELICITATION: dict[str, Any] = {"elicitation": {"url": {}}}
# the methods whose name travels in Mcp-Name (the transport's "name-bearing" methods)
_NAMED = {"tools/call": "name", "resources/read": "uri", "prompts/get": "name"}
_ids = itertools.count(1)


def modern_request(
    method: str, params: dict[str, Any] | None = None, capabilities: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The body and the protocol headers of one 2026-07-28 request."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": capabilities or {},
        "io.modelcontextprotocol/clientInfo": {"name": "wire-test", "version": "1"},
    }
    sent = {**(params or {}), "_meta": meta}
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": sent}
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    if method in _NAMED:
        headers["Mcp-Name"] = str(sent[_NAMED[method]])
    elif method.startswith("tasks/"):
        headers["Mcp-Name"] = str(sent["taskId"])
    return body, headers


async def post(
    http: aiohttp.ClientSession,
    agent_url: str,
    token: str,
    body: Any,
    headers: dict[str, str] | None = None,
) -> tuple[int, str, Any]:
    """One POST; its status, content type and decoded JSON body."""
    sent = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        **(headers or {}),
    }
    async with http.post(f"{agent_url}/_opgate/mcp", json=body, headers=sent) as response:
        return response.status, response.content_type, await response.json(content_type=None)


async def call(
    http: aiohttp.ClientSession,
    agent_url: str,
    token: str,
    method: str,
    params: dict[str, Any] | None = None,
    capabilities: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One 2026-07-28 request; the JSON-RPC answer (``result`` or ``error``)."""
    body, headers = modern_request(method, params, capabilities)
    status, _, answer = await post(http, agent_url, token, body, headers)
    assert isinstance(answer, dict), (status, answer)
    return answer


async def call_tool(
    http: aiohttp.ClientSession,
    agent_url: str,
    token: str,
    name: str,
    arguments: dict[str, Any],
    *,
    capabilities: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """``tools/call`` (``extra``: ``requestState``, ``inputResponses``)."""
    params = {"name": name, "arguments": arguments, **extra}
    return await call(http, agent_url, token, "tools/call", params, capabilities)
