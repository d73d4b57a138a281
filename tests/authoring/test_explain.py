"""The explanation core (proxy/authoring/explain.py) and checks.evaluate: every check's result, one
source of truth with decide, and report mode's relaxations, without sockets."""

from __future__ import annotations

import json

import pytest

from proxy.authoring.cases import CaseOperation
from proxy.authoring.explain import (
    EXPLAIN_AGENT,
    Explanation,
    SampleRequest,
    explain,
    render_text,
)
from proxy.gate.checks import decide, evaluate
from proxy.gate.decision import Deny, Forward
from proxy.gate.preconditions import LookupAnswer
from proxy.gate.reasons import Reason
from proxy.policy.load import load_policy_dir
from proxy.policy.model import Mode
from proxy.policy.set import PolicySet
from tests.support.facts import PAY, make_facts, make_operation
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


CHARGE_PATH = "/v1/charges/ch_1"


def refund_explained(
    lookups: dict[str, LookupAnswer] | None, age: float = 3600, policy: PolicySet = POLICY
) -> Explanation:
    """An agent's refund of 500 of ch_1, approved ``age`` seconds ago, explained."""
    sample = SampleRequest(
        "POST",
        "/stripe/v1/refunds",
        (("X-Operation-Id", "op_test"), ("Content-Type", "application/x-www-form-urlencoded")),
        b"charge=ch_1&amount=500",
    )
    row = CaseOperation(
        action="refund.create", amount=500, params={"charge": "ch_1"}, approved_seconds_ago=age
    ).row(policy, EXPLAIN_AGENT.tenant, "stripe")
    return explain(policy, sample, [row], lookups)


def charge(**fields: object) -> LookupAnswer:
    values = {"status": "succeeded", "refunded": False, "amount": 2000, "amount_refunded": 0}
    return (200, json.dumps(values | fields).encode())


def test_preconditions_are_their_own_stage_judged_on_the_answer_given() -> None:
    """A refund approved an hour ago of a charge refunded since: the checks pass, the state
    allows the first claim, and the precondition stage turns it into precondition_failed."""
    explained = refund_explained({CHARGE_PATH: charge(refunded=True, amount_refunded=2000)})
    assert isinstance(explained.verdict and explained.verdict.state, Forward)
    assert explained.outcome()["reason"] == "precondition_failed"
    stage = explained.to_json()["preconditions"]
    assert (stage["trigger"], stage["result"]) == ("approval_age", "failed")
    text = render_text(explained)
    assert "preconditions: due (approval_age), failed" in text
    assert '    fails       /refunded == false  {"/refunded": true}' in text.splitlines()


def test_a_held_precondition_leaves_the_decision_as_it_was() -> None:
    """Room left on the charge: the first claim goes, the stage says held."""
    explained = refund_explained({CHARGE_PATH: charge(amount_refunded=1500)})
    assert explained.outcome()["claim"] == "first"
    assert explained.to_json()["preconditions"]["result"] == "held"


def test_without_an_answer_a_due_precondition_is_not_evaluated() -> None:
    """No lookup answer given: the stage names the lookup it lacks and decides nothing."""
    explained = refund_explained(None)
    assert explained.outcome()["claim"] == "first"
    stage = explained.to_json()["preconditions"]
    assert (stage["result"], stage["missing_answers"]) == ("not evaluated", [CHARGE_PATH])


def test_a_fresh_approval_has_no_precondition_stage() -> None:
    """Younger than recheck_after_seconds: nothing is due, whatever the answers."""
    explained = refund_explained({CHARGE_PATH: charge(refunded=True)}, age=10)
    assert (explained.preconditions, explained.outcome()["claim"]) == (None, "first")


def test_report_mode_turns_a_failed_precondition_into_would_deny() -> None:
    """In shadow mode the stage's refusal is only what an enforcing rule would say."""
    stripe = POLICY.provider_named("stripe")
    assert stripe is not None
    reporting = PolicySet((stripe.model_copy(update={"mode": Mode.REPORT}),), POLICY.version)
    explained = refund_explained({CHARGE_PATH: charge(refunded=True)}, policy=reporting)
    outcome = explained.outcome()
    assert (outcome["decision"], outcome["would_deny"]) == ("allow", "precondition_failed")
