"""JSON-RPC messages the SDK would answer with silence: a request whose ``id`` is null (which
MCP forbids, and which is not a notification either), and, over stdio, a request with an id
whose message does not validate (the SDK's stdio reader drops what it cannot parse). Each gets
the JSON-RPC error a client waiting on that id needs. Pure.
"""

from __future__ import annotations

from typing import Any

import mcp.types as types
from pydantic import ValidationError


def malformed_request(message: Any) -> types.JSONRPCError | None:
    """The error answer ``message`` (decoded JSON) is owed, or None: a valid message, or one
    without a request id to answer (left to the SDK)."""
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return None
    request_id = message["id"]
    if request_id is None:
        return _error(None, types.INVALID_REQUEST, "a request id is a string or an integer")
    try:
        types.jsonrpc_message_adapter.validate_python(message, by_name=False)
    except ValidationError:
        pass
    else:
        return None
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return _error(None, types.INVALID_REQUEST, "a request id is a string or an integer")
    if "params" in message and not isinstance(message["params"], dict):
        return _error(request_id, types.INVALID_PARAMS, "params is an object")
    return _error(request_id, types.INVALID_REQUEST, "not a JSON-RPC 2.0 request")


def _error(request_id: str | int | None, code: int, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message)
    )
