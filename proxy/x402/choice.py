"""The one requirement of a challenge that an approval covers, or why none does.

The approval's terms (resource, maximum amount, asset, network, payee) come from the operation
row's approved params; the accepted networks, assets and schemes from the policy rule. Both are
opgate's own configuration: nothing in the challenge widens them.
"""

from __future__ import annotations

from dataclasses import dataclass

from x402.schemas import PaymentRequired, PaymentRequirements

from proxy.x402.refusal import Refused, Why

MAX_TIMEOUT_SECONDS = 3600  # an authorization valid longer than an hour is not signed


@dataclass(frozen=True)
class Accepted:
    """What the policy rule lets opgate pay with."""

    schemes: frozenset[str]
    networks: frozenset[str]  # CAIP-2, e.g. eip155:8453
    assets: frozenset[str]  # token contract addresses, lower case


@dataclass(frozen=True)
class Approval:
    """What the approval of one operation lets opgate pay."""

    resource: str
    max_amount: int  # in the asset's atomic units
    asset: str
    network: str
    pay_to: str


def choose(
    required: PaymentRequired, approval: Approval, accepted: Accepted
) -> PaymentRequirements | Refused:
    """The cheapest requirement that fits both the rule and the approval (ties: the first)."""
    resource = required.resource.url if required.resource is not None else None
    if resource != approval.resource:
        return Refused(Why.NOT_APPROVED, "the 402 names a resource the approval does not")
    misses: list[str] = []
    fitting: list[PaymentRequirements] = []
    for requirement in required.accepts:
        missed = miss(requirement, approval, accepted)
        if missed is None:
            fitting.append(requirement)
        else:
            misses.append(missed)
    if not fitting:
        return Refused(Why.NOT_APPROVED, "no requirement fits the approval: " + "; ".join(misses))
    return min(fitting, key=lambda requirement: int(requirement.amount))


def miss(requirement: PaymentRequirements, approval: Approval, accepted: Accepted) -> str | None:
    """Why ``requirement`` does not fit, or None: the first term it breaks."""
    if requirement.scheme != "exact" or requirement.scheme not in accepted.schemes:
        return "scheme not accepted"
    network = str(requirement.network)
    if network not in accepted.networks or network != approval.network:
        return "network not approved"
    asset = requirement.asset.lower()
    if asset not in accepted.assets or asset != approval.asset.lower():
        return "asset not approved"
    if requirement.pay_to.lower() != approval.pay_to.lower():
        return "payTo is not the approved payee"
    if int(requirement.amount) > approval.max_amount:
        return "amount over the approved maximum"
    if not 0 < requirement.max_timeout_seconds <= MAX_TIMEOUT_SECONDS:
        return "maxTimeoutSeconds out of range"
    extra = requirement.extra or {}
    if not isinstance(extra.get("name"), str) or not isinstance(extra.get("version"), str):
        return "no EIP-712 domain (extra.name, extra.version)"
    if extra.get("assetTransferMethod", "eip3009") != "eip3009":
        return "only EIP-3009 transfers are signed"
    return None
