"""The resources one opgate process serves with, shared by both listeners."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from proxy.credentials import CredentialSource
from proxy.errors import ConfigurationError
from proxy.identity import AgentDirectory
from proxy.policy.set import PolicySet
from proxy.settings import Settings
from proxy.store.store import Store

if TYPE_CHECKING:  # observe.py imports this module
    from proxy.observe import Observability


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
    # Audit log writers, tracing and metrics (proxy/observe.py); None only in bare unit setups.
    observability: Observability | None = None

    def egress_client(self, forwarded: bool) -> aiohttp.ClientSession:
        if not forwarded:
            return self.client
        if self.forward_client is None:  # the forward listener never runs without it
            raise ConfigurationError("forward-mode request without a forward-mode client")
        return self.forward_client

    def upstream_base(self, provider: str, policy_upstream: str) -> str:
        return self.settings.upstream_overrides.get(provider, policy_upstream).rstrip("/")


GATEWAY = web.AppKey("gateway", Gateway)
