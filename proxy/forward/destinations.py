"""Where forward mode may connect: the address a name resolves to, checked after resolution.

An agent names a host; DNS (or a test's static map) turns it into addresses. Loopback,
private, link-local and cloud-metadata addresses are refused unless the policy that lists the
host allows that class explicitly (``forward_proxy.allow_destinations``). Metadata addresses
are their own class: allowing ``link_local`` does not allow them.

The decisions are pure (``classify_address``, ``refused_address``); ``resolve`` and
``CheckedResolver`` are the IO at the edge. The check runs twice: when the forward listener
decides on a CONNECT or an absolute-form request, and again in the resolver of the client
that forwards, so a name that re-resolves elsewhere in between (DNS rebinding) is still
refused.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Collection, Mapping
from enum import StrEnum

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver


class AddressClass(StrEnum):
    PUBLIC = "public"
    LOOPBACK = "loopback"
    PRIVATE = "private"  # RFC 1918, unique-local, carrier-grade NAT, and other non-global ranges
    LINK_LOCAL = "link_local"
    METADATA = "metadata"  # cloud instance metadata endpoints


# Instance-metadata endpoints (AWS, GCP, Azure, OpenStack: 169.254.169.254; AWS IPv6;
# Alibaba 100.100.100.200). Checked before any other class.
_METADATA = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def classify_address(address: IpAddress) -> AddressClass:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return classify_address(address.ipv4_mapped)
    if address in _METADATA:
        return AddressClass.METADATA
    if address.is_loopback:
        return AddressClass.LOOPBACK
    if address.is_link_local:
        return AddressClass.LINK_LOCAL
    if address.is_global:
        return AddressClass.PUBLIC
    # unspecified, multicast, reserved, documentation, shared (100.64/10) and private ranges
    return AddressClass.PRIVATE


def refused_address(
    addresses: Collection[str], allowed: Collection[AddressClass]
) -> tuple[str, AddressClass] | None:
    """The first address (with its class) that may not be reached; None when all may.

    No address at all is refused too: an empty answer is never a reason to go ahead."""
    if not addresses:
        return ("(none)", AddressClass.PRIVATE)
    for text in addresses:
        try:
            address = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            return (text, AddressClass.PRIVATE)
        kind = classify_address(address)
        if kind is not AddressClass.PUBLIC and kind not in allowed:
            return (text, kind)
    return None


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class DestinationRefused(OSError):
    """Raised by ``CheckedResolver``: aiohttp reports it as a connection that never opened."""


async def resolve(
    base: AbstractResolver, static_hosts: Mapping[str, str], host: str, port: int
) -> list[ResolveResult]:
    """The addresses of ``host``: an IP literal as is, the static map, else ``base``."""
    host = host.strip("[]").lower()
    fixed = host if is_ip_literal(host) else static_hosts.get(host)
    if fixed is not None:
        family = socket.AF_INET6 if ":" in fixed else socket.AF_INET
        return [
            ResolveResult(hostname=host, host=fixed, port=port, family=family, proto=0, flags=0)
        ]
    return await base.resolve(host, port, socket.AF_UNSPEC)


class CheckedResolver(AbstractResolver):
    """aiohttp's resolver for forward-mode egress: resolves, then refuses unsafe addresses."""

    def __init__(
        self,
        static_hosts: Mapping[str, str],
        allowed_for: Callable[[str], Collection[AddressClass]],
    ) -> None:
        self._base = ThreadedResolver()
        self._static = {name.lower(): address for name, address in static_hosts.items()}
        self._allowed_for = allowed_for

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await resolve(self._base, self._static, host, port)
        refused = refused_address([r["host"] for r in results], self._allowed_for(host))
        if refused is not None:
            address, kind = refused
            raise DestinationRefused(f"{host} resolves to {address} ({kind}), not allowed")
        return results

    async def close(self) -> None:
        await self._base.close()
