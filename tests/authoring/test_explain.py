"""The explanation core (proxy/authoring/explain.py) and checks.evaluate: every check's result, one
source of truth with decide, and report mode's relaxations, without sockets."""

from __future__ import annotations

import pytest

from proxy.authoring.cases import CaseOperation
from proxy.gate.checks import decide, evaluate
from proxy.gate.decision import Deny, Forward
from proxy.gate.reasons import Reason
from proxy.policy.load import load_policy_dir
from proxy.policy.model import Mode
from tests.gate.test_checks import PAY, make_facts, make_operation
from tests.support.opgate import SHIPPED_POLICIES

POLICY = load_policy_dir(SHIPPED_POLICIES)


def test_evaluate_reports_every_check_and_decide_takes_its_decision() -> None:
    """Two failing checks are both reported; decide returns the first, as before."""
    facts = make_facts({"amount": "900", "currency": "eur", "charge": "ch_1"})
    op = make_operation()
    verdict = evaluate(facts, op, operation_lookup_failed=False)
    failed = [(r.check, r.denied.reason) for r in verdict.results if r.denied]
    assert failed == [("amount", Reason.AMOUNT_MISMATCH), ("currency", Reason.CURRENCY_MISMATCH)]
    assert verdict.decision == decide(facts, op, operation_lookup_failed=False)
    assert isinstance(verdict.decision, Deny)
    assert verdict.decision.reason is Reason.AMOUNT_MISMATCH


REPORT = PAY.model_copy(update={"mode": Mode.REPORT})


@pytest.mark.parametrize(
    ("scenario", "form", "op_overrides", "decision", "would_deny"),
    [
        ("amount relaxed", {"amount": "900", "currency": "usd", "charge": "ch_1"}, {}, "forward",
         Reason.AMOUNT_MISMATCH),
        ("unexpected field relaxed",
         {"amount": "500", "currency": "usd", "charge": "ch_1", "x": "1"}, {}, "forward",
         Reason.PARAMETER_UNEXPECTED),
        ("scope never relaxed", {"amount": "900", "currency": "usd", "charge": "ch_1"},
         {"tenant": "other"}, Reason.OPERATION_SCOPE_MISMATCH, None),
        ("injection never relaxed",
         {"amount": "500", "currency": "usd", "charge": "ch_1", "metadata[operation_id]": "op_x"},
         {}, Reason.INJECTION_CONFLICT, None),
        ("state still applies", {"amount": "900", "currency": "usd", "charge": "ch_1"},
         {"revoked_at": make_operation().read_at, "revoked_reason": "no"},
         Reason.APPROVAL_REVOKED, None),
    ],
)  # fmt: skip
def test_report_mode_relaxes_only_payload_checks(
    scenario: str,
    form: dict[str, str],
    op_overrides: dict[str, object],
    decision: object,
    would_deny: Reason | None,
) -> None:
    """In report mode a payload mismatch becomes would_deny; identity, injection, state do not."""
    verdict = evaluate(
        make_facts(form, provider=REPORT),
        make_operation(**op_overrides),
        operation_lookup_failed=False,
    )
    if decision == "forward":
        assert isinstance(verdict.decision, Forward)
        assert verdict.decision.would_deny is not None
        assert verdict.decision.would_deny.reason is would_deny
    else:
        assert isinstance(verdict.decision, Deny)
        assert verdict.decision.reason is decision


def test_an_operation_file_row_renders_its_rule_path() -> None:
    """The inline operation (explain --operation, test cases) is the row the store would hold."""
    row = CaseOperation(action="charge.capture", path_params={"charge": "ch_9"}).row(
        POLICY, "t", "stripe"
    )
    assert (row.method, row.path, row.tenant) == ("POST", "/v1/charges/ch_9/capture", "t")
