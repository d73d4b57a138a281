"""The resources one opgate process serves with, shared by both listeners."""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from proxy.errors import ConfigurationError
from proxy.gate.credentials import CredentialSource
from proxy.gate.cutoff import CutOffClaims
from proxy.gate.identity import AgentDirectory
from proxy.gate.limits import AgentSlots
from proxy.gate.signatures import AgentKey
from proxy.observe.observer import OBSERVABILITY, Observability
from proxy.policy.set import PolicySet
from proxy.settings import Settings
from proxy.store.store import Store


@dataclass
class Gateway:
    settings: Settings
    policy: PolicySet  # replaced as a whole, never edited: a request keeps the set it started with
    store: Store
    client: aiohttp.ClientSession
    agents: AgentDirectory
    credentials: CredentialSource
    # Forward-proxy mode: egress whose resolver refuses unsafe addresses (proxy/forward/).
    forward_client: aiohttp.ClientSession | None = None
    # Audit log writers, tracing and metrics (proxy/observe/); None only in bare unit setups.
    observability: Observability | None = None
    # Each agent's requests in flight in this process (max_requests_in_flight_per_agent).
    in_flight: AgentSlots = field(default_factory=AgentSlots)
    # Claims whose statement was cut off before anything left, until released as not_sent.
    cut_off: CutOffClaims = field(default_factory=CutOffClaims)
    # The keys opgate signs as each agent with (agent id -> key; agents[].signing_key_file)
    signing_keys: dict[str, AgentKey] = field(default_factory=dict)

    def egress_client(self, forwarded: bool) -> aiohttp.ClientSession:
        if not forwarded:
            return self.client
        if self.forward_client is None:  # the forward listener never runs without it
            raise ConfigurationError("forward-mode request without a forward-mode client")
        return self.forward_client

    def upstream_base(self, provider: str, policy_upstream: str) -> str:
        return self.settings.upstream_overrides.get(provider, policy_upstream).rstrip("/")


GATEWAY = web.AppKey("gateway", Gateway)


def serve_with(app: web.Application, gateway: Gateway) -> None:
    """Put the process's resources on a listener's app: the gateway, and the observability
    that the observer's middleware and ``/metrics`` read."""
    app[GATEWAY] = gateway
    if gateway.observability is not None:
        app[OBSERVABILITY] = gateway.observability
