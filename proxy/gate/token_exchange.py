"""A provider SDK's own token request, answered at the boundary (OAuth2 client credentials:
PayPal).

An SDK configured as its users configure it (a client id and secret) first asks the
provider's token endpoint, under its base address, for an access token, and sends that token
on every call. opgate holds the provider's real client credentials and gets its own token
(proxy/gate/oauth2.py); the agent's credential is its opgate token. So the SDK's token
request, ``POST <route><token_url>`` with ``grant_type=client_credentials`` and the agent's
opgate token as the client secret (HTTP Basic, as RFC 6749 section 2.3.1 sends it), is
answered here: the access token is that same opgate token, handed back to the party that has
just presented it (nothing it did not hold), with ``Cache-Control: no-store``. The provider's
token never leaves opgate; the request is never forwarded.

Refused: any other grant, body or content type (400), a missing or unknown token (401); each
an agent request like any other, admitted under the agent's limits and audited (rule
``oauth2_token``), in the provider's error dialect (PayPal's carries ``error`` and
``error_description``, which the SDK's OAuthProviderException reads).
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import parse_qs, urlsplit

from aiohttp import web

from proxy.gate.checks import Agent
from proxy.gate.decision import Deny
from proxy.gate.identity import AmbiguousCredentials, presented_agent_token
from proxy.gate.problem import problem_response
from proxy.gate.reasons import Reason
from proxy.observe.audit import AuditRecord, Decision
from proxy.policy.model import OAuth2ClientCredentials, Provider
from proxy.policy.set import PolicySet
from proxy.runtime import Gateway

# The rule name token requests are recorded under: opgate's own, never a provider's.
EXCHANGE_RULE = "oauth2_token"
# What the SDK is told the token lasts: it asks again after that (and is answered again).
EXPIRES_IN_SECONDS = 3600
# ``grant_type=client_credentials`` and perhaps a scope: far below this.
_BODY_MAX = 1024


def token_request_provider(policy: PolicySet, method: str, raw_target: str) -> Provider | None:
    """The provider whose SDK token request this is (POST to the route's ``token_url``, the
    target as sent), or None for any other request."""
    if method != "POST":
        return None
    route = policy.route(raw_target.partition("?")[0])
    if route is None:
        return None
    credential = route.provider.credential
    if not isinstance(credential, OAuth2ClientCredentials):
        return None
    return route.provider if route.path == urlsplit(credential.token_url).path else None


async def answer_token_request(
    gw: Gateway, provider: Provider, request: web.Request, record: AuditRecord
) -> web.Response:
    """The SDK's token: the agent's own opgate token, or a refusal."""
    record.provider, record.rule = provider.provider, EXCHANGE_RULE
    presented = _agent(gw, request)
    if isinstance(presented, Deny):
        return _refuse(record, presented)
    agent, token = presented
    record.agent_id, record.tenant = agent.agent_id, agent.tenant
    slot = gw.in_flight.admit(agent, provider, gw.settings)
    if isinstance(slot, Deny):
        return _refuse(record, slot)
    try:
        refused = await _grant_problem(request, gw.settings.body_read_timeout_seconds)
    finally:
        slot.release()
    if refused is not None:
        return _refuse(record, refused)
    record.decision = Decision.ALLOW
    body = {"access_token": token, "token_type": "Bearer", "expires_in": EXPIRES_IN_SECONDS}
    return web.Response(
        body=json.dumps(body).encode("ascii"),
        content_type="application/json",
        headers={"Cache-Control": "no-store", "Pragma": "no-cache"},
    )


def _agent(gw: Gateway, request: web.Request) -> tuple[Agent, str] | Deny:
    """The agent, by the opgate token it presents as its client secret, and that token."""
    try:
        token = presented_agent_token(request.headers, "Authorization")
    except AmbiguousCredentials as exc:
        return Deny(Reason.AMBIGUOUS_REQUEST, str(exc))
    agent = gw.agents.lookup(token) if token else None
    if agent is None:
        return Deny(
            Reason.AGENT_UNAUTHENTICATED,
            "the client secret (HTTP Basic) must be the agent's opgate token",
        )
    assert token is not None  # an agent was found by it
    return agent, token


async def _grant_problem(request: web.Request, deadline_seconds: float) -> Deny | None:
    """Why the body is not one client-credentials grant (None: it is)."""
    if request.content_type != "application/x-www-form-urlencoded":
        return Deny(Reason.CONTENT_TYPE_MISMATCH, "a token request is a form")
    if request.content_length is None or request.content_length > _BODY_MAX:
        return Deny(
            Reason.BODY_TOO_LARGE, f"a token request has a Content-Length of at most {_BODY_MAX}"
        )
    try:
        async with asyncio.timeout(deadline_seconds):
            raw = await request.read()
    except TimeoutError:
        return Deny(Reason.BODY_TIMEOUT, f"the body did not arrive within {deadline_seconds} s")
    try:
        form = parse_qs(raw.decode("ascii"), strict_parsing=True, keep_blank_values=True)
    except (UnicodeDecodeError, ValueError):
        return Deny(Reason.BODY_INVALID, "the token request's body is not a form")
    if form.get("grant_type") != ["client_credentials"] or set(form) - {"grant_type", "scope"}:
        return Deny(
            Reason.BODY_INVALID,
            "only grant_type=client_credentials (and a scope) is answered",
        )
    return None


def _refuse(record: AuditRecord, deny: Deny) -> web.Response:
    record.decision, record.reason = Decision.DENY, deny.reason.value
    return problem_response(deny.reason, deny.detail, retry_after=deny.retry_after_seconds)
