"""A replacement agent that has only MCP tools: it knows an operation id (and its token and
opgate's address) and follows ``next_action`` from ``get_operation``; it never composes a
request, it asks opgate to execute the approved one.

    python -m tests.support.mcp_recovery_agent AGENT_URL TOKEN OPERATION_ID

Prints one JSON line, {"steps": [...], "view": {...}}, and exits 0 when the work is done
(``proceed``), 3 when a new approval is required, 4 when a human must decide.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from mcp import Client

from tests.support.mcp_client import http_client, structured

EXIT_CODES = {"proceed": 0, "new_approval_required": 3, "escalated": 4}
MAX_STEPS = 200  # a bounded agent: it gives up rather than loop forever


async def follow_next_action(client: Client, operation_id: str) -> tuple[list[str], dict[str, Any]]:
    """Every next_action seen, in order, and the final view."""
    steps: list[str] = []
    view: dict[str, Any] = {}
    for _ in range(MAX_STEPS):
        view = structured(await client.call_tool("get_operation", {"operation_id": operation_id}))
        action = view["next_action"]
        steps.append(action)
        if action in EXIT_CODES:
            return steps, view
        if action in ("send", "retry"):
            await client.call_tool("execute_operation", {"operation_id": operation_id})
            continue  # whatever the answer, the row says what happened: ask again
        # wait, or reconcile (opgate asked the provider during this read and could not settle
        # yet): ask again when told to
        await asyncio.sleep(min(float(view.get("retry_after_seconds") or 0.2), 5.0))
    raise SystemExit(f"gave up after {MAX_STEPS} steps: {view}")


async def _main(agent_url: str, token: str, operation_id: str) -> int:
    async with http_client(agent_url, token) as client:
        steps, view = await follow_next_action(client, operation_id)
    print(json.dumps({"steps": steps, "view": view}))
    return EXIT_CODES[steps[-1]]


if __name__ == "__main__":
    raise SystemExit(asyncio.run(_main(*sys.argv[1:4])))
