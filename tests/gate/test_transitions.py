"""The transition module: the one place where the gate's and recovery's answers for a row are
derived, and where they differ, why."""

from __future__ import annotations

from datetime import timedelta

import proxy.gate.transitions
from proxy.gate.decision import ClaimKind, Deny, Forward
from proxy.gate.reasons import Reason
from proxy.gate.transitions import ClaimRule, Kind, NextAction, advice, decision, transition
from proxy.store.operation import LastOutcome, Status
from tests.support.operations import NOW, operation

UNKNOWN = operation(
    status=Status.DISPATCHED,
    attempts=1,
    last_outcome=LastOutcome.UNKNOWN_TIMEOUT,
    lease_until=NOW - timedelta(seconds=1),
    created_at=NOW - timedelta(hours=1),
)


def test_unknown_outcome_without_deduplication_is_asked_by_gate_reconciled_by_recovery() -> None:
    """Issue 39's known difference, pinned: the gate re-sends after its own lookup, recovery
    tells the agent to reconcile, and the module's docstring says why (b)."""
    rule = ClaimRule("fault", None, lookups=True)
    step = transition(UNKNOWN, rule)
    assert step.kind is Kind.ASK_BEFORE_RESEND
    assert decision(step, UNKNOWN) == Forward(ClaimKind.RESEND_AFTER_LOOKUP)
    assert advice(step, UNKNOWN, rule).action is NextAction.RECONCILE
    doc = proxy.gate.transitions.__doc__ or ""
    assert "ask_before_resend      claim RESEND_AFTER_LOOKUP               reconcile (b)" in doc
    assert "(b) Outcome unknown at a provider that no longer deduplicates" in doc


def test_while_the_key_is_deduplicated_both_say_resend() -> None:
    """With lookups and a key still deduplicated, the gate asks then re-sends and recovery says
    retry: they agree."""
    rule = ClaimRule("fault", 86400, lookups=True)
    step = transition(UNKNOWN, rule)
    assert step.kind is Kind.ASK_THEN_RESEND
    assert decision(step, UNKNOWN) == Forward(ClaimKind.RESEND_AFTER_LOOKUP)
    assert advice(step, UNKNOWN, rule).action is NextAction.RETRY


def test_an_ended_approval_is_refused_by_the_gate_and_advised_on_by_what_lies_beneath() -> None:
    """(a): an escalated, revoked row is refused as revoked and advised as escalated; an
    attempt in flight under a revoked approval is waited for."""
    rule = ClaimRule("fault", None, lookups=False)
    escalated = operation(
        status=Status.DISPATCHED, attempts=1, revoked_at=NOW, escalated_at=NOW, read_at=NOW
    )
    step = transition(escalated, rule)
    assert step.kind is Kind.REVOKED
    refused = decision(step, escalated)
    assert isinstance(refused, Deny)
    assert refused.reason is Reason.APPROVAL_REVOKED
    assert advice(step, escalated, rule).action is NextAction.ESCALATED
    in_flight = operation(
        status=Status.DISPATCHED,
        attempts=1,
        revoked_at=NOW,
        lease_until=NOW + timedelta(seconds=5),
    )
    waited = advice(transition(in_flight, rule), in_flight, rule)
    assert (waited.action, waited.retry_after_seconds) == (NextAction.WAIT, 5)


def test_every_transition_has_one_answer_for_the_gate() -> None:
    """Each transition either claims, replays, or refuses with a code: none is left without."""
    claiming = set(proxy.gate.transitions.CLAIMS)
    refusing = set(proxy.gate.transitions._REFUSALS)
    assert claiming.isdisjoint(refusing)
    assert claiming | refusing | {Kind.CONFIRMED} == set(Kind)
