"""The recovery protocol a replacement agent follows: one pure function from the authoritative
row to what it may do next. The agent's memory and judgement are not inputs.

    proceed                confirmed: record the provider's answer and move on
    send                   created, approval stands: nothing was sent yet; send exactly it
    wait                   an attempt (or a reconciliation) is in flight: ask again later
    retry                  unknown outcome, nothing in flight, approval stands, and either
                           nothing was sent or the provider deduplicates on the key: re-send
                           the identical request (opgate uses the same key)
    reconcile              unknown outcome and a re-send could duplicate (or the approval no
                           longer stands): opgate must ask the provider first
    new_approval_required  failed with no effect (or never sent and no longer approved):
                           a new attempt needs a new approved operation that supersedes this one
    escalated              a human must decide
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from proxy.store.operation import LastOutcome, Operation, Status


class NextAction(StrEnum):
    PROCEED = "proceed"
    SEND = "send"
    WAIT = "wait"
    RETRY = "retry"
    RECONCILE = "reconcile"
    NEW_APPROVAL_REQUIRED = "new_approval_required"
    ESCALATED = "escalated"


@dataclass(frozen=True)
class Advice:
    action: NextAction
    reason: str
    retry_after_seconds: int | None = None


def next_action(op: Operation, *, provider_deduplicates: bool) -> Advice:
    if op.status is Status.CONFIRMED:
        return Advice(NextAction.PROCEED, f"confirmed ({op.settled_reason or 'provider_answer'})")
    if op.status is Status.FAILED:
        why = {
            "no_effect": "reconciled: the provider has no effect of this operation",
            "human_verdict": "a human settled it as failed",
        }.get(op.settled_reason or "", "the provider refused it")
        return Advice(NextAction.NEW_APPROVAL_REQUIRED, why)
    if op.escalated_at is not None:
        return Advice(
            NextAction.ESCALATED,
            f"escalated since {op.escalated_at.isoformat()}: {op.escalation_reason}",
        )
    if op.status is Status.CREATED:
        if not op.approval_stands():
            return Advice(
                NextAction.NEW_APPROVAL_REQUIRED,
                "nothing was sent, and the approval was revoked or has expired",
            )
        return Advice(NextAction.SEND, "nothing was sent yet: send exactly the approved request")
    if op.lease_is_live():
        return Advice(
            NextAction.WAIT, "an attempt is in flight", _seconds_until(op, op.lease_until)
        )
    if op.reconciliation_is_live():
        return Advice(
            NextAction.WAIT,
            "opgate is reconciling with the provider",
            _seconds_until(op, op.reconcile_lease_until),
        )
    if op.approval_stands():
        if op.last_outcome == LastOutcome.NOT_SENT:
            return Advice(NextAction.RETRY, "the last attempt never reached the provider")
        if provider_deduplicates:
            return Advice(
                NextAction.RETRY,
                "outcome unknown; the provider deduplicates on the key, so a re-send is safe",
            )
        return Advice(NextAction.RECONCILE, "outcome unknown and the provider does not deduplicate")
    return Advice(
        NextAction.RECONCILE,
        "outcome unknown and the approval no longer stands: it is reconciled, never re-sent",
    )


def _seconds_until(op: Operation, moment: datetime | None) -> int:
    if moment is None:
        return 1
    return max(1, math.ceil((moment - op.read_at).total_seconds()))
