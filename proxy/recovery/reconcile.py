"""Reconciliation: the provider is the source of truth about effects.

For a dispatched operation whose last attempt is over and whose outcome is unknown, opgate
looks the effect up at the provider itself (the agent never needs provider credentials) and
settles the row from what the provider says:

- found (an object carrying this operation id)           -> confirmed, with that object
- absent, the policy says absence is conclusive, the list is complete, and the last attempt
  ended more than the grace period ago                   -> failed, reason ``no_effect``
- anything else                                          -> stays dispatched; after
  ``max_attempts`` inconclusive tries it is escalated to a human

Callers hold the row's reconciliation lease (claim_reconcile_one / claim_reconcile_batch), so
two replicas never act on the same operation at once.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

import structlog
from multidict import CIMultiDict

from proxy.errors import UpstreamError
from proxy.gate import upstream
from proxy.gate.classify import object_id_from
from proxy.gate.gateway import Gateway
from proxy.policy.model import ReconcileLookup
from proxy.store.operation import LastOutcome, Operation, Status
from proxy.store.store import ProviderAnswer

_log = structlog.get_logger("opgate.reconcile")
RECONCILE_LEASE_SECONDS = 60.0


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


def render_lookup(lookup: ReconcileLookup, op: Operation) -> str | None:
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


def _at(document: Any, pointer: str) -> Any:
    node = document
    for part in pointer.split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


async def reconcile_claimed(gw: Gateway, op: Operation, owner: str) -> Operation | None:
    """One reconciliation try for an operation whose reconciliation lease ``owner`` holds."""
    provider = gw.policy.provider_named(op.provider)
    rule = provider.rule_named(op.action) if provider else None
    evidence: dict[str, Any] = {
        "try": op.reconcile_attempts + 1,
        "attempts": op.attempts,
        "last_outcome": op.last_outcome,
        "provider_status": op.provider_status,
        "lookups": [],
    }
    if op.last_outcome == LastOutcome.NOT_SENT:
        if not op.approval_stands():
            # Nothing ever left and nothing may leave any more: no effect, without asking.
            return await gw.store.settle_reconciled(
                op.operation_id, owner, Status.FAILED, "no_effect", None, evidence
            )
        # Nothing left yet and the agent may still send it: leave it to the agent until expiry.
        until_expiry = max(1.0, (op.expires_at - op.read_at).total_seconds())
        return await gw.store.reconcile_inconclusive(op.operation_id, owner, until_expiry, evidence)
    if provider is None or rule is None or rule.reconcile is None:
        return await gw.store.escalate(
            op.operation_id, owner, f"no provider lookup is declared for {op.action}", evidence
        )
    results: list[LookupResult] = []
    for lookup in rule.reconcile.lookups:
        target = render_lookup(lookup, op)
        if target is None:
            continue
        result = await _look_up(gw, provider.provider, provider, target, lookup, op)
        results.append(result)
        evidence["lookups"].append({"path": target, "result": _describe(result)})
        if isinstance(result, Found):
            body = json.dumps(result.item).encode()
            answer = ProviderAnswer(200, object_id_from("/id", body), "application/json", body)
            return await gw.store.settle_reconciled(
                op.operation_id, owner, Status.CONFIRMED, "reconciled", answer, evidence
            )
    if not results:
        return await gw.store.escalate(
            op.operation_id, owner, "no declared lookup applies to this operation", evidence
        )
    if all(isinstance(r, Absent) and r.conclusive for r in results):
        wait = _grace_remaining(op, rule.reconcile.grace_seconds)
        if wait <= 0:
            return await gw.store.settle_reconciled(
                op.operation_id, owner, Status.FAILED, "no_effect", None, evidence
            )
        evidence["waiting_for_grace_seconds"] = wait
        return await gw.store.reconcile_inconclusive(op.operation_id, owner, wait, evidence)
    if op.reconcile_attempts + 1 >= rule.reconcile.max_attempts:
        return await gw.store.escalate(
            op.operation_id,
            owner,
            f"reconciliation was inconclusive {op.reconcile_attempts + 1} times",
            evidence,
        )
    return await gw.store.reconcile_inconclusive(
        op.operation_id, owner, rule.reconcile.retry_seconds, evidence
    )


def _grace_remaining(op: Operation, grace_seconds: float) -> float:
    ended = op.last_attempt_over_since() or op.read_at
    deadline: datetime = ended + timedelta(seconds=grace_seconds)
    return max(0.0, math.ceil((deadline - op.read_at).total_seconds() * 1000) / 1000)


async def _look_up(
    gw: Gateway, name: str, provider: Any, target: str, lookup: ReconcileLookup, op: Operation
) -> LookupResult:
    headers: CIMultiDict[str] = CIMultiDict({"Accept": "application/json"})
    if provider.credential is not None:
        credential = gw.credentials.header_value(provider.credential)
        if credential is None:
            return Inconclusive(f"no credential for {name}")
        headers[provider.credential.header] = credential
    outbound = upstream.OutboundRequest(
        method="GET",
        url=gw.upstream_base(name, provider.upstream) + target,
        headers=headers,
        body=b"",
        connect_timeout=provider.timeouts.connect_seconds,
        total_timeout=provider.timeouts.total_seconds,
        max_response_bytes=provider.limits.max_response_body_bytes,
    )
    try:
        answer = await upstream.send(gw.client, outbound)
    except UpstreamError as exc:
        return Inconclusive(f"{type(exc).__name__}: {exc}")
    result = interpret_lookup(lookup, answer.status, answer.body, op.operation_id)
    _log.info(
        "reconcile_lookup",
        operation_id=op.operation_id,
        path=target.split("?")[0],
        provider_status=answer.status,
        result=_describe(result),
    )
    return result


def _describe(result: LookupResult) -> str:
    if isinstance(result, Found):
        return "found"
    if isinstance(result, Absent):
        return "absent_conclusive" if result.conclusive else "absent_inconclusive"
    return f"inconclusive: {result.why}"


async def reconcile_now(gw: Gateway, operation_id: str) -> Operation | None:
    """On demand (operations API, recovery read): one try if the row is reconcilable now."""
    owner = f"{gw.settings.instance_id}:on-demand"
    claimed = await gw.store.claim_reconcile_one(operation_id, owner, RECONCILE_LEASE_SECONDS)
    if claimed is None:
        return await gw.store.load(operation_id)
    await reconcile_claimed(gw, claimed, owner)
    return await gw.store.load(operation_id)
