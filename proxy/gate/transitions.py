"""May this operation be sent now? One decision from the row read from the primary and the
claim rule, made here once, for the gate, recovery, the console and MCP.

``transition`` names the row's transition, the first of these that holds:

    transition             the gate (``decision``)                 recovery (``advice``)
    confirmed              replay the stored answer                proceed
    failed                 refuse operation_failed                 new_approval_required
    revoked / expired      refuse approval_revoked / _expired      (a) below
    escalated              refuse operation_escalated              escalated
    first                  claim FIRST                             send
    attempt_in_flight      refuse operation_in_flight              wait
    reconciling            refuse operation_in_flight              wait
    in_doubt               claim RESEND_AFTER_LOOKUP               retry (wait: no lookup due)
    in_doubt_unverifiable  refuse operation_escalated, escalate    retry (wait: no lookup due)
    resend_not_sent        claim RESEND                            retry
    ask_then_resend        claim RESEND_AFTER_LOOKUP               retry
    ask_before_resend      claim RESEND_AFTER_LOOKUP               reconcile (b)
    resend_deduplicated    claim RESEND                            retry
    reconcile_required     refuse reconcile_required               reconcile

The claim statement (queries.sql ``claim_operation``) commits the claiming transitions: it claims
FIRST, RESEND and ``ask_then_resend`` (whose lookup may fall back on the key) as they are, and
the other RESEND_AFTER_LOOKUP transitions only for the holder of a live lookup lease under which
the provider showed no effect (proxy/gate/resend.py); it claims nothing the gate refuses.
tests/gate/test_transitions_agree.py drives every state and rule through both and checks it.
It commits only the decision made here, on the row as read (``commit_guard``): the row's version
then (its ``updated_at``, which every statement that writes the row moves) and the decision's
deadline (the approval's expiry, the lookup lease it rests on, and its own lifetime). A row that
changed since, or a deadline passed, claims nothing: the caller reads the row again and says
why (``decision_stale``), and decides afresh only on a new request.

Where the gate and recovery say different things of one state, this is why:
(a) The approval ended: the gate names what stops the send; recovery says what to do about
    the row, as if the approval stood: escalated stays escalated; nothing sent (created) needs
    a new approval; an attempt or a lookup in flight is waited for; anything else that may have
    left is reconciled, never re-sent.
(b) Outcome unknown at a provider that no longer deduplicates the key (or never did), under a
    rule that declares lookups: the gate forwards a re-send that arrives, because it asks the
    provider first, under a lease, and sends only on a conclusive "absent" (else it refuses
    reconcile_required). The agent is not told to re-send what only that lookup can clear: it
    is told ``reconcile``, and its own read of the operation asks the provider (recovery/api.py
    ``reconcile_now``), which settles the row, or clears it for the re-send a ``retry`` then
    tells.
(c) A row a failover put in doubt (``lookup_before_send``): the gate asks the provider before
    it sends (``in_doubt``) or, where the rule declares no lookup, refuses and escalates it to a
    human; recovery tells ``retry`` either way (or ``wait`` until the next lookup is due), since
    the re-send through opgate is what asks, or escalates.
(d) A failed precondition's evidence (recovery only, from the row's events): an operation of
    which nothing has left is told ``new_approval_required``; the gate asks the provider again
    at its next send (proxy/gate/preconditions.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from proxy.gate.decision import ClaimKind, Decision, Deny, Forward, Replay
from proxy.gate.reasons import Reason
from proxy.policy.model import Provider
from proxy.store.operation import LastOutcome, Operation, Status


class Kind(StrEnum):
    CONFIRMED = "confirmed"
    FAILED = "failed"
    REVOKED = "revoked"
    EXPIRED = "expired"
    ESCALATED = "escalated"
    FIRST = "first"
    ATTEMPT_IN_FLIGHT = "attempt_in_flight"
    RECONCILING = "reconciling"
    IN_DOUBT = "in_doubt"
    IN_DOUBT_UNVERIFIABLE = "in_doubt_unverifiable"
    RESEND_NOT_SENT = "resend_not_sent"
    ASK_THEN_RESEND = "ask_then_resend"
    ASK_BEFORE_RESEND = "ask_before_resend"
    RESEND_DEDUPLICATED = "resend_deduplicated"
    RECONCILE_REQUIRED = "reconcile_required"


# The claim each claiming transition asks of queries.sql claim_operation.
CLAIMS: dict[Kind, ClaimKind] = {
    Kind.FIRST: ClaimKind.FIRST,
    Kind.IN_DOUBT: ClaimKind.RESEND_AFTER_LOOKUP,
    Kind.RESEND_NOT_SENT: ClaimKind.RESEND,
    Kind.ASK_THEN_RESEND: ClaimKind.RESEND_AFTER_LOOKUP,
    Kind.ASK_BEFORE_RESEND: ClaimKind.RESEND_AFTER_LOOKUP,
    Kind.RESEND_DEDUPLICATED: ClaimKind.RESEND,
}
# The claiming transitions the statement commits without a lookup (the others need the lookup
# lease: claim_operation's after_lookup_by).
CLAIMED_WITHOUT_LOOKUP = frozenset(
    {Kind.FIRST, Kind.RESEND_NOT_SENT, Kind.ASK_THEN_RESEND, Kind.RESEND_DEDUPLICATED}
)


@dataclass(frozen=True)
class ClaimRule:
    """What the provider and the operation's rule can do for a re-send: deduplicate it by its
    key, for how long after creation (None: never relied on); look the effect up
    (the rule's ``reconcile``); send the key at all."""

    provider: str
    dedup_window_seconds: float | None
    lookups: bool
    sends_key: bool = True

    @classmethod
    def of(cls, provider: Provider | None, action: str) -> ClaimRule:
        """``action``'s rule at ``provider`` (a policy reloaded without either: no lookups,
        the provider's deduplication, or none)."""
        if provider is None:
            return cls("", None, lookups=False)
        rule = provider.rule_named(action)
        return cls(
            provider.provider,
            provider.dedup_window_for(rule),
            lookups=rule is not None and rule.reconcile is not None,
            sends_key=rule is None or provider.sends_key(rule),
        )


@dataclass(frozen=True)
class Transition:
    """The row's transition, why, and when to ask again (``wait_until``: a lease's end).
    ``beneath``: for an ended approval, the transition the row would have if it stood."""

    kind: Kind
    reason: str
    wait_until: datetime | None = None
    beneath: Transition | None = None

    @property
    def claim(self) -> ClaimKind | None:
        return CLAIMS.get(self.kind)


def transition(op: Operation, rule: ClaimRule) -> Transition:
    """The transition ``op`` (the row as read from the primary) allows now under ``rule``."""
    if op.status is Status.CONFIRMED:
        return Transition(Kind.CONFIRMED, f"confirmed ({op.settled_reason or 'provider_answer'})")
    if op.status is Status.FAILED:
        return Transition(Kind.FAILED, "the provider refused this operation")
    if op.revoked_at is not None:
        return Transition(Kind.REVOKED, op.revoked_reason or "revoked", None, _by_row(op, rule))
    if op.expires_at <= op.read_at:
        expired = f"the approval expired at {op.expires_at.isoformat()}"
        return Transition(Kind.EXPIRED, expired, None, _by_row(op, rule))
    return _by_row(op, rule)


def _by_row(op: Operation, rule: ClaimRule) -> Transition:
    """The transition of an unsettled row whose approval stands."""
    if op.escalated_at is not None:  # dispatched, or created and in doubt after a switch
        return Transition(Kind.ESCALATED, op.escalation_reason or "escalated to a human")
    if op.status is Status.CREATED and op.lookup_before_send is None:
        return Transition(Kind.FIRST, "nothing was sent yet")
    if op.lease_is_live():
        return Transition(Kind.ATTEMPT_IN_FLIGHT, "another attempt is in flight", op.lease_until)
    if op.reconciliation_is_live():
        reconciling = "opgate is reconciling it with the provider"
        return Transition(Kind.RECONCILING, reconciling, op.reconcile_lease_until)
    if op.lookup_before_send is not None:
        # A timeline switch put it in doubt: the lost timeline may have claimed and sent it,
        # whatever the row says now. Only the provider can tell.
        if rule.lookups:
            return Transition(Kind.IN_DOUBT, _switched(op) + ": the provider is asked first")
        return Transition(Kind.IN_DOUBT_UNVERIFIABLE, _switched(op) + _UNVERIFIABLE)
    if op.last_outcome == LastOutcome.NOT_SENT:
        return Transition(Kind.RESEND_NOT_SENT, "the last attempt never reached the provider")
    deduplicated = op.key_deduplicated(rule.dedup_window_seconds)
    if rule.lookups and deduplicated:
        return Transition(Kind.ASK_THEN_RESEND, "outcome unknown; the provider is asked first")
    if rule.lookups:
        return Transition(Kind.ASK_BEFORE_RESEND, "outcome unknown; the provider is asked first")
    if deduplicated:
        return Transition(Kind.RESEND_DEDUPLICATED, "the provider deduplicates on the key")
    return Transition(Kind.RECONCILE_REQUIRED, reconcile_reason(rule, op))


_UNVERIFIABLE = (
    " while this operation was approved: it may have been sent on the lost timeline, and "
    "its rule declares no lookup to ask the provider; it is escalated to a human"
)


def _switched(op: Operation) -> str:
    assert op.lookup_before_send is not None
    return (
        f"opgate's database switched timeline (a failover) at {op.lookup_before_send.isoformat()}"
    )


def reconcile_reason(rule: ClaimRule, op: Operation) -> str:
    """Why a re-send could duplicate the effect."""
    if not rule.sends_key:
        why = f"this {rule.provider} call carries no idempotency key: a re-send could act twice"
    elif rule.dedup_window_seconds is None:
        why = f"{rule.provider} does not deduplicate on its idempotency key"
    else:
        why = (
            f"{rule.provider} no longer deduplicates this key "
            f"({rule.dedup_window_seconds:g} s after creation)"
        )
    return f"the last attempt ended {op.last_outcome or 'without an answer'}; {why}"


# --- reconciliation: what the holder of a row's reconciliation lease does with it ------------
class Reconciling(StrEnum):
    """What reconciliation (proxy/recovery/reconcile.py) does with a dispatched row whose
    reconciliation lease it holds, decided on the transition the row has for anyone else (as
    if the lease were free), so that it leaves to the agent exactly what the gate would send:

        give_back           in doubt after a timeline switch, never sent here, approval
                            standing: the agent's send asks the provider first (in_doubt),
                            which a paced lookup here would hold up until expiry
        leave_until_expiry  never sent, approval standing (resend_not_sent): the agent may
                            still send it
        no_effect           never sent, approval ended (beneath: resend_not_sent): nothing
                            left and nothing may leave any more; settled failed, unasked
        leave_while_deduplicated
                            no lookup declared, the provider still deduplicates the key
                            (resend_deduplicated): the agent's re-send is safe while it does
        escalate            no lookup declared, and nothing else: a human decides (a row in
                            doubt after a timeline switch included, key or no key: the gate
                            escalates it at the agent's next send, in_doubt_unverifiable)
        look_up             the rule declares lookups: the provider is asked
    """

    GIVE_BACK = "give_back"
    LEAVE_UNTIL_EXPIRY = "leave_until_expiry"
    NO_EFFECT = "no_effect"
    LEAVE_WHILE_DEDUPLICATED = "leave_while_deduplicated"
    ESCALATE = "escalate"
    LOOK_UP = "look_up"


def reconciling(op: Operation, rule: ClaimRule) -> Reconciling:
    """What reconciliation does with ``op`` (dispatched, not escalated: an escalated row is
    only looked at again), whose reconciliation lease the caller holds."""
    step = transition(replace(op, reconcile_lease_until=None), rule)
    never_sent = op.last_outcome == LastOutcome.NOT_SENT
    if step.kind in (Kind.IN_DOUBT, Kind.IN_DOUBT_UNVERIFIABLE) and never_sent:
        return Reconciling.GIVE_BACK
    if step.kind is Kind.RESEND_NOT_SENT:
        return Reconciling.LEAVE_UNTIL_EXPIRY
    if step.beneath is not None and step.beneath.kind is Kind.RESEND_NOT_SENT:
        return Reconciling.NO_EFFECT
    if rule.lookups:
        return Reconciling.LOOK_UP
    if step.kind is Kind.RESEND_DEDUPLICATED:
        return Reconciling.LEAVE_WHILE_DEDUPLICATED
    return Reconciling.ESCALATE


# --- committing a decision: on the row as read, before its deadline --------------------------
@dataclass(frozen=True)
class CommitGuard:
    """What the statement committing a transition decided on a read requires: the row's
    version as read (``updated_at``), and the moment after which the decision is stale (on the
    database's clock, as ``read_at`` is)."""

    read_version: datetime
    decided_before: datetime


def commit_guard(
    op: Operation, lifetime_seconds: float, lease_until: datetime | None = None
) -> CommitGuard:
    """The guard of a decision made on ``op`` (the row as read): unchanged since, and before
    the earliest of the approval's expiry, ``lifetime_seconds`` after the read (how long the
    decider may take to commit: a decision older than that rests on facts that time alone may
    have changed, leases lapsed, a key's deduplication ended), and the end of the lookup lease
    the decision rests on (``lease_until``)."""
    deadline = min(op.expires_at, op.read_at + timedelta(seconds=lifetime_seconds))
    if lease_until is not None:
        deadline = min(deadline, lease_until)
    return CommitGuard(op.updated_at, deadline)


def stale_reason(guard: CommitGuard, current: Operation) -> str | None:
    """Why a decision guarded by ``guard`` no longer holds of ``current`` (the row read again
    after its commit claimed nothing); None: it still would."""
    if current.updated_at != guard.read_version:
        return (
            f"the operation changed while this request was decided (read at version "
            f"{guard.read_version.isoformat()}, now {current.updated_at.isoformat()})"
        )
    if current.read_at >= guard.decided_before:
        return (
            f"the decision was stale before it could commit (its deadline "
            f"{guard.decided_before.isoformat()} passed)"
        )
    return None


# --- the gate: what a request identical to the approval gets ---------------------------------
_REFUSALS: dict[Kind, Reason] = {
    Kind.FAILED: Reason.OPERATION_FAILED,
    Kind.REVOKED: Reason.APPROVAL_REVOKED,
    Kind.EXPIRED: Reason.APPROVAL_EXPIRED,
    Kind.ESCALATED: Reason.OPERATION_ESCALATED,
    Kind.ATTEMPT_IN_FLIGHT: Reason.OPERATION_IN_FLIGHT,
    Kind.RECONCILING: Reason.OPERATION_IN_FLIGHT,
    Kind.IN_DOUBT_UNVERIFIABLE: Reason.OPERATION_ESCALATED,  # and the gate escalates it
    Kind.RECONCILE_REQUIRED: Reason.RECONCILE_REQUIRED,
}


def decision(step: Transition, op: Operation) -> Decision:
    """The gate's decision for ``step`` of ``op``."""
    if step.kind is Kind.CONFIRMED:
        return Replay()
    claim = step.claim
    if claim is not None:
        return Forward(claim)
    wait = None if step.wait_until is None else seconds_until(op, step.wait_until)
    return Deny(_REFUSALS[step.kind], step.reason, wait)


# --- recovery: what the agent is told to do next ---------------------------------------------
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


def advice(
    step: Transition,
    op: Operation,
    rule: ClaimRule,
    precondition_failure: dict[str, Any] | None = None,
) -> Advice:
    """Recovery's advice for ``step`` of ``op`` (``precondition_failure``: (d) above)."""
    kind = step.kind
    if kind is Kind.CONFIRMED:
        return Advice(NextAction.PROCEED, step.reason)
    if kind is Kind.FAILED:
        why = {
            "no_effect": "reconciled: the provider has no effect of this operation",
            "human_verdict": "a human settled it as failed",
        }.get(op.settled_reason or "", "the provider refused it")
        return Advice(NextAction.NEW_APPROVAL_REQUIRED, why)
    if step.beneath is not None:  # (a)
        return _approval_ended(step.beneath, op)
    if kind is Kind.ESCALATED:
        return _escalated(op)
    if kind in (Kind.ATTEMPT_IN_FLIGHT, Kind.RECONCILING):
        return _wait(step, op)
    if kind in (Kind.IN_DOUBT, Kind.IN_DOUBT_UNVERIFIABLE):  # (c)
        return _after_timeline_switch(op)
    if precondition_failure is not None and op.nothing_left():  # (d)
        return Advice(
            NextAction.NEW_APPROVAL_REQUIRED,
            "nothing was sent: the provider no longer shows what the approval assumed",
            evidence=precondition_failure,
        )
    if kind is Kind.FIRST:
        return Advice(NextAction.SEND, "nothing was sent yet: send exactly the approved request")
    if kind is Kind.RESEND_NOT_SENT:
        return Advice(NextAction.RETRY, "the last attempt never reached the provider")
    if kind in (Kind.ASK_THEN_RESEND, Kind.RESEND_DEDUPLICATED):
        return Advice(
            NextAction.RETRY,
            "outcome unknown; the provider deduplicates on the key, so a re-send is safe",
        )
    # ask_before_resend (b), reconcile_required
    why = (
        "the provider does not deduplicate"
        if rule.dedup_window_seconds is None
        else "the provider no longer keeps the key"
    )
    return Advice(
        NextAction.RECONCILE,
        f"outcome unknown and {why}",
        seconds_until(op, op.next_reconcile_at),
    )


def _approval_ended(beneath: Transition, op: Operation) -> Advice:
    if beneath.kind is Kind.ESCALATED:
        return _escalated(op)
    if op.status is Status.CREATED:
        return Advice(
            NextAction.NEW_APPROVAL_REQUIRED,
            "nothing was sent, and the approval was revoked or has expired",
        )
    if beneath.kind in (Kind.ATTEMPT_IN_FLIGHT, Kind.RECONCILING):
        return _wait(beneath, op)
    return Advice(
        NextAction.RECONCILE,
        "outcome unknown and the approval no longer stands: it is reconciled, never re-sent",
        seconds_until(op, op.next_reconcile_at),
    )


def _escalated(op: Operation) -> Advice:
    assert op.escalated_at is not None
    return Advice(
        NextAction.ESCALATED,
        f"escalated since {op.escalated_at.isoformat()}: {op.escalation_reason}",
    )


def _wait(step: Transition, op: Operation) -> Advice:
    said = {
        Kind.ATTEMPT_IN_FLIGHT: "an attempt is in flight",
        Kind.RECONCILING: "opgate is reconciling with the provider",
    }[step.kind]
    return Advice(NextAction.WAIT, said, seconds_until(op, step.wait_until))


def _after_timeline_switch(op: Operation) -> Advice:
    assert op.lookup_before_send is not None
    since = op.lookup_before_send.isoformat()
    if op.next_reconcile_at is not None and op.next_reconcile_at > op.read_at:
        return Advice(
            NextAction.WAIT,
            f"opgate's database failed over at {since}: the provider is asked before this "
            "operation is sent again, and the next lookup is not due yet",
            seconds_until(op, op.next_reconcile_at),
        )
    return Advice(
        NextAction.RETRY,
        f"opgate's database failed over at {since} and may have lost a send of this operation: "
        "re-send the identical request; opgate asks the provider first and replays the effect "
        "if it exists (where the rule declares no lookup, it escalates it to a human instead)",
    )


def seconds_until(op: Operation, moment: datetime | None) -> int:
    """Whole seconds from the row's read to ``moment``, at least 1 (None: 1)."""
    if moment is None:
        return 1
    return max(1, math.ceil((moment - op.read_at).total_seconds()))
