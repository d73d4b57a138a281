"""The transition module: the one place where the gate's and recovery's answers for a row are
derived, and where they differ, why."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import proxy.gate.transitions
from proxy.gate.decision import ClaimKind, Deny, Forward
from proxy.gate.reasons import Reason
from proxy.gate.transitions import (
    ClaimRule,
    Kind,
    NextAction,
    Reconciling,
    advice,
    commit_guard,
    decision,
    reconciling,
    stale_reason,
    transition,
)
from proxy.store.operation import LastOutcome, Operation, Status
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


# --- reconciliation asks the module too -------------------------------------------------------
_WINDOWS = {"none": None, "kept": 86400.0, "lapsed": 60.0}  # the row was created an hour ago


def _leased_row(
    *,
    last_outcome: str | None = LastOutcome.UNKNOWN_TIMEOUT,
    revoked: bool = False,
    expired: bool = False,
    in_doubt: bool = False,
) -> Operation:
    """A dispatched row whose reconciliation lease the caller holds, as the reconciler gets it
    (its attempt over, not escalated)."""
    return operation(
        status=Status.DISPATCHED,
        attempts=1,
        unsent_attempts=1 if last_outcome == LastOutcome.NOT_SENT else 0,
        last_outcome=last_outcome,
        lease_until=NOW - timedelta(seconds=1),
        reconcile_lease_until=NOW + timedelta(seconds=30),
        revoked_at=NOW - timedelta(minutes=1) if revoked else None,
        expires_at=NOW + (timedelta(minutes=-1) if expired else timedelta(minutes=5)),
        lookup_before_send=NOW - timedelta(minutes=1) if in_doubt else None,
        created_at=NOW - timedelta(hours=1),
    )


RECONCILING_CASES = {
    "in doubt, never sent, approved: given back": (
        _leased_row(last_outcome=LastOutcome.NOT_SENT, in_doubt=True),
        ClaimRule("fault", None, lookups=True),
        Reconciling.GIVE_BACK,
    ),
    "in doubt, never sent, revoked: looked up": (
        _leased_row(last_outcome=LastOutcome.NOT_SENT, in_doubt=True, revoked=True),
        ClaimRule("fault", None, lookups=True),
        Reconciling.LOOK_UP,
    ),
    "never sent, approved: left to the agent": (
        _leased_row(last_outcome=LastOutcome.NOT_SENT),
        ClaimRule("fault", None, lookups=True),
        Reconciling.LEAVE_UNTIL_EXPIRY,
    ),
    "never sent, expired: no effect": (
        _leased_row(last_outcome=LastOutcome.NOT_SENT, expired=True),
        ClaimRule("fault", None, lookups=True),
        Reconciling.NO_EFFECT,
    ),
    "unknown, lookups: looked up": (
        _leased_row(),
        ClaimRule("fault", 86400.0, lookups=True),
        Reconciling.LOOK_UP,
    ),
    "unknown, no lookup, key kept: left while deduplicated": (
        _leased_row(),
        ClaimRule("fault", 86400.0, lookups=False),
        Reconciling.LEAVE_WHILE_DEDUPLICATED,
    ),
    "unknown, no lookup, key lapsed: escalated": (
        _leased_row(),
        ClaimRule("fault", 60.0, lookups=False),
        Reconciling.ESCALATE,
    ),
    "unknown, no lookup, key kept, revoked: escalated": (
        _leased_row(revoked=True),
        ClaimRule("fault", 86400.0, lookups=False),
        Reconciling.ESCALATE,
    ),
}


@pytest.mark.parametrize("scenario", sorted(RECONCILING_CASES))
def test_reconciliation_decides_on_the_rows_transition(scenario: str) -> None:
    """What reconciliation does with a leased row, named by scenario."""
    op, rule, expected = RECONCILING_CASES[scenario]
    assert reconciling(op, rule) is expected


def _reconciling_as_written_before(op: Operation, rule: ClaimRule) -> Reconciling:
    """The rule proxy/recovery/reconcile.py wrote out itself before it asked the module."""
    never_sent = op.last_outcome == LastOutcome.NOT_SENT
    if never_sent and op.lookup_before_send is not None and op.approval_stands():
        return Reconciling.GIVE_BACK
    if never_sent and op.lookup_before_send is None:
        return Reconciling.LEAVE_UNTIL_EXPIRY if op.approval_stands() else Reconciling.NO_EFFECT
    if rule.lookups:
        return Reconciling.LOOK_UP
    if op.key_deduplicated(rule.dedup_window_seconds) and op.approval_stands():
        return Reconciling.LEAVE_WHILE_DEDUPLICATED
    return Reconciling.ESCALATE


@settings(max_examples=400, deadline=None)
@given(
    last_outcome=st.sampled_from([None, LastOutcome.NOT_SENT, LastOutcome.UNKNOWN_TIMEOUT]),
    revoked=st.booleans(),
    expired=st.booleans(),
    in_doubt=st.booleans(),
    window=st.sampled_from(sorted(_WINDOWS)),
    lookups=st.booleans(),
)
def test_reconciliation_answers_as_it_did_before_it_asked_the_module(
    last_outcome: str | None,
    revoked: bool,
    expired: bool,
    in_doubt: bool,
    window: str,
    lookups: bool,
) -> None:
    """Every leased row and rule: the module's answer is the one reconcile.py wrote out before,
    but for one row, said in the module: in doubt after a timeline switch, no lookup, the key
    still deduplicated, approved, sent: escalated at once, as the gate would at the agent's
    next send, rather than left to the agent."""
    op = _leased_row(last_outcome=last_outcome, revoked=revoked, expired=expired, in_doubt=in_doubt)
    rule = ClaimRule("fault", _WINDOWS[window], lookups=lookups)
    before = _reconciling_as_written_before(op, rule)
    if before is Reconciling.LEAVE_WHILE_DEDUPLICATED and in_doubt:
        assert reconciling(op, rule) is Reconciling.ESCALATE
        assert transition(op, rule).kind is Kind.RECONCILING  # the lease is the caller's
        return
    assert reconciling(op, rule) is before


# --- the commit's guard: the row's version as read, the decision's deadline -------------------
GUARD_CASES = {
    "the decision's own lifetime first": (
        operation(expires_at=NOW + timedelta(minutes=5)),
        30.0,
        None,
        NOW + timedelta(seconds=30),
    ),
    "the approval's expiry first": (
        operation(expires_at=NOW + timedelta(seconds=10)),
        30.0,
        None,
        NOW + timedelta(seconds=10),
    ),
    "the lookup lease's end first": (
        operation(expires_at=NOW + timedelta(minutes=5)),
        30.0,
        NOW + timedelta(seconds=20),
        NOW + timedelta(seconds=20),
    ),
}


@pytest.mark.parametrize("scenario", sorted(GUARD_CASES))
def test_a_decisions_deadline_is_the_earliest_fact_time_alone_changes(scenario: str) -> None:
    """The deadline is the earliest of the approval's expiry, the decision's lifetime after
    the read, and the lookup lease it rests on; the version is the row's updated_at."""
    op, lifetime, lease_until, deadline = GUARD_CASES[scenario]
    guard = commit_guard(op, lifetime, lease_until)
    assert (guard.read_version, guard.decided_before) == (op.updated_at, deadline)


def test_a_re_read_row_says_why_a_decision_went_stale() -> None:
    """Read again after a claim that claimed nothing: a moved version, a passed deadline, or
    neither (then the statement disagreed: claim_refused, not stale)."""
    op = operation()
    guard = commit_guard(op, 30.0)
    moved = stale_reason(guard, replace(op, updated_at=NOW + timedelta(microseconds=1)))
    assert moved is not None
    assert moved.startswith("the operation changed while this request was decided")
    late = stale_reason(guard, replace(op, read_at=NOW + timedelta(seconds=30)))
    assert late is not None
    assert late.startswith("the decision was stale before it could commit")
    assert stale_reason(guard, replace(op, read_at=NOW + timedelta(seconds=29))) is None
