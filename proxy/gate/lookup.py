"""Asking the provider whether an operation's effect exists: the rule's declared lookups.

The request path asks before it re-sends an attempt whose outcome is unknown, and the recovery
side (proxy/recovery/reconcile.py) asks to settle such an attempt; both read the answers the
same way, here. The lookups go out with opgate's provider credential, never the agent's.

    found      an object carrying this operation id             -> the effect exists
    absent     no such object; conclusive only if the policy says the list is authoritative,
               the list is complete, and the last attempt ended more than the grace ago
    otherwise  inconclusive: nothing may be concluded from it
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import structlog
from multidict import CIMultiDict

from proxy.errors import UpstreamError
from proxy.gate import upstream
from proxy.gate.credentials import provider_credential
from proxy.gate.decision import Deny
from proxy.policy import pointers
from proxy.policy.model import PreconditionLookup, Provider, Reconcile, ReconcileLookup
from proxy.runtime import Gateway
from proxy.store.operation import Operation

_log = structlog.get_logger("opgate.lookup")


@dataclass(frozen=True)
class Found:
    item: Any


@dataclass(frozen=True)
class Absent:
    conclusive: bool


@dataclass(frozen=True)
class Inconclusive:
    why: str


LookupResult = Found | Absent | Inconclusive


@dataclass
class Asked:
    """Every lookup that applied to the operation, in order, up to the first that found it."""

    results: list[LookupResult] = field(default_factory=list)
    evidence: list[dict[str, str]] = field(default_factory=list)

    @property
    def found(self) -> Found | None:
        last = self.results[-1] if self.results else None
        return last if isinstance(last, Found) else None

    def all_absent_conclusively(self) -> bool:
        return bool(self.results) and all(
            isinstance(r, Absent) and r.conclusive for r in self.results
        )


class LookupSubject(Protocol):
    """What a lookup's templates read: an operation, or a proposal of one (the console shows a
    proposal's preconditions as the provider answers them now)."""

    @property
    def operation_id(self) -> str: ...
    @property
    def params(self) -> dict[str, Any]: ...
    @property
    def path_params(self) -> dict[str, str]: ...


def render_lookup(lookup: ReconcileLookup | PreconditionLookup, op: LookupSubject) -> str | None:
    """The lookup's path and query for ``op``; None if it names a value the operation lacks."""
    values = {
        **{k: str(v) for k, v in op.params.items()},
        **op.path_params,
        "operation_id": op.operation_id,
    }
    try:
        path = lookup.path.format_map({k: quote(v, safe="") for k, v in values.items()})
        query = {name: template.format_map(values) for name, template in lookup.query.items()}
    except (KeyError, ValueError, IndexError):
        return None
    return path + ("?" + urlencode(query) if query else "")


def interpret_lookup(
    lookup: ReconcileLookup, status: int, body: bytes, operation_id: str
) -> LookupResult:
    """What one lookup answer says about the effect. Pure."""
    if status == 404 and lookup.items is None:
        return Absent(conclusive=lookup.absence_is_conclusive)
    if not 200 <= status < 300:
        return Inconclusive(f"the lookup answered {status}")
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Inconclusive("the lookup answer is not JSON")
    candidates = [document] if lookup.items is None else _at(document, lookup.items)
    if not isinstance(candidates, list):
        return Inconclusive(f"no list at {lookup.items}")
    for item in candidates:
        if _at(item, lookup.match) == operation_id:
            return Found(item)
    incomplete = lookup.has_more is not None and _at(document, lookup.has_more) is True
    return Absent(conclusive=lookup.absence_is_conclusive and not incomplete)


def grace_seconds_for(provider: Provider, reconcile: Reconcile, op: Operation) -> float:
    """How long after its last attempt ended absence may be concluded: the rule's grace; for a
    row in doubt after a timeline switch, counted from the switch (``last_attempt_over_since``)
    and longer by the provider's whole timeout, since an attempt of the lost timeline may still
    have been on its way to the provider when the switch was seen."""
    if op.lookup_before_send is None:
        return reconcile.grace_seconds
    return reconcile.grace_seconds + provider.timeouts.total_seconds


def grace_remaining(op: Operation, grace_seconds: float) -> float:
    """Seconds until no straggling attempt can still land (0: absence may be concluded)."""
    ended = op.last_attempt_over_since() or op.read_at
    deadline: datetime = ended + timedelta(seconds=grace_seconds)
    return max(0.0, math.ceil((deadline - op.read_at).total_seconds() * 1000) / 1000)


def lookup_lease_seconds(provider: Provider, reconcile: Reconcile | None, margin: float) -> float:
    """How long one try of all the lookups may take: each is bounded by the provider's total
    timeout. A reconciliation lease shorter than that could lapse while a lookup is still out,
    and let an attempt start that the lookup's answer knows nothing of."""
    count = len(reconcile.lookups) if reconcile is not None else 1
    return count * provider.timeouts.total_seconds + margin


async def ask_provider(
    gw: Gateway, provider: Provider, reconcile: Reconcile, op: Operation
) -> Asked:
    """Each declared lookup that applies to ``op``, in order, up to the first that finds it."""
    asked = Asked()
    for lookup in reconcile.lookups:
        target = render_lookup(lookup, op)
        if target is None:
            continue
        result = await _look_up(gw, provider, target, lookup, op)
        asked.results.append(result)
        asked.evidence.append({"path": target, "result": describe(result)})
        if isinstance(result, Found):
            break
    return asked


async def fetch(
    gw: Gateway, provider: Provider, target: str
) -> upstream.UpstreamResponse | Inconclusive:
    """GET ``target`` on the provider with opgate's credential: its answer, or why there is
    none (the credential, the connection or the timeout failed)."""
    headers: CIMultiDict[str] = CIMultiDict({"Accept": "application/json"})
    base = gw.upstream_base(provider.provider, provider.upstream)
    credential = await provider_credential(gw.credentials, gw.client, provider, base)
    if isinstance(credential, Deny):
        return Inconclusive(credential.detail)
    headers.update(credential)
    outbound = upstream.OutboundRequest(
        method="GET",
        url=base + target,
        headers=headers,
        body=b"",
        connect_timeout=provider.timeouts.connect_seconds,
        total_timeout=provider.timeouts.total_seconds,
        max_response_bytes=provider.limits.max_response_body_bytes,
    )
    try:
        return await upstream.send(gw.client, outbound)
    except UpstreamError as exc:
        return Inconclusive(f"{type(exc).__name__}: {exc}")


async def _look_up(
    gw: Gateway, provider: Provider, target: str, lookup: ReconcileLookup, op: Operation
) -> LookupResult:
    answer = await fetch(gw, provider, target)
    if isinstance(answer, Inconclusive):
        return answer
    result = interpret_lookup(lookup, answer.status, answer.body, op.operation_id)
    _log.info(
        "provider_lookup",
        operation_id=op.operation_id,
        path=target.split("?")[0],
        provider_status=answer.status,
        result=describe(result),
    )
    return result


def describe(result: LookupResult) -> str:
    if isinstance(result, Found):
        return "found"
    if isinstance(result, Absent):
        return "absent_conclusive" if result.conclusive else "absent_inconclusive"
    return f"inconclusive: {result.why}"


def _at(document: Any, pointer: str) -> Any:
    """What ``pointer`` names in the answer; None where it names nothing."""
    found = pointers.resolve(document, pointer)
    return None if found is pointers.MISSING else found
