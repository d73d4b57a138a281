"""Operations as MCP resources: ``opgate://operations/{operation_id}``, read-only, each the
``get_operation`` view (the row from the primary, ``next_action``, ``retry_after_seconds``
and the exact request the approval allows), for the calling agent's operations only (another
tenant's is "not found", as an unknown id is). ``resources/list`` lists the agent's unsettled
operations. Not subscribable: the endpoint is stateless (no stream to notify on).
"""

from __future__ import annotations

import json
from typing import Any

import mcp.types as types
from mcp.shared.exceptions import MCPError

from proxy.mcp.calls import McpCall, list_unsettled, read_operation
from proxy.mcp.tools import ToolError

SCHEME_PREFIX = "opgate://operations/"
TEMPLATE = types.ResourceTemplate(
    name="operation",
    title="An approved operation",
    uri_template=SCHEME_PREFIX + "{operation_id}",
    description=(
        "The operation's row, next_action, retry_after_seconds and the exact request its "
        "approval allows (read-only; reconciled first where it says reconcile)."
    ),
    mime_type="application/json",
)


def operation_uri(operation_id: str) -> str:
    return SCHEME_PREFIX + operation_id


def _refused(error: ToolError) -> MCPError:
    if error.problem.get("code") in ("operation_unknown", "operation_id_invalid"):
        return MCPError(types.INVALID_PARAMS, "Resource not found")
    return MCPError(types.INTERNAL_ERROR, str(error.problem.get("detail")), error.problem)


async def read(call: McpCall, uri: str) -> types.ReadResourceResult:
    if not uri.startswith(SCHEME_PREFIX):
        raise MCPError(types.INVALID_PARAMS, "Resource not found")
    answer = await read_operation(call, uri.removeprefix(SCHEME_PREFIX), "resources/read")
    if isinstance(answer, ToolError):
        raise _refused(answer)
    text = json.dumps(answer.content)
    contents = types.TextResourceContents(uri=uri, mime_type="application/json", text=text)
    return types.ReadResourceResult(contents=[contents])


async def listed(call: McpCall) -> types.ListResourcesResult:
    answer = await list_unsettled(call)
    if isinstance(answer, ToolError):
        raise _refused(answer)
    views: list[dict[str, Any]] = answer.content["operations"]
    return types.ListResourcesResult(
        resources=[
            types.Resource(
                name=view["operation"]["operation_id"],
                uri=operation_uri(view["operation"]["operation_id"]),
                description=f"{view['operation']['action']}: {view['next_action']}",
                mime_type="application/json",
            )
            for view in views
        ]
    )
