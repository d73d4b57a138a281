"""Which provider, or which pass-through entry, a forward-mode destination is. Pure.

A provider is reached in forward mode at the origin (scheme, host, port) of its effective
upstream: the policy's ``upstream``, or the operator's ``upstream_overrides`` entry, which
replaces it (so an overridden provider is never reached at its production host with the
staging credential). That origin is *inspected*: opgate terminates TLS and each request goes
through the pipeline. Pass-through entries are tunnelled opaquely; an inspected origin never
is, even if a policy also lists it as pass-through. Everything else is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from yarl import URL

from proxy.forward.destinations import AddressClass
from proxy.gate.decision import Deny
from proxy.gate.forwarded import DEFAULT_PORTS, Origin
from proxy.gate.reasons import Reason
from proxy.policy.model import Provider
from proxy.policy.set import PolicySet


def upstream_of(provider: Provider, overrides: Mapping[str, str]) -> str:
    return overrides.get(provider.provider, provider.upstream).rstrip("/")


def provider_origin(provider: Provider, overrides: Mapping[str, str]) -> Origin | None:
    return Origin.of(upstream_of(provider, overrides))


def upstream_base_path(provider: Provider, overrides: Mapping[str, str]) -> str:
    """The path of the effective upstream (often empty): forward-mode paths lie under it."""
    return URL(upstream_of(provider, overrides), encoded=True).raw_path.rstrip("/")


def allowed_classes(provider: Provider) -> frozenset[AddressClass]:
    return frozenset(AddressClass(c) for c in provider.forward_proxy.allow_destinations)


@dataclass(frozen=True)
class Inspect:
    provider: Provider
    origin: Origin


@dataclass(frozen=True)
class PassThrough:
    provider: Provider  # whose policy lists the host (its destination allowances apply)
    host: str
    port: int


def provider_at(policy: PolicySet, overrides: Mapping[str, str], origin: Origin) -> Provider | None:
    for provider in policy.providers:
        if provider_origin(provider, overrides) == origin:
            return provider
    return None


def decide_connect(
    policy: PolicySet, overrides: Mapping[str, str], host: str, port: int
) -> Inspect | PassThrough | Deny:
    """What a ``CONNECT host:port`` becomes: inspected, tunnelled opaquely, or refused."""
    host = host.lower()
    https = Origin("https", host, port)
    provider = provider_at(policy, overrides, https)
    if provider is not None:
        return Inspect(provider, https)
    if provider_at(policy, overrides, Origin("http", host, port)) is not None:
        # A plain-HTTP upstream inside an opaque tunnel would escape inspection.
        return Deny(Reason.HOST_NOT_ALLOWED, f"{https.authority} is reached over plain HTTP only")
    for provider in policy.providers:
        for entry in provider.forward_proxy.pass_through:
            if (entry.host, entry.port) == (host, port):
                return PassThrough(provider, host, port)
    return Deny(Reason.HOST_NOT_ALLOWED, f"no policy names {https.authority}")


def decide_absolute(
    policy: PolicySet, overrides: Mapping[str, str], origin: Origin
) -> Inspect | Deny:
    """What an absolute-form request (``POST http://host/path``) may reach: a provider only."""
    provider = provider_at(policy, overrides, origin)
    if provider is None:
        return Deny(Reason.HOST_NOT_ALLOWED, f"no policy names {origin}")
    return Inspect(provider, origin)


def allowed_classes_for_host(
    policy: PolicySet, overrides: Mapping[str, str], host: str
) -> frozenset[AddressClass]:
    """Address classes a host may resolve to: what the policies naming it allow (or nothing)."""
    host = host.lower()
    allowed: set[AddressClass] = set()
    for provider in policy.providers:
        origin = provider_origin(provider, overrides)
        named = (origin is not None and origin.host == host) or any(
            entry.host == host for entry in provider.forward_proxy.pass_through
        )
        if named:
            allowed |= allowed_classes(provider)
    return frozenset(allowed)


def host_header_agrees(value: str, origin: Origin) -> bool:
    """Whether a ``Host`` header names exactly ``origin`` (the port may be left implicit)."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
    else:
        host, sep, port_text = value.partition(":")
        if not sep:
            port_text = ""
    if port_text and not port_text.isdigit():
        return False
    port = int(port_text) if port_text else DEFAULT_PORTS[origin.scheme]
    return (host, port) == (origin.host, origin.port)
