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
  handshakes need a valid token only.

Static agent tokens keep working beside OAuth unless ``static_tokens`` is false.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import jwt

from proxy.gate.bodies import BodyRejected, parse_json_object
from proxy.gate.checks import Agent
from proxy.mcp.tools import (
    EXECUTE_OPERATION,
    GET_OPERATION,
    GET_PROPOSAL,
    LIST_OPERATIONS,
    PROPOSE_OPERATION,
)
from proxy.settings import McpOAuth, OAuthIssuer
from proxy.store.proposal import PROPOSAL_ID_PREFIX

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
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")


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
        if isinstance(task_id, str) and task_id.startswith(PROPOSAL_ID_PREFIX):
            return PROPOSE  # a proposal's task: what get_proposal needs
    return _METHOD_SCOPES.get(method) if isinstance(method, str) else None


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


# What a token must show for the endpoint to decide on it: the issuer whose keys verify it,
# the audience that binds it to this endpoint (RFC 8707), when it ends, and the scopes it
# grants; and the issuer's subject claim (``OAuthIssuer.subject_claim``), who it is. A token
# without any of these is refused, never read as "no limit" or "no scope".
REQUIRED_CLAIMS = ("iss", "aud", "exp", "scope")
# The most a token may weigh: a header and a few claims, signed (an RSA-4096 signature is 683
# characters); anything larger is not one of the tokens this endpoint reads.
MAX_TOKEN_CHARS = 16 * 1024


@dataclass(frozen=True)
class Presented:
    """A token read once, strictly, before anything is verified: its header and claims as
    JSON objects in which no name is given twice (RFC 7519 section 4 lets a verifier refuse
    such a token; two readers could otherwise see two different claims)."""

    token: str
    header: dict[str, Any]
    claims: dict[str, Any]


def read_token(token: str) -> Presented | TokenRefused:
    """``token`` as a compact JWS (three base64url parts), header and claims parsed as a
    request body is (bounded depth, no repeated name, no NaN, no lone surrogate). Pure."""
    parts = token.split(".")
    if len(token) > MAX_TOKEN_CHARS or len(parts) != 3 or not all(parts):
        return TokenRefused("not a JWT access token")
    read: list[dict[str, Any]] = []
    for part in parts[:2]:
        if not _BASE64URL.fullmatch(part):
            return TokenRefused("not a JWT access token")
        try:
            read.append(parse_json_object(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))))
        except (BodyRejected, ValueError):
            return TokenRefused("not a JWT access token: its header or claims do not parse")
    header, claims = read
    if "crit" in header or "b64" in header:  # RFC 7515 4.1.11: no extension is understood here
        return TokenRefused("the token's header asks for an extension this endpoint lacks")
    return Presented(token, header, claims)


def check_claims(
    claims: dict[str, Any], issuer: OAuthIssuer, resource: str, now: float
) -> tuple[str, frozenset[str]] | TokenRefused:
    """The subject and scopes of verified ``claims``, or why they do not admit the token:
    every required claim present and of its type, issued by ``issuer``, bound to
    ``resource``, and current at ``now``. Pure: the trust (issuer, resource) is the
    endpoint's configuration, never the token's."""
    for name in (*REQUIRED_CLAIMS, issuer.subject_claim):
        if name not in claims:
            return TokenRefused(f"the token does not show the claim {name!r}")
    if claims["iss"] != issuer.issuer:
        return TokenRefused("the token's issuer is not one this endpoint trusts")
    audience = claims["aud"]
    audiences = [audience] if isinstance(audience, str) else audience
    if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
        return TokenRefused("the token's audience is not a string or an array of strings")
    if resource not in audiences:
        return TokenRefused("the token is not bound to this resource (audience)")
    times = {n: claims[n] for n in ("exp", "nbf", "iat") if n in claims}
    if not all(_is_time(t) for t in times.values()):
        return TokenRefused("the token's times are not numbers of seconds")
    if times["exp"] + _LEEWAY_SECONDS <= now:
        return TokenRefused("the token has expired")
    if times.get("nbf", now) - _LEEWAY_SECONDS > now:
        return TokenRefused("the token is not valid yet")
    if times.get("iat", now) - _LEEWAY_SECONDS > now:
        return TokenRefused("the token was issued in the future")
    scope, subject = claims["scope"], claims[issuer.subject_claim]
    if not isinstance(scope, str) or not isinstance(subject, str):
        return TokenRefused("the token's scope or subject is not a string")
    return subject, frozenset(scope.split())


def _is_time(value: object) -> bool:
    """A NumericDate (RFC 7519 section 2): a finite JSON number, never a boolean or a string."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


class OAuthVerifier:
    def __init__(self, oauth: McpOAuth, agents: dict[str, Agent]) -> None:
        self.oauth = oauth
        self.keys = {i.issuer: _Keys(i, oauth.jwks_cache_seconds) for i in oauth.issuers}
        self.subjects = {
            (i.issuer, s.subject): agents[s.agent_id] for i in oauth.issuers for s in i.subjects
        }

    async def verify(self, http: aiohttp.ClientSession, token: str) -> Bearer | TokenRefused:
        presented = read_token(token)
        if isinstance(presented, TokenRefused):
            return presented
        issuer_name = presented.claims.get("iss")
        keys = self.keys.get(issuer_name) if isinstance(issuer_name, str) else None
        if keys is None:
            return TokenRefused("the token's issuer is not one this endpoint trusts")
        kid = presented.header.get("kid")
        if kid is not None and not isinstance(kid, str):
            return TokenRefused("the token's key id is not a string")
        try:
            key = await keys.key(http, kid)
        except (aiohttp.ClientError, TimeoutError, ValueError, jwt.PyJWTError) as exc:
            return TokenRefused(f"the issuer's keys could not be read: {type(exc).__name__}")
        if key is None:
            return TokenRefused("the token is signed with a key the issuer does not publish")
        return self.decide(presented, keys.issuer, key, time.time())

    def decide(
        self, presented: Presented, issuer: OAuthIssuer, key: jwt.PyJWK, now: float
    ) -> Bearer | TokenRefused:
        """Who a token read by ``read_token`` says is calling, with which scopes: its
        signature by ``key`` under one of the issuer's algorithms, then its claims. Pure."""
        try:
            jwt.PyJWS().decode_complete(
                presented.token, key=key, algorithms=list(issuer.algorithms)
            )
        except jwt.PyJWTError as exc:
            return TokenRefused(f"the token does not verify: {type(exc).__name__}")
        checked = check_claims(presented.claims, issuer, self.oauth.resource, now)
        if isinstance(checked, TokenRefused):
            return checked
        subject, scopes = checked
        agent = self.subjects.get((issuer.issuer, subject))
        if agent is None:
            return TokenRefused("the token's subject is not an agent of this opgate")
        return Bearer(agent, scopes)
