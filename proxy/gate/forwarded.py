"""What the forward listener hands to the pipeline about a request it has let through."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDictProxy

from proxy.checks import Agent
from proxy.decision import Deny
from proxy.forward.targets import Origin
from proxy.identity import AgentDirectory, credential_from
from proxy.policy.set import PolicySet, RouteMatch
from proxy.reasons import Reason


@dataclass(frozen=True)
class ForwardedRequest:
    """A forward-mode request: its agent (from the proxy credential), the origin it addressed
    (checked against ``provider``'s upstream), and its origin-form path."""

    agent: Agent
    origin: Origin
    provider: str
    base_path: str  # the provider upstream's own path, which the request path lies under
    raw_path: str  # origin-form, query included


FORWARDED = web.RequestKey("opgate_forwarded", ForwardedRequest)


@dataclass(frozen=True)
class Tunnel:
    """An inspected CONNECT tunnel: the agent the CONNECT authenticated, and its target."""

    agent: Agent
    origin: Origin
    provider: str


# Set by the CONNECT handler before the tunnel's request handler starts: every request task
# of that handler inherits it, and no other connection sees it.
CURRENT_TUNNEL: contextvars.ContextVar[Tunnel | None] = contextvars.ContextVar(
    "opgate_tunnel", default=None
)


def forwarded_route(
    policy: PolicySet, forwarded: ForwardedRequest, raw_path: str
) -> RouteMatch | None:
    """The provider the forward listener matched, and the path below its upstream's own path."""
    provider = policy.provider_named(forwarded.provider)
    prefix = forwarded.base_path
    if provider is None or not raw_path.startswith(prefix + "/"):
        return None
    return RouteMatch(provider, raw_path[len(prefix) :])


def forwarded_agent(
    agents: AgentDirectory,
    forwarded: ForwardedRequest,
    headers: CIMultiDictProxy[str],
    provider_auth_header: str | None,
) -> Agent | Deny:
    """The agent the proxy credential authenticated. The provider's auth header is not a
    credential in forward mode (an SDK must send some api key; opgate replaces it), but one
    that carries another agent's token makes the request ambiguous."""
    for name in ("Proxy-Authorization", provider_auth_header):
        for value in headers.getall(name, []) if name else []:
            token = credential_from(value)
            other = agents.lookup(token) if token else None
            if other is not None and other != forwarded.agent:
                return Deny(Reason.AMBIGUOUS_REQUEST, f"{name} carries another agent's token")
    return forwarded.agent
