"""The resources one opgate process serves with, shared by both listeners."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from aiohttp import web

from proxy.credentials import CredentialSource
from proxy.identity import AgentDirectory
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

    def upstream_base(self, provider: str, policy_upstream: str) -> str:
        return self.settings.upstream_overrides.get(provider, policy_upstream).rstrip("/")


GATEWAY = web.AppKey("gateway", Gateway)
