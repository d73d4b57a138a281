"""Which headers cross opgate, in each direction, and which can be read at all. Pure.

Outbound: an allowlist per provider, then opgate's own injections. Hop-by-hop headers, anything
named in Connection, the agent's credentials and the headers opgate sets are never copied.
Inbound, every header value must be printable ASCII (space and tab allowed): aiohttp hands over
bytes that are not UTF-8 as surrogates, which no query, hash or outbound request can carry.
"""

from __future__ import annotations

import re

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-connection",
    }
)
# Headers whose duplication makes a request mean two things; refused before any decision.
SINGLE_VALUED = (
    "X-Operation-Id",
    "Content-Type",
    "Content-Length",
    "Content-Encoding",
    "Authorization",
    "Proxy-Authorization",
    "Host",
)


_PRINTABLE_VALUE = re.compile(r"[\t\x20-\x7e]*")


def unreadable_header(headers: CIMultiDictProxy[str]) -> str | None:
    """The first header whose value is not printable ASCII (RFC 9110 field-vchar, SP, HTAB)."""
    for name, value in headers.items():
        if _PRINTABLE_VALUE.fullmatch(value) is None:
            return name
    return None


def duplicated_header(headers: CIMultiDictProxy[str], extra: tuple[str, ...] = ()) -> str | None:
    for name in (*SINGLE_VALUED, *extra):
        if len(headers.getall(name, [])) > 1:
            return name
    return None


def outbound_headers(
    incoming: CIMultiDictProxy[str],
    allowed: list[str],
    injected: dict[str, str],
) -> CIMultiDict[str]:
    connection_named = {
        token.strip().lower()
        for value in incoming.getall("Connection", [])
        for token in value.split(",")
    }
    allowed_lower = {name.lower() for name in allowed}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in incoming.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in connection_named or lower not in allowed_lower:
            continue
        if lower in {n.lower() for n in injected}:
            continue
        out.add(name, value)
    for name, value in injected.items():
        out[name] = value
    return out


def response_headers(upstream: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """The provider's headers an agent may see (length and framing are recomputed)."""
    connection_named = {
        token.strip().lower()
        for value in upstream.getall("Connection", [])
        for token in value.split(",")
    }
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in connection_named or lower == "content-length":
            continue
        out.add(name, value)
    return out
