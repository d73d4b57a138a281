"""Which headers cross opgate, in each direction, and which can be read at all. Pure.

Outbound: an allowlist per provider, then opgate's own injections. Hop-by-hop headers, anything
named in Connection, the agent's credentials and the headers opgate sets are never copied.
Back to the agent: an allowlist per provider too (the policy's ``response_headers`` and the
defaults), and never a header that carries the credential opgate injected (a provider's debug
echo would hand the agent the secret it must never hold).
Inbound, every header value must be printable ASCII (space and tab allowed): aiohttp hands over
bytes that are not UTF-8 as surrogates, which no query, hash or outbound request can carry.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass

from multidict import CIMultiDict, CIMultiDictProxy

from proxy.policy.model import UNLISTABLE_RESPONSE_HEADERS

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


@dataclass(frozen=True)
class AgentHeaders:
    """The provider's answer headers the agent is handed, and the names of those dropped for
    carrying the injected credential (for the audit record and the metric)."""

    headers: CIMultiDict[str]
    credential_echoes: tuple[str, ...]


# A spelling shorter than this is not looked for: it would match ordinary header values.
_SHORTEST_FORM = 8


def credential_forms(*values: str) -> frozenset[str]:
    """The spellings under which injected credential header ``values`` could come back: each
    value, its secret (the part after a scheme), their base64 (standard and URL-safe, padded
    and not) and, for ``Basic``, the decoded ``user:password`` and the password."""
    secrets: set[str] = set()
    for value in values:
        secrets.add(value)
        scheme, space, rest = value.partition(" ")
        secret = rest.strip() if space else value
        secrets.add(secret)
        if space and scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(secret, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                decoded = ""
            secrets.update((decoded, decoded.partition(":")[2]))
    forms = {secret for secret in secrets if len(secret) >= _SHORTEST_FORM}
    for secret in set(forms):
        raw = secret.encode()
        for encoded in (base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()):
            forms.update((encoded, encoded.rstrip("=")))
    return frozenset(forms)


def response_header_allowed(name: str, allowed: Iterable[str]) -> bool:
    """Whether ``name`` is among ``allowed`` (names, or prefixes ending in ``*``), any case."""
    lower = name.lower()
    for pattern in allowed:
        pattern = pattern.lower()
        if (pattern.endswith("*") and lower.startswith(pattern[:-1])) or lower == pattern:
            return True
    return False


def response_headers(
    upstream: CIMultiDictProxy[str], allowed: Iterable[str], credential: frozenset[str]
) -> AgentHeaders:
    """The provider's headers an agent may see: those ``allowed`` lists (the defaults and the
    policy's ``response_headers``); never framing (recomputed), hop-by-hop or opgate's own
    headers, nor any whose name or value holds one of the ``credential`` spellings
    (``credential_forms``): those are dropped and named, whatever ``allowed`` says."""
    connection_named = {
        token.strip().lower()
        for value in upstream.getall("Connection", [])
        for token in value.split(",")
    }
    allowed = tuple(allowed)
    out: CIMultiDict[str] = CIMultiDict()
    echoes: list[str] = []
    for name, value in upstream.items():
        if any(form in value or form in name for form in credential):
            echoes.append(name)
            continue
        lower = name.lower()
        if lower in UNLISTABLE_RESPONSE_HEADERS or lower in connection_named:
            continue
        if response_header_allowed(name, allowed):
            out.add(name, value)
    return AgentHeaders(out, tuple(echoes))
