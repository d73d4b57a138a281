"""The request's outcome value (proxy/gate/pipeline.py ``RequestOutcome``): the agent's answer
and the audit record are each made from it by one pure function."""

from __future__ import annotations

import dataclasses
import json

import pytest

from proxy.gate.decision import Deny
from proxy.gate.pipeline import RequestOutcome, answer, audited
from proxy.gate.reasons import Reason
from proxy.observe.audit import AuditRecord, Decision
from proxy.store.operation import Status
from tests.support.facts import make_operation


def test_a_refusal_shown_instead_keeps_the_truth_on_the_record_only() -> None:
    """A refusal that would confirm another tenant's operation is shown as "unknown": the
    answer names no operation, the record keeps the real reason and the row's id."""
    op = make_operation()
    outcome = RequestOutcome(
        before=op,
        refusal=Deny(Reason.OPERATION_SCOPE_MISMATCH, "another tenant's"),
        shown=Deny(Reason.OPERATION_UNKNOWN, f"no operation {op.operation_id}"),
    )
    response = answer(outcome)
    shown = json.loads(response.text or "")
    assert (response.status, shown["code"]) == (404, "operation_unknown")
    assert "operation_status" not in shown
    record = audited(AuditRecord(), outcome, response.status)
    assert (record.decision, record.reason) == (Decision.DENY, "operation_scope_mismatch")
    assert (record.operation_id, record.status_before) == (op.operation_id, "created")
    assert record.response_status == 404


def test_a_store_failure_before_sending_keeps_what_was_known() -> None:
    """A store that fails after the preconditions' lookup: 503 "nothing was sent", and the
    record keeps the row, the lookup's evidence and the shadow refusal seen so far."""
    op = make_operation()
    outcome = RequestOutcome(
        before=op,
        evidence={"lookups": []},
        would_deny="amount_mismatch",
        decision=Decision.ERROR,
        store_error="connection lost",
    )
    response = answer(outcome)
    problem = json.loads(response.text or "")
    assert (response.status, problem["code"]) == (503, "store_unavailable")
    assert problem["detail"] == "nothing was sent: connection lost"
    record = audited(AuditRecord(), outcome, response.status)
    assert (record.decision, record.reason) == (Decision.ERROR, "store_unavailable")
    assert (record.precondition, record.would_deny) == ({"lookups": []}, "amount_mismatch")
    assert record.status_after is None


def test_a_replay_answers_from_the_row_the_claim_found() -> None:
    """A claim that lost its race to an attempt that confirmed: the stored answer of the row
    as it is now, and the record's status after is that row's."""
    before = make_operation()
    now = make_operation(
        status=Status.CONFIRMED, provider_status=200, response_body=b'{"id": "re_1"}'
    )
    outcome = RequestOutcome(
        before=before, decision=Decision.REPLAY, row=now, status_after=now.status
    )
    response = answer(outcome)
    assert (response.status, response.body) == (200, b'{"id": "re_1"}')
    assert response.headers["Idempotent-Replayed"] == "true"
    record = audited(AuditRecord(), outcome, response.status)
    assert (record.status_before, record.status_after) == ("created", "confirmed")


def test_an_update_is_a_new_outcome_as_replace_would_make_it() -> None:
    """``updated`` leaves the outcome it starts from as it was, gives what
    ``dataclasses.replace`` gives, and refuses a name that is not a field."""
    start = RequestOutcome(before=make_operation())
    later = start.updated(would_deny="amount_mismatch", attempt=1)
    assert later == dataclasses.replace(start, would_deny="amount_mismatch", attempt=1)
    assert (start.would_deny, start.attempt) == (None, None)
    with pytest.raises(TypeError, match="wuold_deny"):
        start.updated(wuold_deny="amount_mismatch")
