"""Who is calling: agent tokens (agent listener) and token digests (also the operations
listener's, proxy/admin/access.py).

Tokens are configured by their SHA-256, never in clear, so a leaked config file leaks nothing
usable. An agent presents its token in ``Proxy-Authorization`` (Basic with the token as the
password, as ``http://agent:TOKEN@opgate`` proxy URLs produce, or Bearer), or, where a client can
only set the provider's auth header (an SDK's api key), in that header.

Which operation they name is read by the one grammar of ids (proxy/gate/ids.py), re-exported
here for the importers that read an operation id beside the caller's token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
from dataclasses import dataclass

from multidict import CIMultiDictProxy

from proxy.gate.checks import Agent
from proxy.gate.ids import path_operation_id as path_operation_id
from proxy.gate.ids import valid_operation_id as valid_operation_id

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
    """The secret in an Authorization-style value: Bearer TOKEN, or Basic user:TOKEN. Only a
    printable-ASCII secret counts: every token opgate issues is, and one with an undecodable
    byte (aiohttp hands those over as surrogates) could not even be hashed."""
    scheme, _, rest = value.strip().partition(" ")
    rest = rest.strip()
    secret: str | None = None
    if scheme.lower() == "bearer" and rest:
        secret = rest
    elif scheme.lower() == "basic" and rest:
        try:
            decoded = base64.b64decode(rest, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        _, sep, password = decoded.partition(":")
        secret = password if sep and password else None
    return secret if secret is not None and secret.isascii() and secret.isprintable() else None


def _bare_token(value: str) -> str | None:
    secret = value.strip()
    return secret if secret and secret.isascii() and secret.isprintable() else None


def presented_agent_token(
    headers: CIMultiDictProxy[str], provider_auth_header: str | None, *, raw: bool = False
) -> str | None:
    """The one agent token in the request; two different ones are ambiguous and refused.
    ``raw``: the provider's auth header is an API-key header (Adyen's ``X-API-Key``), whose
    value is the token itself, with no scheme."""
    found: list[str] = []
    for name in ("Proxy-Authorization", provider_auth_header):
        if name is None:
            continue
        values = headers.getall(name, [])
        if len(values) > 1:
            raise AmbiguousCredentials(f"{name} is sent more than once")
        if values:
            bare = raw and name == provider_auth_header
            token = _bare_token(values[0]) if bare else credential_from(values[0])
            if token is not None:
                found.append(token)
    if len(set(found)) > 1:
        raise AmbiguousCredentials("two different credentials are presented")
    return found[0] if found else None
