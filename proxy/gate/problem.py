"""RFC 9457 ``application/problem+json`` answers for rejections and failures."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from proxy.gate.reasons import REASONS, Reason

PROBLEM_TYPE_BASE = "https://opgate.dev/problems/"
# On one of opgate's own refusals: its problem body, for rendering in a provider's dialect
# (proxy.gate.dialects). A provider's answer passed through never carries it.
PROBLEM = web.ResponseKey("opgate_problem", dict)


def problem_response(
    reason: Reason,
    detail: str,
    *,
    operation_id: str | None = None,
    operation_status: str | None = None,
    retry_after: int | None = None,
    status: int | None = None,
    extra: dict[str, Any] | None = None,
) -> web.Response:
    info = REASONS[reason]
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + reason.value,
        "title": info.title,
        "status": status or info.status,
        "code": reason.value,
        "detail": detail,
        "operation_id": operation_id,
        "next_action": info.next_action,
    }
    if extra:
        body.update(extra)
    response = web.Response(
        status=status or info.status,
        body=json.dumps(body, allow_nan=False).encode("utf-8"),
        content_type="application/problem+json",
    )
    if operation_id:
        response.headers["X-Operation-Id"] = operation_id
    if operation_status:
        response.headers["X-Operation-Status"] = operation_status
    if retry_after is not None:
        response.headers["Retry-After"] = str(retry_after)
    response[PROBLEM] = body
    return response
