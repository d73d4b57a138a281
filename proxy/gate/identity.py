"""Who is calling: agent tokens (agent listener) and the admin token (operations API).

Tokens are configured by their SHA-256, never in clear, so a leaked config file leaks nothing
usable. An agent presents its token in ``Proxy-Authorization`` (Basic with the token as the
password, as ``http://agent:TOKEN@opgate`` proxy URLs produce, or Bearer), or, where a client can
only set the provider's auth header (an SDK's api key), in that header.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from multidict import CIMultiDictProxy

from proxy.gate.checks import Agent

TOKEN_PREFIX = "opg_"  # noqa: S105  (a prefix that makes leaked tokens greppable, not a secret)


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class AgentDirectory:
    by_digest: dict[str, Agent]

    def lookup(self, token: str) -> Agent | None:
        return self.by_digest.get(token_digest(token))


class AmbiguousCredentials(ValueError):
    pass


def credential_from(value: str) -> str | None:
    """The secret in an Authorization-style value: Bearer TOKEN, or Basic user:TOKEN."""
    scheme, _, rest = value.strip().partition(" ")
    rest = rest.strip()
    if scheme.lower() == "bearer" and rest:
        return rest
    if scheme.lower() == "basic" and rest:
        try:
            decoded = base64.b64decode(rest, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        _, sep, password = decoded.partition(":")
        return password if sep and password else None
    return None


def presented_agent_token(
    headers: CIMultiDictProxy[str], provider_auth_header: str | None
) -> str | None:
    """The one agent token in the request; two different ones are ambiguous and refused."""
    found: list[str] = []
    for name in ("Proxy-Authorization", provider_auth_header):
        if name is None:
            continue
        values = headers.getall(name, [])
        if len(values) > 1:
            raise AmbiguousCredentials(f"{name} is sent more than once")
        if values:
            token = credential_from(values[0])
            if token is not None:
                found.append(token)
    if len(set(found)) > 1:
        raise AmbiguousCredentials("two different credentials are presented")
    return found[0] if found else None


def admin_token_matches(presented: str | None, expected_digest: str | None) -> bool:
    if presented is None or expected_digest is None:
        return False
    return hmac.compare_digest(token_digest(presented), expected_digest)
