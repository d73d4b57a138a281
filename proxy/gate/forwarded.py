"""What the forward listener hands to the pipeline about a request it has let through: the
request path reads this, and never imports the listener (proxy/forward/)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDictProxy
from yarl import URL

from proxy.gate.checks import Agent
from proxy.gate.decision import Deny
from proxy.gate.identity import AgentDirectory, credential_from
from proxy.gate.reasons import Reason
from proxy.policy.set import PolicySet, RouteMatch

DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str  # lower case; an IPv6 literal without brackets
    port: int

    @classmethod
    def of(cls, url: str) -> Origin | None:
        try:
            parsed = URL(url, encoded=True)
        except ValueError:
            return None
        scheme, host, port = parsed.scheme.lower(), parsed.raw_host, parsed.explicit_port
        if scheme not in DEFAULT_PORTS or not host or parsed.raw_user or parsed.raw_password:
            return None
        return cls(scheme, host.lower(), port if port is not None else DEFAULT_PORTS[scheme])

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}"


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
    *,
    raw: bool = False,
) -> Agent | Deny:
    """The agent the proxy credential authenticated. The provider's auth header is not a
    credential in forward mode (an SDK must send some api key; opgate replaces it), but one
    that carries another agent's token makes the request ambiguous. ``raw``: that header is an
    API-key header, holding a token bare."""
    for name in ("Proxy-Authorization", provider_auth_header):
        for value in headers.getall(name, []) if name else []:
            bare = raw and name == provider_auth_header
            token = value.strip() if bare else credential_from(value)
            other = agents.lookup(token) if token else None
            if other is not None and other != forwarded.agent:
                return Deny(Reason.AMBIGUOUS_REQUEST, f"{name} carries another agent's token")
    return forwarded.agent
