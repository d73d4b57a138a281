"""Before a re-send of an attempt whose outcome is unknown, ask the provider.

A re-send rests on the provider honouring the key, and a policy's ``provider_deduplicates``
may be wrong, or the key past the provider's retention. Where the rule declares lookups,
opgate asks first, under a reconciliation lease, so that no other attempt can start between
the answer and the claim:

    found                                    -> settled confirmed (``reconciled``): replayed
    absent, conclusively, the grace passed   -> the re-send may go; the claim consumes the lease
    anything else                            -> the re-send goes only while the provider still
                                                deduplicates the key; else ``reconcile_required``
    asked too recently                       -> ``reconcile_required`` until the next lookup is
                                                due (``Retry-After``): no re-send that no lookup
                                                preceded

The lookups are paced by the rule's ``retry_seconds`` whoever asks (``claim_reconcile_one``),
so an agent retrying fast does not multiply calls made with opgate's provider credential.
An inconclusive lookup falls back on the policy's word that the provider deduplicates: a wrong
``provider_deduplicates`` is caught only when the lookup can answer.

A row that a timeline switch of the database put in doubt (``lookup_before_send``: a failover
may have lost its claim, its request having left) is asked about the same way before its next
send, a created one included: found -> settled ``reconciled`` and replayed; absent,
conclusively, once the grace has passed since the switch was seen (and the provider's whole
timeout: a lost claim's request may still have been on its way) -> sent. Anything else waits
for the next lookup: the key is no fallback there, since the policy's word about it is what a
lookup is there to check.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass
from typing import Any

from proxy.gate.checks import reconcile_required
from proxy.gate.classify import object_id_from
from proxy.gate.decision import ClaimKind, Deny
from proxy.gate.lookup import (
    ask_provider,
    grace_remaining,
    grace_seconds_for,
    lookup_lease_seconds,
)
from proxy.gate.reasons import Reason
from proxy.gate.transitions import ClaimRule, seconds_until, transition
from proxy.policy.model import Provider, Reconcile
from proxy.runtime import Gateway
from proxy.store.operation import Operation, Status
from proxy.store.store import ProviderAnswer


@dataclass(frozen=True)
class Cleared:
    """The re-send may be claimed. ``lookup_owner``: the reconciliation lease under which the
    provider showed no effect (None: the claim must rest on the key or on ``not_sent``);
    ``decided_on``: the row as this last read it (the lease's own write, or what an
    inconclusive lookup left), whose version and deadline guard the claim
    (transitions.commit_guard)."""

    lookup_owner: str | None
    decided_on: Operation


async def ask_before_resend(
    gw: Gateway, provider: Provider, reconcile: Reconcile, op: Operation
) -> Cleared | Operation | Deny:
    """Cleared to claim; or the operation as the lookup settled it; or a refusal. ``op``: the
    row as the gate decided on it; the lease is taken only on the row unchanged since."""
    rule = ClaimRule.of(provider, op.action)
    owner = f"{gw.settings.instance_id}:resend:{secrets.token_hex(4)}"
    lease = lookup_lease_seconds(provider, reconcile, gw.settings.lease_margin_seconds)
    taken = await gw.store.claim_reconcile_one(
        op.operation_id, owner, lease, in_doubt=True, unchanged_since=op.updated_at
    )
    if taken is None:
        current = await gw.store.load(op.operation_id) or op
        if not only_paced(current, op, rule):
            # it moved on: the claim, guarded by the row as decided, fails and is explained
            return Cleared(None, op)
        # Asked too recently: the re-send waits for the next lookup rather than rest on the
        # key alone; the provider may have shown the effect since.
        due_in = seconds_until(current, current.next_reconcile_at)
        return Deny(
            Reason.RECONCILE_REQUIRED,
            f"the provider is asked before a re-send; the next lookup is due in {due_in} s",
            due_in,
        )

    asked = await ask_provider(gw, provider, reconcile, taken)
    evidence: dict[str, Any] = {
        "before": "resend",
        "attempts": taken.attempts,
        "last_outcome": taken.last_outcome,
        "lookups": asked.evidence,
    }
    found = asked.found
    if found is not None:
        body = json.dumps(found.item, allow_nan=False).encode()
        answer = ProviderAnswer(200, object_id_from("/id", body), "application/json", body)
        settled = await gw.store.settle_reconciled(
            op.operation_id,
            owner,
            Status.CONFIRMED,
            "reconciled",
            answer,
            evidence,
            expected_attempts=taken.attempts,
        )
        if settled is not None:
            return settled
        return Deny(Reason.OPERATION_IN_FLIGHT, "the operation changed during the lookup", 1)
    in_doubt = taken.lookup_before_send is not None
    wait = grace_remaining(taken, grace_seconds_for(provider, reconcile, taken))
    if asked.all_absent_conclusively() and wait <= 0:
        return Cleared(owner, taken)
    retry_in: float = wait if asked.all_absent_conclusively() else reconcile.retry_seconds
    left = await gw.store.reconcile_inconclusive(
        op.operation_id, owner, retry_in, evidence, expected_attempts=taken.attempts
    )
    if taken.key_deduplicated(rule.dedup_window_seconds) and not in_doubt:
        return Cleared(None, left or taken)
    return reconcile_required(provider, taken, max(1, math.ceil(retry_in)))


def only_paced(current: Operation, decided_on: Operation, rule: ClaimRule) -> bool:
    """Only the pacing kept the lookup's lease from being taken: the row, read again, is the
    version the decision read, and still allows a re-send after a lookup (transitions.py: so
    no lease is live, nothing settled or escalated it); of claim_reconcile_one's conditions,
    only the next lookup's moment is left."""
    return (
        current.updated_at == decided_on.updated_at
        and transition(current, rule).claim is ClaimKind.RESEND_AFTER_LOOKUP
    )
