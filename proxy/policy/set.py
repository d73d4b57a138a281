"""A loaded, validated, immutable set of provider policies and the pure lookups on it."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.policy.model import Provider, Rule
from proxy.policy.payments import NO_LIMITS, X402Limits


@dataclass(frozen=True)
class RouteMatch:
    provider: Provider
    path: str  # the path below the route prefix, e.g. /v1/refunds


@dataclass(frozen=True)
class RuleMatch:
    rule: Rule
    path_params: dict[str, str]


@dataclass(frozen=True)
class PolicySet:
    providers: tuple[Provider, ...]
    version: str  # a digest of the files that make the set: names the policy in audit records
    # the limits on x402 payments across every provider and payee (the set's payments file)
    x402_limits: X402Limits = NO_LIMITS

    def provider_named(self, name: str) -> Provider | None:
        return next((p for p in self.providers if p.provider == name), None)

    def route(self, path: str) -> RouteMatch | None:
        """The provider whose route prefix ``path`` lies under (prefixes are unique)."""
        for provider in self.providers:
            prefix = provider.route_prefix
            if path.startswith(prefix + "/"):
                return RouteMatch(provider, path[len(prefix) :])
        return None


def match_rule(provider: Provider, method: str, path: str) -> RuleMatch | None:
    """The first rule, in file order, that matches; deny by default when none does."""
    for rule in provider.rules:
        if rule.method != method:
            continue
        params = rule.path.match(path)
        if params is not None:
            return RuleMatch(rule, params)
    return None
