"""Which browser origins may reach the MCP endpoint. Pure.

Both transport specifications say a server MUST validate ``Origin`` and answer 403 to a
present, invalid one (DNS rebinding: a page the agent's user opened must not drive the
endpoint). A request without ``Origin`` is not from a browser page and is allowed; one with
exactly one ``Origin`` equal to a listed origin (``mcp_allowed_origins``; scheme and host
compared without regard to case, as origins are) is allowed; anything else present is not:
an origin not listed, ``null``, an empty value, or two ``Origin`` headers, which a verifier
cannot read as one.
"""

from __future__ import annotations

from collections.abc import Sequence


def origin_allowed(presented: Sequence[str], allowed: Sequence[str]) -> bool:
    """``presented``: every ``Origin`` header value of the request, as sent."""
    if not presented:
        return True
    if len(presented) != 1:
        return False
    return presented[0].lower() in {origin.lower() for origin in allowed}
