"""``next_action``: the recovery protocol as one pure function, over every combination of
status, lease, outcome, approval state and provider capability."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from itertools import product
from typing import Any

import pytest

from proxy.gate.transitions import ClaimRule
from proxy.recovery.next_action import NextAction, next_action
from proxy.store.operation import LastOutcome, Status
from tests.support.operations import NOW, operation

LIVE = NOW + timedelta(seconds=7)


def _rule(window: float | None) -> ClaimRule:
    """The fault provider's rule, deduplicating for ``window`` seconds, declaring no lookups."""
    return ClaimRule("fault", window, lookups=False)


PAST = NOW - timedelta(seconds=1)

STATUSES = [Status.CREATED, Status.DISPATCHED, Status.CONFIRMED, Status.FAILED]
LEASES = {"no lease": None, "live lease": LIVE, "expired lease": PAST}
OUTCOMES = {
    "in progress": None,
    "not sent": LastOutcome.NOT_SENT,
    "timeout": LastOutcome.UNKNOWN_TIMEOUT,
    "5xx": LastOutcome.UNKNOWN_STATUS,
}
APPROVALS = {
    "approval stands": {},
    "revoked": {"revoked_at": PAST, "revoked_reason": "no"},
    "expired": {"expires_at": PAST},
}
ESCALATION = {"not escalated": {}, "escalated": {"escalated_at": PAST, "escalation_reason": "x"}}
RECONCILING = {"not reconciling": None, "reconciling": LIVE}
# The provider's deduplication window: a day (Stripe), or none.
DEDUPE: dict[str, float | None] = {"deduplicates": 86400.0, "does not deduplicate": None}


def expected(
    status: Status,
    lease: datetime | None,
    outcome: LastOutcome | None,
    approval: str,
    escalated: bool,
    reconciling: bool,
    dedupe: bool,
) -> NextAction:
    """The protocol, written as the issue states it (independently of the implementation)."""
    stands = approval == "approval stands"
    if status is Status.CONFIRMED:
        return NextAction.PROCEED
    if status is Status.FAILED:
        return NextAction.NEW_APPROVAL_REQUIRED
    if escalated:
        return NextAction.ESCALATED
    if status is Status.CREATED:
        return NextAction.SEND if stands else NextAction.NEW_APPROVAL_REQUIRED
    if lease == LIVE or reconciling:
        return NextAction.WAIT
    if stands and (outcome is LastOutcome.NOT_SENT or dedupe):
        return NextAction.RETRY
    return NextAction.RECONCILE


CASES = list(product(STATUSES, LEASES, OUTCOMES, APPROVALS, ESCALATION, RECONCILING, DEDUPE))


@pytest.mark.parametrize(
    ("status", "lease", "outcome", "approval", "escalation", "reconciling", "dedupe"),
    CASES,
    ids=["/".join(str(part) for part in case) for case in CASES],
)
def test_next_action_follows_the_protocol(
    status: Status,
    lease: str,
    outcome: str,
    approval: str,
    escalation: str,
    reconciling: str,
    dedupe: str,
) -> None:
    """Every state maps to exactly the action the protocol prescribes, with a reason."""
    op = operation(
        status=status,
        lease_until=LEASES[lease],
        last_outcome=OUTCOMES[outcome],
        reconcile_lease_until=RECONCILING[reconciling],
        **APPROVALS[approval],
        **ESCALATION[escalation],
    )
    advice = next_action(op, _rule(DEDUPE[dedupe]))
    assert advice.action is expected(
        status,
        LEASES[lease],
        OUTCOMES[outcome],
        approval,
        escalation == "escalated",
        reconciling == "reconciling",
        DEDUPE[dedupe] is not None,
    )
    assert advice.reason
    if advice.action is NextAction.WAIT:
        assert advice.retry_after_seconds == 7
    elif advice.action is NextAction.RECONCILE:
        assert advice.retry_after_seconds == 1  # a try is due now: ask again right after it
    else:
        assert advice.retry_after_seconds is None


def test_a_revoked_unknown_operation_is_reconciled_never_resent() -> None:
    """Revocation never un-sends: a revoked operation with an unknown outcome is reconciled,
    even at a provider that would deduplicate a re-send."""
    op = operation(
        status=Status.DISPATCHED, last_outcome=LastOutcome.UNKNOWN_TIMEOUT, revoked_at=PAST
    )
    assert next_action(op, _rule(86400)).action is NextAction.RECONCILE


def test_a_reconcile_answer_says_when_the_next_try_is_due() -> None:
    """An agent told to reconcile learns when opgate will look again, and asks then."""
    op = operation(
        status=Status.DISPATCHED,
        last_outcome=LastOutcome.UNKNOWN_TIMEOUT,
        next_reconcile_at=NOW + timedelta(seconds=29.2),
    )
    advice = next_action(op, _rule(None))
    assert (advice.action, advice.retry_after_seconds) == (NextAction.RECONCILE, 30)


def test_past_the_key_retention_the_agent_is_told_to_reconcile_not_retry() -> None:
    """A key the provider no longer keeps cannot make a re-send safe."""
    op = operation(
        status=Status.DISPATCHED,
        last_outcome=LastOutcome.UNKNOWN_TIMEOUT,
        created_at=NOW - timedelta(days=2),
    )
    assert next_action(op, _rule(86400)).action is NextAction.RECONCILE


def test_a_failed_precondition_asks_for_a_new_approval_with_its_evidence() -> None:
    """A created operation whose precondition failed is not to be sent as it is: the agent is
    told a new approval is needed and shown what the provider's lookup said."""
    evidence = {"trigger": "approval_age", "lookups": [{"path": "/v1/charges/ch_1"}]}
    advice = next_action(operation(), _rule(None), precondition_failure=evidence)
    assert (advice.action, advice.evidence) == (NextAction.NEW_APPROVAL_REQUIRED, evidence)
    assert next_action(operation(), _rule(None)).action is NextAction.SEND


def test_a_failed_precondition_before_a_re_send_of_what_never_left_asks_for_a_new_approval() -> (
    None
):
    """Every attempt so far ended before a byte left, and the lookup before the re-send
    failed: as for a first send, a new approval is needed. Had an attempt possibly left, the
    evidence would not be read: the row's own state decides."""
    evidence = {"trigger": "approval_age", "lookups": [{"path": "/v1/charges/ch_1"}]}
    never_left = operation(
        status=Status.DISPATCHED,
        attempts=2,
        unsent_attempts=2,
        last_outcome=LastOutcome.NOT_SENT,
        lease_until=PAST,
    )
    advice = next_action(never_left, _rule(None), precondition_failure=evidence)
    assert (advice.action, advice.evidence) == (NextAction.NEW_APPROVAL_REQUIRED, evidence)
    assert next_action(never_left, _rule(None)).action is NextAction.RETRY
    may_have_left = replace(never_left, unsent_attempts=1)
    advice = next_action(may_have_left, _rule(None), precondition_failure=evidence)
    assert (advice.action, advice.evidence) == (NextAction.RETRY, None)


def test_a_failed_precondition_matters_only_while_nothing_was_sent() -> None:
    """Once dispatched or settled, the row's own state decides; the old evidence is not read."""
    evidence = {"lookups": []}
    op = operation(status=Status.DISPATCHED, lease_until=LIVE)
    advice = next_action(op, _rule(None), precondition_failure=evidence)
    assert (advice.action, advice.evidence) == (NextAction.WAIT, None)


SWITCH_SEEN = NOW - timedelta(seconds=30)


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"status": Status.DISPATCHED, "attempts": 1, "unsent_attempts": 1,
         "last_outcome": LastOutcome.NOT_SENT, "lease_until": PAST},
        {"status": Status.DISPATCHED, "attempts": 1, "last_outcome": LastOutcome.UNKNOWN_TIMEOUT,
         "lease_until": PAST},
    ],
    ids=["created", "never left", "unknown outcome"],
)  # fmt: skip
def test_a_row_in_doubt_after_a_switch_is_never_told_plain_send(state: dict[str, Any]) -> None:
    """A failover may have sent it: the agent is told to re-send through opgate, which asks the
    provider first, whatever the provider's deduplication; never "nothing was sent yet"."""
    op = operation(lookup_before_send=SWITCH_SEEN, **state)
    for window in (None, 86400.0):
        advice = next_action(op, _rule(window))
        assert advice.action is NextAction.RETRY
        assert "asks the provider first" in advice.reason
    assert next_action(operation(), _rule(None)).action is NextAction.SEND


def test_a_row_in_doubt_waits_while_its_next_lookup_is_not_due() -> None:
    """A lookup that could not conclude yet (the grace since the switch) paces the agent."""
    op = operation(lookup_before_send=SWITCH_SEEN, next_reconcile_at=NOW + timedelta(seconds=2.5))
    advice = next_action(op, _rule(None))
    assert (advice.action, advice.retry_after_seconds) == (NextAction.WAIT, 3)
    due = replace(op, next_reconcile_at=PAST)
    assert next_action(due, _rule(None)).action is NextAction.RETRY


def test_a_row_in_doubt_answers_by_its_settled_escalated_or_expired_state_first() -> None:
    """The mark adds a lookup before a send; it never hides what the row already says."""
    op = operation(lookup_before_send=SWITCH_SEEN)
    escalated = replace(op, escalated_at=PAST, escalation_reason="a human decides")
    assert next_action(escalated, _rule(None)).action is NextAction.ESCALATED
    expired = replace(op, expires_at=PAST)
    assert next_action(expired, _rule(None)).action is (NextAction.NEW_APPROVAL_REQUIRED)
    in_flight = replace(op, status=Status.DISPATCHED, attempts=1, lease_until=LIVE)
    assert next_action(in_flight, _rule(None)).action is NextAction.WAIT
