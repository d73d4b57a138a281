"""The MCP endpoint as an OAuth 2.1 resource server (the MCP authorization specification):
who an access token says is calling, and what it may do.

- Protected Resource Metadata (RFC 9728) at ``/.well-known/oauth-protected-resource`` +
  the endpoint's path, and ``WWW-Authenticate: Bearer resource_metadata="..."`` on every 401
  (and 403 ``insufficient_scope``), so a client discovers the authorization server.
- A token is a JWT from a configured issuer, checked against that issuer's JWKS (signature,
  ``iss``, ``aud`` = this endpoint's resource URI per RFC 8707, ``exp``); keys are cached and
  fetched again when a token names a key id the cache does not hold (rotation), at most once
  per ``_REFETCH_SECONDS``.
- Its subject (the issuer's ``subject_claim``) must be one the settings map to a configured
  agent; any other is refused. The token never goes further: the pipeline sees the agent,
  and the provider sees opgate's credential (no token passthrough).
- Scopes: ``operations:read`` (get and list, ``tasks/get``, the operations as
  resources), ``operations:execute`` (``execute_operation``, ``tasks/cancel``),
  ``proposals:write`` (propose, and read one's proposals). Listing tools and the
  handshakes need a valid token only. A task's scope follows what its id names, looked up
  (``task_scope``, applied by proxy/mcp/calls.py), never how it is spelled: an operation whose
  id starts like a proposal's is still an operation.

Static agent tokens keep working beside OAuth unless ``static_tokens`` is false.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import jwt

from proxy.gate.checks import Agent
from proxy.gate.ids import IdKind, valid_id
from proxy.mcp.tools import (
    EXECUTE_OPERATION,
    GET_OPERATION,
    GET_PROPOSAL,
    LIST_OPERATIONS,
    PROPOSE_OPERATION,
)
from proxy.settings import McpOAuth, OAuthIssuer

READ, EXECUTE, PROPOSE = "operations:read", "operations:execute", "proposals:write"
SCOPES = (READ, EXECUTE, PROPOSE)
_TOOL_SCOPES = {
    LIST_OPERATIONS: READ,
    GET_OPERATION: READ,
    EXECUTE_OPERATION: EXECUTE,
    PROPOSE_OPERATION: PROPOSE,
    GET_PROPOSAL: PROPOSE,
}
_METHOD_SCOPES = {
    "tasks/get": READ,
    "tasks/update": EXECUTE,
    "tasks/cancel": EXECUTE,
    "resources/list": READ,
    "resources/read": READ,
    "subscriptions/listen": READ,
}
WELL_KNOWN = "/.well-known/oauth-protected-resource"
_REFETCH_SECONDS = 10.0  # an unknown key id refetches the JWKS at most this often
_FETCH_TIMEOUT_SECONDS = 5.0
_LEEWAY_SECONDS = 30  # clock skew allowed on exp/nbf/iat


@dataclass(frozen=True)
class Bearer:
    """Who is calling: the agent, and the scopes its token grants (None: a static opgate
    token, which grants everything the agent may do)."""

    agent: Agent
    scopes: frozenset[str] | None


@dataclass(frozen=True)
class TokenRefused:
    """Why a token is not accepted, as RFC 6750 names it (``invalid_token``)."""

    detail: str
    error: str = "invalid_token"


def required_scope(message: Any) -> str | None:
    """The scope a JSON-RPC request needs (None: any valid token). Pure. An unknown tool
    needs nothing here: the tool call refuses it itself."""
    if not isinstance(message, dict):
        return None
    method = message.get("method")
    if method == "tools/call":
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        return _TOOL_SCOPES.get(name) if isinstance(name, str) else None
    if isinstance(method, str) and method.startswith("tasks/"):
        params = message.get("params")
        task_id = params.get("taskId") if isinstance(params, dict) else None
        if valid_id(task_id, IdKind.PROPOSAL):
            # a proposal's task or an operation's: the store says which, and the call checks
            # the scope of what it names (task_scope) before it reads or changes anything
            return None
    return _METHOD_SCOPES.get(method) if isinstance(method, str) else None


def task_scope(method: str, *, proposal: bool) -> str:
    """The scope ``tasks/<method>`` needs on the task its id was found to name. Pure. A
    proposal's task: what ``get_proposal`` needs; an operation's: what its tools need."""
    if proposal:
        return PROPOSE
    return _METHOD_SCOPES.get(method, EXECUTE)


def metadata_path(resource: str) -> str:
    """Where RFC 9728 puts the metadata of ``resource``: the well-known prefix, then the
    resource's path."""
    return WELL_KNOWN + urlsplit(resource).path


def metadata_url(resource: str) -> str:
    parts = urlsplit(resource)
    return f"{parts.scheme}://{parts.netloc}{metadata_path(resource)}"


def metadata_document(oauth: McpOAuth) -> dict[str, Any]:
    """The Protected Resource Metadata (RFC 9728 section 2)."""
    return {
        "resource": oauth.resource,
        "authorization_servers": [issuer.issuer for issuer in oauth.issuers],
        "scopes_supported": list(SCOPES),
        "bearer_methods_supported": ["header"],
        "resource_name": "opgate MCP endpoint",
    }


def challenge(oauth: McpOAuth | None, *, error: str | None = None, scope: str | None = None) -> str:
    """The ``WWW-Authenticate`` value (RFC 6750, with RFC 9728's ``resource_metadata``)."""
    if oauth is None:
        return 'Bearer realm="opgate"'
    parts = [f'resource_metadata="{metadata_url(oauth.resource)}"']
    if error is not None:
        parts.append(f'error="{error}"')
    if scope is not None:
        parts.append(f'scope="{scope}"')
    return "Bearer " + ", ".join(parts)


class _Keys:
    """One issuer's JWKS: cached for ``cache_seconds``, and fetched again at once when a token
    names a key id the cache lacks (a rotation). A fetch that did not find such a key id
    holds further ones off for ``_REFETCH_SECONDS``, so made-up key ids cannot flood the
    issuer."""

    def __init__(self, issuer: OAuthIssuer, cache_seconds: float) -> None:
        self.issuer = issuer
        self.cache_seconds = cache_seconds
        self.keys: dict[str, jwt.PyJWK] = {}
        self.fetched_at = -float("inf")
        self.fruitless_at = -float("inf")
        self.lock = asyncio.Lock()

    async def key(self, http: aiohttp.ClientSession, kid: str | None) -> jwt.PyJWK | None:
        async with self.lock:
            now = time.monotonic()
            stale = now - self.fetched_at >= self.cache_seconds
            missing = kid is not None and kid not in self.keys
            if stale or (missing and now - self.fruitless_at >= _REFETCH_SECONDS):
                await self._fetch(http)
                if kid is not None and kid not in self.keys:
                    self.fruitless_at = time.monotonic()
        if kid is None:  # a token without a key id: only an issuer with exactly one key
            return next(iter(self.keys.values())) if len(self.keys) == 1 else None
        return self.keys.get(kid)

    async def _fetch(self, http: aiohttp.ClientSession) -> None:
        timeout = aiohttp.ClientTimeout(total=_FETCH_TIMEOUT_SECONDS)
        async with http.get(self.issuer.jwks_uri, timeout=timeout) as response:
            response.raise_for_status()
            document = json.loads(await response.read())
        keys = jwt.PyJWKSet.from_dict(document).keys
        self.keys = {key.key_id: key for key in keys if key.key_id is not None}
        if not self.keys and len(keys) == 1:
            self.keys = {"": keys[0]}
        self.fetched_at = time.monotonic()


class OAuthVerifier:
    def __init__(self, oauth: McpOAuth, agents: dict[str, Agent]) -> None:
        self.oauth = oauth
        self.keys = {i.issuer: _Keys(i, oauth.jwks_cache_seconds) for i in oauth.issuers}
        self.subjects = {
            (i.issuer, s.subject): agents[s.agent_id] for i in oauth.issuers for s in i.subjects
        }

    async def verify(self, http: aiohttp.ClientSession, token: str) -> Bearer | TokenRefused:
        try:
            header = jwt.get_unverified_header(token)
            claimed = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            return TokenRefused("not a JWT access token")
        issuer_name = claimed.get("iss")
        keys = self.keys.get(issuer_name) if isinstance(issuer_name, str) else None
        if keys is None:
            return TokenRefused("the token's issuer is not one this endpoint trusts")
        try:
            key = await keys.key(http, header.get("kid"))
        except (aiohttp.ClientError, TimeoutError, ValueError, jwt.PyJWTError) as exc:
            return TokenRefused(f"the issuer's keys could not be read: {type(exc).__name__}")
        if key is None:
            return TokenRefused("the token is signed with a key the issuer does not publish")
        issuer = keys.issuer
        try:
            claims = jwt.decode(
                token,
                key=key,
                algorithms=list(issuer.algorithms),
                audience=self.oauth.resource,
                issuer=issuer.issuer,
                leeway=_LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            return TokenRefused("the token has expired")
        except jwt.InvalidAudienceError:
            return TokenRefused("the token is not bound to this resource (audience)")
        except jwt.PyJWTError as exc:
            return TokenRefused(f"the token does not verify: {type(exc).__name__}")
        subject = claims.get(issuer.subject_claim)
        agent = self.subjects.get((issuer.issuer, subject)) if isinstance(subject, str) else None
        if agent is None:
            return TokenRefused("the token's subject is not an agent of this opgate")
        scope = claims.get("scope")
        scopes = frozenset(scope.split()) if isinstance(scope, str) else frozenset()
        return Bearer(agent, scopes)
