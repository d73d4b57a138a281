"""The recovery protocol a replacement agent follows: one pure function from the authoritative
row to what it may do next. The agent's memory and judgement are not inputs.

    proceed                confirmed: record the provider's answer and move on
    send                   created, approval stands: nothing was sent yet; send exactly it
    wait                   an attempt (or a reconciliation) is in flight: ask again later
    retry                  unknown outcome, nothing in flight, approval stands, and either
                           nothing was sent or the provider still deduplicates the key (within
                           its retention): re-send the identical request (opgate uses the same
                           key, and asks the provider first where the rule declares lookups)
    reconcile              unknown outcome and a re-send could duplicate (or the approval no
                           longer stands): opgate asks the provider, at the rule's pace;
                           ask again after ``retry_after_seconds``
    new_approval_required  failed with no effect (or never sent and no longer approved, or
                           never sent because the rule's preconditions no longer held at the
                           provider, before its first send or before a re-send after attempts
                           that never left: ``evidence`` says what the lookup showed): a new
                           attempt needs a new approved operation that supersedes this one
    escalated              a human must decide

An operation that opgate's database may have lost a claim of (``lookup_before_send``: it was
created or dispatched when a failover switched the database's timeline) is never told plain
``send``: it is told ``retry`` (re-send the identical request; opgate asks the provider first,
replays the effect if the lost timeline sent it, and sends only if the provider conclusively
has none; a rule without lookups escalates it instead), or ``wait`` while that lookup is not
due yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

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
    evidence: dict[str, Any] | None = None  # what a failed precondition's lookup showed


def next_action(
    op: Operation,
    *,
    dedup_window_seconds: float | None,
    precondition_failure: dict[str, Any] | None = None,
) -> Advice:
    """``dedup_window_seconds``: how long after creation the provider deduplicates a re-send
    with the operation's key (None: it does not). ``precondition_failure``: the evidence of
    the latest failed precondition of an operation of which nothing has left (its
    ``precondition_failed`` event since its last claim), if any."""
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
    in_doubt = _after_timeline_switch(op)
    if in_doubt is not None:
        return in_doubt
    if op.status is Status.CREATED:
        if not op.approval_stands():
            return Advice(
                NextAction.NEW_APPROVAL_REQUIRED,
                "nothing was sent, and the approval was revoked or has expired",
            )
        if precondition_failure is not None:
            return _preconditions_failed(precondition_failure)
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
        if op.nothing_left() and precondition_failure is not None:
            return _preconditions_failed(precondition_failure)
        if op.last_outcome == LastOutcome.NOT_SENT:
            return Advice(NextAction.RETRY, "the last attempt never reached the provider")
        if op.key_deduplicated(dedup_window_seconds):
            return Advice(
                NextAction.RETRY,
                "outcome unknown; the provider deduplicates on the key, so a re-send is safe",
            )
        why = (
            "the provider does not deduplicate"
            if dedup_window_seconds is None
            else "the provider no longer keeps the key"
        )
        return Advice(
            NextAction.RECONCILE,
            f"outcome unknown and {why}",
            _seconds_until(op, op.next_reconcile_at),
        )
    return Advice(
        NextAction.RECONCILE,
        "outcome unknown and the approval no longer stands: it is reconciled, never re-sent",
        _seconds_until(op, op.next_reconcile_at),
    )


def _after_timeline_switch(op: Operation) -> Advice | None:
    """The advice for a row a timeline switch put in doubt, while its approval stands and
    nothing is in flight (None otherwise: the row's state says it)."""
    if op.lookup_before_send is None or not op.approval_stands():
        return None
    if op.lease_is_live() or op.reconciliation_is_live():
        return None
    since = op.lookup_before_send.isoformat()
    if op.next_reconcile_at is not None and op.next_reconcile_at > op.read_at:
        return Advice(
            NextAction.WAIT,
            f"opgate's database failed over at {since}: the provider is asked before this "
            "operation is sent again, and the next lookup is not due yet",
            _seconds_until(op, op.next_reconcile_at),
        )
    return Advice(
        NextAction.RETRY,
        f"opgate's database failed over at {since} and may have lost a send of this operation: "
        "re-send the identical request; opgate asks the provider first and replays the effect "
        "if it exists (where the rule declares no lookup, it escalates it to a human instead)",
    )


def _preconditions_failed(evidence: dict[str, Any]) -> Advice:
    return Advice(
        NextAction.NEW_APPROVAL_REQUIRED,
        "nothing was sent: the provider no longer shows what the approval assumed",
        evidence=evidence,
    )


def _seconds_until(op: Operation, moment: datetime | None) -> int:
    if moment is None:
        return 1
    return max(1, math.ceil((moment - op.read_at).total_seconds()))
