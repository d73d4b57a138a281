"""The tools opgate offers over MCP, as the protocol describes them, and the shape of their
answers. Pure: no IO.

The annotations are promises a client may rely on: the reads change nothing; executing
changes the provider (destructive) and repeating it with the same operation id never acts
twice (idempotent: the claim and the stored answer guarantee it, not the client).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import mcp.types as types

from proxy.mcp.apps import CARD_META
from proxy.recovery.next_action import NextAction

LIST_OPERATIONS = "list_operations"
GET_OPERATION = "get_operation"
EXECUTE_OPERATION = "execute_operation"
PROPOSE_OPERATION = "propose_operation"
GET_PROPOSAL = "get_proposal"

_OPERATION_ID = {
    "type": "string",
    "minLength": 1,
    "maxLength": 255,
    "description": "The approved operation's id (op_...), as the application handed it over.",
}
_RECOVERY = {
    "next_action": {"type": "string", "enum": [action.value for action in NextAction]},
    "reason": {"type": "string"},
    "retry_after_seconds": {"type": ["integer", "null"]},
}
_VIEW = {
    "type": "object",
    "properties": {
        "operation": {"type": "object", "description": "The row, read from the primary."},
        **_RECOVERY,
        "request": {
            "type": "object",
            "description": "The exact request the approval allows (what execute sends).",
        },
    },
    "required": ["operation", "next_action", "reason", "retry_after_seconds"],
}
_PROVIDER_RESPONSE = {
    "type": "object",
    "properties": {
        "status": {"type": "integer"},
        "replayed": {
            "type": "boolean",
            "description": "true: the stored answer of the attempt that settled it; nothing sent",
        },
        "content_type": {"type": ["string", "null"]},
        "body": {"description": "The provider's body: JSON when it sent JSON, else text."},
    },
    "required": ["status", "replayed", "content_type", "body"],
}

_PROPOSAL_VIEW = {
    "type": "object",
    "properties": {
        "proposal": {"type": "object"},
        "status": {
            "type": "string",
            "enum": ["pending", "approved", "declined", "expired", "withdrawn"],
        },
        "operation_id": {
            "type": ["string", "null"],
            "description": "Once approved: the operation to get and execute.",
        },
        **_RECOVERY,
        "request": {"type": "object"},
    },
    "required": ["proposal", "status", "operation_id", "next_action", "reason"],
}

TOOLS = (
    types.Tool(
        name=LIST_OPERATIONS,
        title="List my unsettled operations",
        description=(
            "The approved operations of this agent that are not settled yet (created or "
            "dispatched), each with next_action: what the recovery protocol says to do next."
        ),
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        output_schema={
            "type": "object",
            "properties": {"operations": {"type": "array", "items": _VIEW}},
            "required": ["operations"],
        },
        annotations=types.ToolAnnotations(
            read_only_hint=True, idempotent_hint=True, open_world_hint=False
        ),
    ),
    types.Tool(
        name=GET_OPERATION,
        title="Read one operation",
        description=(
            "The authoritative row of an operation (read from the primary), next_action, "
            "retry_after_seconds and the exact request the approval allows. Where next_action "
            "is reconcile, opgate asks the provider first (at the rule's pace)."
        ),
        input_schema={
            "type": "object",
            "properties": {"operation_id": _OPERATION_ID},
            "required": ["operation_id"],
            "additionalProperties": False,
        },
        output_schema=_VIEW,
        annotations=types.ToolAnnotations(
            read_only_hint=True, idempotent_hint=True, open_world_hint=False
        ),
    ),
    types.Tool(
        name=EXECUTE_OPERATION,
        title="Execute an approved operation",
        description=(
            "opgate sends exactly the approved request (target, amount, currency, parameters "
            "and idempotency key from the approval) through all of its checks. free_fields may "
            "set only the fields the rule leaves free. Repeating it never acts twice: a "
            "settled operation answers with the provider's stored answer. Follow next_action."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "operation_id": _OPERATION_ID,
                "free_fields": {
                    "type": "object",
                    "description": (
                        "Field name (form key, or JSON pointer for a JSON body) -> value, for "
                        "the fields the rule's `free` patterns allow; nothing else is accepted."
                    ),
                },
            },
            "required": ["operation_id"],
            "additionalProperties": False,
        },
        output_schema={
            "type": "object",
            "properties": {
                "provider_response": _PROVIDER_RESPONSE,
                "operation": {"type": "object"},
                **_RECOVERY,
            },
            "required": ["provider_response", "operation", "next_action", "reason"],
        },
        annotations=types.ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=True
        ),
    ),
    types.Tool(
        name=PROPOSE_OPERATION,
        title="Ask a human to approve an exact request",
        description=(
            "Propose the exact request you intend (provider, action, amount, currency, "
            "parameters) and why. A human approves or declines it; nothing is sent. Read the "
            "outcome with get_proposal: once approved it names the operation to execute."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "provider": {"type": "string", "minLength": 1, "maxLength": 128},
                "action": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 128,
                    "description": "The policy rule's name, e.g. refund.create.",
                },
                "path_params": {"type": "object", "additionalProperties": {"type": "string"}},
                "amount": {"type": ["integer", "null"], "minimum": 0},
                "currency": {"type": ["string", "null"], "pattern": "^[A-Za-z]{3}$"},
                "params": {"type": "object"},
                "reason": {"type": "string", "minLength": 1},
            },
            "required": ["provider", "action", "reason"],
            "additionalProperties": False,
        },
        output_schema=_PROPOSAL_VIEW,
        _meta=CARD_META,  # hosts that render MCP Apps show the request as a read-only card
        # it adds a pending proposal and changes nothing else; each call is a new proposal
        annotations=types.ToolAnnotations(
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        ),
    ),
    types.Tool(
        name=GET_PROPOSAL,
        title="Read one of my proposals",
        description=(
            "A proposal's state and next_action: wait while pending; once approved, the "
            "operation's own next_action and operation_id; new_approval_required if declined "
            "or expired."
        ),
        input_schema={
            "type": "object",
            "properties": {"proposal_id": {"type": "string", "minLength": 1, "maxLength": 255}},
            "required": ["proposal_id"],
            "additionalProperties": False,
        },
        output_schema=_PROPOSAL_VIEW,
        _meta=CARD_META,
        annotations=types.ToolAnnotations(
            read_only_hint=True, idempotent_hint=True, open_world_hint=False
        ),
    ),
)

TOOL_NAMES = frozenset(tool.name for tool in TOOLS)


@dataclass(frozen=True)
class ToolError:
    """A refusal or failure, as opgate's problem body (stable ``code``, ``detail``)."""

    problem: dict[str, Any]


@dataclass(frozen=True)
class Answered:
    """A tool's structured answer; ``failed``: the provider refused (e.g. a 402)."""

    content: dict[str, Any]
    failed: bool = False


def tool_result(answer: Answered | ToolError) -> types.CallToolResult:
    """The MCP result: the structured answer, and the same JSON as text for clients that only
    read text; errors are tool errors (isError) whose text starts with the stable code."""
    if isinstance(answer, ToolError):
        text = f"{answer.problem.get('code')}: {answer.problem.get('detail')}"
        return types.CallToolResult(
            content=[
                types.TextContent(type="text", text=text),
                types.TextContent(type="text", text=json.dumps(answer.problem)),
            ],
            structured_content=answer.problem,
            is_error=True,
        )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(answer.content))],
        structured_content=answer.content,
        is_error=answer.failed,
    )


def decoded_body(content_type: str | None, body: bytes) -> Any:
    """A provider's body as the tools answer it: JSON when it sent JSON, else text."""
    media = (content_type or "").partition(";")[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        try:
            return json.loads(body)
        except ValueError:
            pass
    return body.decode("utf-8", errors="replace")
