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
from datetime import datetime
from typing import Any

from proxy.gate.checks import reconcile_required
from proxy.gate.classify import object_id_from
from proxy.gate.decision import Deny
from proxy.gate.lookup import (
    ask_provider,
    grace_remaining,
    grace_seconds_for,
    lookup_lease_seconds,
)
from proxy.gate.reasons import Reason
from proxy.policy.model import Provider, Reconcile
from proxy.runtime import Gateway
from proxy.store.operation import Operation, Status
from proxy.store.store import ProviderAnswer


@dataclass(frozen=True)
class Cleared:
    """The re-send may be claimed. ``lookup_owner``: the reconciliation lease under which the
    provider showed no effect (None: the claim must rest on the key or on ``not_sent``);
    ``leased_at``: the row's ``updated_at`` once that lease was taken (the lease's own write),
    which a claim that needs the row unchanged compares with."""

    lookup_owner: str | None
    leased_at: datetime | None = None


async def ask_before_resend(
    gw: Gateway,
    provider: Provider,
    reconcile: Reconcile,
    op: Operation,
    unchanged_since: datetime | None = None,
) -> Cleared | Operation | Deny:
    """Cleared to claim; or the operation as the lookup settled it; or a refusal.
    ``unchanged_since``: the row's ``updated_at`` as a precondition lookup saw it; the lease
    is taken only on the row unchanged since."""
    window = provider.dedup_window_for(provider.rule_named(op.action))
    owner = f"{gw.settings.instance_id}:resend:{secrets.token_hex(4)}"
    lease = lookup_lease_seconds(provider, reconcile, gw.settings.lease_margin_seconds)
    taken = await gw.store.claim_reconcile_one(
        op.operation_id, owner, lease, in_doubt=True, unchanged_since=unchanged_since
    )
    if taken is None:
        current = await gw.store.load(op.operation_id) or op
        if not _only_paced(current, op):
            return Cleared(None)  # it moved on: the claim fails and is explained from the row
        # Asked too recently: the re-send waits for the next lookup rather than rest on the
        # key alone; the provider may have shown the effect since.
        due_in = _seconds_until(current, current.next_reconcile_at)
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
        return Cleared(owner, taken.updated_at)
    retry_in: float = wait if asked.all_absent_conclusively() else reconcile.retry_seconds
    await gw.store.reconcile_inconclusive(
        op.operation_id, owner, retry_in, evidence, expected_attempts=taken.attempts
    )
    if taken.key_deduplicated(window) and not in_doubt:
        return Cleared(None)
    return reconcile_required(provider, taken, max(1, math.ceil(retry_in)))


def _only_paced(current: Operation, decided_on: Operation) -> bool:
    """The row is as the decision saw it, and only the pacing kept the lookup from starting."""
    in_doubt = current.status is Status.CREATED and current.lookup_before_send is not None
    return (
        (current.status is Status.DISPATCHED or in_doubt)
        and current.attempts == decided_on.attempts
        and current.escalated_at is None
        and not current.lease_is_live()
        and not current.reconciliation_is_live()
    )


def _seconds_until(op: Operation, moment: datetime | None) -> int:
    if moment is None:
        return 1
    return max(1, math.ceil((moment - op.read_at).total_seconds()))
