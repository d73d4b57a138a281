"""Reconciliation: the provider is the source of truth about effects.

For a dispatched operation whose last attempt is over and whose outcome is unknown, opgate
looks the effect up at the provider itself (the agent never needs provider credentials) and
settles the row from what the provider says:

- found (an object carrying this operation id)           -> confirmed, with that object
- absent, the policy says absence is conclusive, the list is complete, and the last attempt
  ended more than the grace period ago                   -> failed, reason ``no_effect``
- anything else                                          -> stays dispatched; after
  ``max_attempts`` inconclusive tries it is escalated to a human

An escalated operation is still looked up, every ``escalated_retry_seconds``: an effect the
provider shows settles it confirmed (the humans are told); absence leaves it with them.

Callers hold the row's reconciliation lease (claim_reconcile_one / claim_reconcile_batch), sized
from the lookups' own timeouts, so two replicas never act on the same operation at once; every
settlement names the attempt it looked up, so a stale answer settles nothing. The lookups
themselves are proxy/gate/lookup.py's, shared with the re-send path.
"""

from __future__ import annotations

import json
import secrets
from datetime import timedelta
from typing import Any

import structlog

from proxy.gate.classify import object_id_from
from proxy.gate.lookup import (
    ask_provider,
    grace_remaining,
    grace_seconds_for,
    lookup_lease_seconds,
)
from proxy.gate.transitions import ClaimRule, Reconciling, reconciling
from proxy.policy.set import PolicySet
from proxy.recovery.x402_state import payment_of, reconcile_payment
from proxy.runtime import Gateway
from proxy.store.operation import Operation, Status
from proxy.store.store import ProviderAnswer

_log = structlog.get_logger("opgate.reconcile")
# How often an operation with no declared lookup is looked at again once escalated (nothing to
# ask: only its human verdict or expiry changes it).
_NO_LOOKUP_RECHECK_SECONDS = 3600.0


def reconcile_owner(gw: Gateway, purpose: str) -> str:
    """A name for one reconciliation try: unique, so a lapsed lease's holder can never mistake
    a later try's lease (even on the same replica) for its own."""
    return f"{gw.settings.instance_id}:{purpose}:{secrets.token_hex(4)}"


def lease_seconds_for(gw: Gateway, op: Operation) -> float:
    provider = gw.policy.provider_named(op.provider)
    if provider is None:
        return gw.settings.lease_margin_seconds + 30.0
    rule = provider.rule_named(op.action)
    return lookup_lease_seconds(
        provider, rule.reconcile if rule else None, gw.settings.lease_margin_seconds
    )


def longest_lease_seconds(policy: PolicySet, margin: float) -> float:
    """A lease long enough for any operation's lookups under ``policy`` (for batches)."""
    leases = [
        lookup_lease_seconds(provider, rule.reconcile, margin)
        for provider in policy.providers
        for rule in provider.rules
    ]
    return max(leases, default=margin + 30.0)


async def reconcile_claimed(gw: Gateway, op: Operation, owner: str) -> Operation | None:
    """One reconciliation try for an operation whose reconciliation lease ``owner`` holds."""
    provider = gw.policy.provider_named(op.provider)
    rule = provider.rule_named(op.action) if provider else None
    reconcile = rule.reconcile if rule else None
    evidence: dict[str, Any] = {
        "try": op.reconcile_attempts + 1,
        "attempts": op.attempts,
        "last_outcome": op.last_outcome,
        "provider_status": op.provider_status,
        "lookups": [],
    }
    store, attempts = gw.store, op.attempts
    if op.escalated_at is not None:
        return await _look_at_escalated(gw, op, owner, evidence)
    claim_rule = ClaimRule.of(provider, op.action)
    handling = reconciling(op, claim_rule)  # proxy/gate/transitions.py says why each
    if handling is Reconciling.GIVE_BACK:
        await store.release_reconcile(op.operation_id, owner)
        return await store.load(op.operation_id)
    if handling is Reconciling.NO_EFFECT:
        return await _settle_no_effect(gw, op, owner, evidence)
    if handling is Reconciling.LEAVE_UNTIL_EXPIRY:
        until_expiry = max(1.0, (op.expires_at - op.read_at).total_seconds())
        return await store.reconcile_inconclusive(
            op.operation_id, owner, until_expiry, evidence, expected_attempts=attempts
        )
    paying = rule.x402 if rule is not None else None
    payment = await payment_of(gw, op) if paying is not None else None
    if paying is not None and payment is not None:  # its nonce is the evidence (x402_state.py)
        return await reconcile_payment(gw, paying, op, payment, owner, evidence)
    if provider is None or reconcile is None:
        if handling is Reconciling.LEAVE_WHILE_DEDUPLICATED:
            # Nothing to ask, but the agent is told to retry and the provider deduplicates the
            # re-send: leave it to the agent while that holds, then a human decides.
            window = claim_rule.dedup_window_seconds or 0.0
            until = min(op.expires_at, op.created_at + timedelta(seconds=window))
            return await store.reconcile_inconclusive(
                op.operation_id,
                owner,
                max(1.0, (until - op.read_at).total_seconds()),
                evidence,
                expected_attempts=attempts,
            )
        return await store.escalate(
            op.operation_id,
            owner,
            f"no provider lookup is declared for {op.action}",
            evidence,
            look_again_seconds=_NO_LOOKUP_RECHECK_SECONDS,
            expected_attempts=attempts,
        )
    asked = await ask_provider(gw, provider, reconcile, op)
    evidence["lookups"] = asked.evidence
    found = asked.found
    if found is not None:
        return await _settle_found(gw, op, owner, found.item, evidence)
    if not asked.results:
        return await store.escalate(
            op.operation_id,
            owner,
            "no declared lookup applies to this operation",
            evidence,
            look_again_seconds=_NO_LOOKUP_RECHECK_SECONDS,
            expected_attempts=attempts,
        )
    if asked.all_absent_conclusively():
        wait = grace_remaining(op, grace_seconds_for(provider, reconcile, op))
        if wait <= 0:
            return await _settle_no_effect(gw, op, owner, evidence)
        evidence["waiting_for_grace_seconds"] = wait
        return await store.reconcile_inconclusive(
            op.operation_id, owner, wait, evidence, expected_attempts=attempts
        )
    if op.reconcile_attempts + 1 >= reconcile.max_attempts:
        return await store.escalate(
            op.operation_id,
            owner,
            f"reconciliation was inconclusive {op.reconcile_attempts + 1} times",
            evidence,
            look_again_seconds=reconcile.escalated_retry_seconds,
            expected_attempts=attempts,
        )
    return await store.reconcile_inconclusive(
        op.operation_id, owner, reconcile.retry_seconds, evidence, expected_attempts=attempts
    )


async def _look_at_escalated(
    gw: Gateway, op: Operation, owner: str, evidence: dict[str, Any]
) -> Operation | None:
    """A human has the operation; an effect the provider now shows is conclusive all the same."""
    provider = gw.policy.provider_named(op.provider)
    rule = provider.rule_named(op.action) if provider else None
    if provider is None or rule is None or rule.reconcile is None:
        return await gw.store.reconcile_inconclusive(
            op.operation_id,
            owner,
            _NO_LOOKUP_RECHECK_SECONDS,
            evidence,
            expected_attempts=op.attempts,
        )
    asked = await ask_provider(gw, provider, rule.reconcile, op)
    evidence["lookups"] = asked.evidence
    evidence["escalated"] = True
    found = asked.found
    if found is not None:
        return await _settle_found(gw, op, owner, found.item, evidence)
    return await gw.store.reconcile_inconclusive(
        op.operation_id,
        owner,
        rule.reconcile.escalated_retry_seconds,
        evidence,
        expected_attempts=op.attempts,
    )


async def _settle_no_effect(
    gw: Gateway, op: Operation, owner: str, evidence: dict[str, Any]
) -> Operation | None:
    return await gw.store.settle_reconciled(
        op.operation_id,
        owner,
        Status.FAILED,
        "no_effect",
        None,
        evidence,
        expected_attempts=op.attempts,
        # absence is judged on the row as the lease found it: a cut-off claim released as
        # never sent since then must not be burned by this stale answer
        unchanged_since=op.updated_at,
    )


async def _settle_found(
    gw: Gateway, op: Operation, owner: str, item: Any, evidence: dict[str, Any]
) -> Operation | None:
    body = json.dumps(item, allow_nan=False).encode()
    answer = ProviderAnswer(200, object_id_from("/id", body), "application/json", body)
    return await gw.store.settle_reconciled(
        op.operation_id,
        owner,
        Status.CONFIRMED,
        "reconciled",
        answer,
        evidence,
        expected_attempts=op.attempts,
    )


async def reconcile_now(gw: Gateway, operation_id: str) -> Operation | None:
    """On demand (operations API, recovery read): one try if the row is reconcilable now and
    its pace allows one; otherwise the row as it is."""
    current = await gw.store.load(operation_id)
    if current is None:
        return None
    owner = reconcile_owner(gw, "on-demand")
    claimed = await gw.store.claim_reconcile_one(
        operation_id, owner, lease_seconds_for(gw, current)
    )
    if claimed is None:
        return current
    await reconcile_claimed(gw, claimed, owner)
    return await gw.store.load(operation_id)
