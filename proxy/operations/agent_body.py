"""An agent's JSON document on the agent listener, read whole, bounded in size and in time as
an agent request's body is: what the proposals and the mandates APIs read (an opgate document
of a few fields, far below any provider's body limit)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from proxy.gate.reasons import Reason
from proxy.runtime import Gateway

_BODY_MAX = 64 * 1024


async def read_agent_body(gw: Gateway, request: web.Request) -> bytes | tuple[Reason, str]:
    """The whole body, bounded in size and in time (as an agent request's body)."""
    seconds = gw.settings.body_read_timeout_seconds
    if request.content_length is not None and request.content_length > _BODY_MAX:
        return Reason.BODY_TOO_LARGE, f"{request.content_length} bytes, limit {_BODY_MAX}"
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(seconds):
            while chunk := await request.content.read(16 * 1024):
                size += len(chunk)
                if size > _BODY_MAX:
                    return Reason.BODY_TOO_LARGE, f"more than {_BODY_MAX} bytes"
                chunks.append(chunk)
    except TimeoutError:
        return Reason.BODY_TIMEOUT, f"the body did not arrive within {seconds} s"
    except ConnectionError:
        return Reason.REQUEST_MALFORMED, "the connection closed before the whole body"
    return b"".join(chunks)
