"""The pure decision core (proxy/gate/checks.py): every reason, and the order the checks run in."""

from __future__ import annotations

import inspect
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import proxy.gate.checks
import proxy.gate.transitions
from proxy.gate.checks import (
    Agent,
    RequestFacts,
    concealed,
    decide,
    decide_by_state,
    same_currency,
)
from proxy.gate.decision import ClaimKind, Decision, Deny, Forward, Replay
from proxy.gate.reasons import Reason
from proxy.policy.model import Provider
from proxy.store.operation import LastOutcome, Operation, Status
from tests.support.facts import JPAY, NOW, PAY, POLICY, load_provider, make_facts, make_operation

PAY_DEDUP = load_provider(POLICY.format(dedup="true\n  retention_seconds: 86400"))
# A provider that deduplicates, with lookups declared on its refunds.
PAY_LOOKS_UP = load_provider(
    POLICY.format(dedup="true\n  retention_seconds: 86400").replace(
        "    path: /v1/refunds\n",
        "    path: /v1/refunds\n    reconcile: {lookups: [{path: /v1/refunds}]}\n",
        1,
    )
)


def reason_of(decision: Decision) -> Reason | None:
    return decision.reason if isinstance(decision, Deny) else None


def test_identical_request_for_a_created_operation_is_a_first_forward() -> None:
    """A request that equals its created, unexpired approval is forwarded as the first attempt."""
    assert decide(make_facts(), make_operation(), operation_lookup_failed=False) == Forward(
        ClaimKind.FIRST
    )


def test_read_rule_needs_no_operation() -> None:
    """A rule with `operation: none` forwards without any operation row."""
    facts = make_facts(rule="read", method="GET", path="/v1/charges/ch_1", named_operation_id=None)
    assert decide(facts, None, operation_lookup_failed=False) == Forward(ClaimKind.NONE)


def test_missing_operation_is_required() -> None:
    """A mutating request naming no operation is denied OPERATION_REQUIRED."""
    decision = decide(make_facts(named_operation_id=None), None, operation_lookup_failed=False)
    assert reason_of(decision) is Reason.OPERATION_REQUIRED


def test_named_but_unknown_operation() -> None:
    """A request naming an operation that does not exist is denied OPERATION_UNKNOWN."""
    decision = decide(make_facts(named_operation_id="op_x"), None, operation_lookup_failed=True)
    assert reason_of(decision) is Reason.OPERATION_UNKNOWN
    assert isinstance(decision, Deny)
    assert "op_x" in decision.detail


def test_an_operation_out_of_scope_is_told_as_an_absent_one() -> None:
    """``concealed`` answers a scope mismatch with exactly the decision for no row (by id and
    by key alone); any other refusal is told as it is."""
    foreign = make_operation(tenant="other")
    by_id = make_facts(named_operation_id="op_1")
    by_key = make_facts(named_operation_id=None, idempotency_key="key-1")
    for facts, lookup_failed in ((by_id, True), (by_key, False)):
        denied = decide(facts, foreign, operation_lookup_failed=lookup_failed)
        assert reason_of(denied) is Reason.OPERATION_SCOPE_MISMATCH
        assert isinstance(denied, Deny)
        told = concealed(facts, denied, operation_lookup_failed=lookup_failed)
        assert told == decide(facts, None, operation_lookup_failed=lookup_failed)
    assert (
        concealed(by_id, Deny(Reason.AMOUNT_MISMATCH, "amount"), operation_lookup_failed=True)
        is None
    )


OK_FORM = {"amount": "500", "currency": "usd", "charge": "ch_1"}

# (scenario, facts, operation, expected reason)
PAYLOAD_CASES: list[tuple[str, RequestFacts, Operation, Reason]] = [
    ("other tenant", make_facts(), make_operation(tenant="other"), Reason.OPERATION_SCOPE_MISMATCH),
    (
        "other agent",
        make_facts(agent=Agent("agent-2", "acme")),
        make_operation(),
        Reason.OPERATION_SCOPE_MISMATCH,
    ),
    ("other provider", make_facts(), make_operation(provider="jpay"), Reason.TARGET_MISMATCH),
    ("other action", make_facts(), make_operation(action="charge.cancel"), Reason.TARGET_MISMATCH),
    ("other method", make_facts(method="PUT"), make_operation(), Reason.TARGET_MISMATCH),
    ("other path", make_facts(), make_operation(path="/v1/refunds/x"), Reason.TARGET_MISMATCH),
    (
        "other idempotency key",
        make_facts(idempotency_key="mine"),
        make_operation(),
        Reason.IDEMPOTENCY_KEY_MISMATCH,
    ),
    (
        "different amount",
        make_facts({**OK_FORM, "amount": "600"}),
        make_operation(),
        Reason.AMOUNT_MISMATCH,
    ),
    (
        "amount absent but approved",
        make_facts({"currency": "usd", "charge": "ch_1"}),
        make_operation(),
        Reason.AMOUNT_MISMATCH,
    ),
    (
        "amount sent but approval has none",
        make_facts({**OK_FORM, "amount": "500"}),
        make_operation(amount=None),
        Reason.AMOUNT_MISMATCH,
    ),
    (
        "non-numeric amount sent, approval has none",
        make_facts({**OK_FORM, "amount": "abc"}),
        make_operation(amount=None),
        Reason.AMOUNT_MISMATCH,
    ),
    (
        "different currency",
        make_facts({**OK_FORM, "currency": "eur"}),
        make_operation(),
        Reason.CURRENCY_MISMATCH,
    ),
    (
        "currency absent but approved",
        make_facts({"amount": "500", "charge": "ch_1"}),
        make_operation(),
        Reason.CURRENCY_MISMATCH,
    ),
    (
        "currency sent but approval has none",
        make_facts(OK_FORM),
        make_operation(currency=None),
        Reason.CURRENCY_MISMATCH,
    ),
    (
        "different param",
        make_facts({**OK_FORM, "charge": "ch_2"}),
        make_operation(),
        Reason.PARAMETER_MISMATCH,
    ),
    (
        "approved param missing",
        make_facts({"amount": "500", "currency": "usd"}),
        make_operation(),
        Reason.PARAMETER_MISMATCH,
    ),
    (
        "unapproved rule param sent",
        make_facts({**OK_FORM, "reverse": "true"}),
        make_operation(),
        Reason.PARAMETER_MISMATCH,
    ),
    (
        "field neither approved nor free",
        make_facts({**OK_FORM, "destination": "acct_evil"}),
        make_operation(),
        Reason.PARAMETER_UNEXPECTED,
    ),
    (
        "injected field set to another operation",
        make_facts({**OK_FORM, "metadata[operation_id]": "op_2"}),
        make_operation(),
        Reason.INJECTION_CONFLICT,
    ),
    (
        "injected field on a rule without injection is unexpected",
        make_facts(
            {"metadata[operation_id]": "op_1"},
            rule="charge.cancel",
            path="/v1/charges/ch_1/cancel",
        ),
        make_operation(
            action="charge.cancel",
            path="/v1/charges/ch_1/cancel",
            amount=None,
            currency=None,
            params={},
        ),
        Reason.PARAMETER_UNEXPECTED,
    ),
]


@pytest.mark.parametrize(
    ("facts", "op", "reason"), [pytest.param(*case[1:], id=case[0]) for case in PAYLOAD_CASES]
)
def test_payload_differences_are_denied(facts: RequestFacts, op: Operation, reason: Reason) -> None:
    """Each difference between request and approval is denied with its own reason."""
    assert reason_of(decide(facts, op, operation_lookup_failed=False)) is reason


ACCEPTED_FORMS: list[tuple[str, dict[str, str], Operation]] = [
    ("exact", OK_FORM, make_operation()),
    ("currency in another case", {**OK_FORM, "currency": "USD"}, make_operation()),
    ("zero amount", {**OK_FORM, "amount": "0"}, make_operation(amount=0)),
    (
        "full refund: no amount anywhere",
        {"currency": "usd", "charge": "ch_1"},
        make_operation(amount=None),
    ),
    ("free fields", {**OK_FORM, "reason": "dup", "metadata[note]": "x"}, make_operation()),
    (
        "injected field already right",
        {**OK_FORM, "metadata[operation_id]": "op_1"},
        make_operation(),
    ),
    ("unapproved rule param absent", OK_FORM, make_operation(params={"charge": "ch_1"})),
]


@pytest.mark.parametrize(
    ("form", "op"), [pytest.param(*case[1:], id=case[0]) for case in ACCEPTED_FORMS]
)
def test_equivalent_requests_are_forwarded(form: dict[str, str], op: Operation) -> None:
    """Requests that say exactly what was approved are forwarded."""
    assert decide(make_facts(form), op, operation_lookup_failed=False) == Forward(ClaimKind.FIRST)


@pytest.mark.parametrize(
    ("field", "allowed"),
    [
        pytest.param("metadata[note]", True, id="bracket key under metadata[*]"),
        pytest.param("metadata[a][b]", True, id="nested bracket key"),
        pytest.param("metadata[]", True, id="empty bracket"),
        pytest.param("metadata*", False, id="brackets are literal, not a character class"),
        pytest.param("metadatax", False, id="no brackets"),
        pytest.param("xmetadata[a]", False, id="whole field must match"),
        pytest.param("reasons", False, id="exact free name is not a prefix"),
    ],
)
def test_free_field_patterns(field: str, allowed: bool) -> None:
    """`free` patterns treat only '*' as a wildcard and must match the whole field name."""
    facts = make_facts({**OK_FORM, field: "x"})
    decision = decide(facts, make_operation(), operation_lookup_failed=False)
    assert reason_of(decision) is (None if allowed else Reason.PARAMETER_UNEXPECTED)


def test_same_idempotency_key_passes() -> None:
    """An agent may send the approved idempotency key itself."""
    decision = decide(
        make_facts(idempotency_key="opk_1"), make_operation(), operation_lookup_failed=False
    )
    assert decision == Forward(ClaimKind.FIRST)


def test_agentless_operation_is_open_to_the_whole_tenant() -> None:
    """An operation approved without an agent_id may be sent by any agent of its tenant."""
    facts = make_facts(agent=Agent("agent-9", "acme"))
    assert decide(facts, make_operation(agent_id=None), operation_lookup_failed=False) == Forward(
        ClaimKind.FIRST
    )


@pytest.mark.parametrize(
    ("sent", "approved"),
    [
        pytest.param("0100", 100, id="leading zero"),
        pytest.param("+5", 5, id="plus sign"),
        pytest.param("1e3", 1000, id="exponent"),
        pytest.param(" 5", 5, id="leading space"),
        pytest.param("5 ", 5, id="trailing space"),
        pytest.param("5.0", 5, id="decimal point"),
        pytest.param("-5", -5, id="negative"),
        pytest.param("00", 0, id="double zero"),
        pytest.param("\u0665", 5, id="arabic-indic digit"),
        pytest.param("\u00b2", 2, id="superscript two"),
        pytest.param("", 0, id="empty"),
    ],
)
def test_non_canonical_form_amounts_are_mismatches(sent: str, approved: int) -> None:
    """A form amount only matches when written as plain canonical ASCII decimal digits."""
    facts = make_facts({**OK_FORM, "amount": sent})
    decision = decide(facts, make_operation(amount=approved), operation_lookup_failed=False)
    assert reason_of(decision) is Reason.AMOUNT_MISMATCH


# --- JSON bodies ---------------------------------------------------------------------------------


def json_operation(**overrides: Any) -> Operation:
    base = {
        "provider": "jpay",
        "action": "transfer.create",
        "path": "/v1/transfers",
        "amount": 700,
        "currency": "eur",
        "params": {"/destination": "acct_1", "/instant": True, "/count": 1},
    }
    return make_operation(**{**base, **overrides})


def json_facts(document: dict[str, Any]) -> RequestFacts:
    return make_facts(provider=JPAY, rule="transfer.create", path="/v1/transfers", json=document)


OK_JSON: dict[str, Any] = {
    "amount": 700,
    "currency": "eur",
    "destination": "acct_1",
    "instant": True,
    "count": 1,
}

JSON_CASES: list[tuple[str, dict[str, Any], Reason | None]] = [
    ("exact", OK_JSON, None),
    ("injected pointer already right", {**OK_JSON, "metadata": {"operation_id": "op_1"}}, None),
    ("free pointer", {**OK_JSON, "description": "d"}, None),
    ("amount as string", {**OK_JSON, "amount": "700"}, Reason.AMOUNT_MISMATCH),
    ("amount as float", {**OK_JSON, "amount": 700.0}, Reason.AMOUNT_MISMATCH),
    ("bool param sent as 1", {**OK_JSON, "instant": 1}, Reason.PARAMETER_MISMATCH),
    ("int param sent as true", {**OK_JSON, "count": True}, Reason.PARAMETER_MISMATCH),
    ("int param sent as 1.0", {**OK_JSON, "count": 1.0}, Reason.PARAMETER_MISMATCH),
    ("string param sent as object", {**OK_JSON, "destination": {}}, Reason.PARAMETER_MISMATCH),
    (
        "injected pointer conflicts",
        {**OK_JSON, "metadata": {"operation_id": "op_2"}},
        Reason.INJECTION_CONFLICT,
    ),
    ("unexpected nested field", {**OK_JSON, "metadata": {"x": "y"}}, Reason.PARAMETER_UNEXPECTED),
    ("unexpected empty object", {**OK_JSON, "extra": {}}, Reason.PARAMETER_UNEXPECTED),
]


@pytest.mark.parametrize(
    ("document", "reason"), [pytest.param(*case[1:], id=case[0]) for case in JSON_CASES]
)
def test_json_bodies_compare_types_strictly(
    document: dict[str, Any], reason: Reason | None
) -> None:
    """JSON leaves match only with the same type: true is not 1, 1.0 is not 1, "700" is not 700."""
    decision = decide(json_facts(document), json_operation(), operation_lookup_failed=False)
    if reason is None:
        assert decision == Forward(ClaimKind.FIRST)
    else:
        assert reason_of(decision) is reason


def test_json_bool_amount_is_not_one() -> None:
    """A JSON `true` amount does not match an approved amount of 1."""
    decision = decide(
        json_facts({**OK_JSON, "amount": True}),
        json_operation(amount=1),
        operation_lookup_failed=False,
    )
    assert reason_of(decision) is Reason.AMOUNT_MISMATCH


# --- order ---------------------------------------------------------------------------------------


def confirmed(**overrides: Any) -> Operation:
    return make_operation(
        status=Status.CONFIRMED, attempts=1, provider_status=200, settled_at=NOW, **overrides
    )


ORDER_CASES: list[tuple[str, RequestFacts, Operation, Reason | None]] = [
    (
        "confirmed re-send with another amount is a mismatch, not a replay",
        make_facts({**OK_FORM, "amount": "600"}),
        confirmed(),
        Reason.AMOUNT_MISMATCH,
    ),
    (
        "scope before target",
        make_facts(method="PUT"),
        make_operation(tenant="other"),
        Reason.OPERATION_SCOPE_MISMATCH,
    ),
    (
        "target before amount",
        make_facts({**OK_FORM, "amount": "1"}, method="PUT"),
        make_operation(),
        Reason.TARGET_MISMATCH,
    ),
    (
        "idempotency key before amount",
        make_facts({**OK_FORM, "amount": "1"}, idempotency_key="k"),
        make_operation(),
        Reason.IDEMPOTENCY_KEY_MISMATCH,
    ),
    (
        "amount before currency",
        make_facts({**OK_FORM, "amount": "1", "currency": "eur"}),
        make_operation(),
        Reason.AMOUNT_MISMATCH,
    ),
    (
        "currency before params",
        make_facts({**OK_FORM, "currency": "eur", "charge": "ch_2"}),
        make_operation(),
        Reason.CURRENCY_MISMATCH,
    ),
    (
        "params before injection",
        make_facts({**OK_FORM, "charge": "ch_2", "metadata[operation_id]": "op_2"}),
        make_operation(),
        Reason.PARAMETER_MISMATCH,
    ),
    (
        "injection before unexpected fields",
        make_facts({**OK_FORM, "metadata[operation_id]": "op_2", "zzz": "1"}),
        make_operation(),
        Reason.INJECTION_CONFLICT,
    ),
    (
        "payload before revocation",
        make_facts({**OK_FORM, "amount": "1"}),
        make_operation(revoked_at=NOW),
        Reason.AMOUNT_MISMATCH,
    ),
    (
        "payload before expiry",
        make_facts({**OK_FORM, "amount": "1"}),
        make_operation(expires_at=NOW - timedelta(days=1)),
        Reason.AMOUNT_MISMATCH,
    ),
    (
        "payload before in-flight",
        make_facts({**OK_FORM, "amount": "1"}),
        make_operation(status=Status.DISPATCHED, lease_until=NOW + timedelta(seconds=5)),
        Reason.AMOUNT_MISMATCH,
    ),
    (
        "payload before failed",
        make_facts({**OK_FORM, "amount": "1"}),
        make_operation(status=Status.FAILED),
        Reason.AMOUNT_MISMATCH,
    ),
    (
        "revoked and confirmed replays",
        make_facts(),
        confirmed(revoked_at=NOW - timedelta(minutes=1), revoked_reason="oops"),
        None,
    ),
    (
        "expired and confirmed replays",
        make_facts(),
        confirmed(expires_at=NOW - timedelta(days=1)),
        None,
    ),
    (
        "failed wins over revoked",
        make_facts(),
        make_operation(status=Status.FAILED, revoked_at=NOW),
        Reason.OPERATION_FAILED,
    ),
    (
        "revoked wins over expired",
        make_facts(),
        make_operation(revoked_at=NOW, expires_at=NOW - timedelta(days=1)),
        Reason.APPROVAL_REVOKED,
    ),
    (
        "expired wins over in-flight",
        make_facts(),
        make_operation(
            status=Status.DISPATCHED,
            expires_at=NOW - timedelta(seconds=1),
            lease_until=NOW + timedelta(seconds=5),
        ),
        Reason.APPROVAL_EXPIRED,
    ),
]


@pytest.mark.parametrize(
    ("facts", "op", "reason"), [pytest.param(*case[1:], id=case[0]) for case in ORDER_CASES]
)
def test_check_order(facts: RequestFacts, op: Operation, reason: Reason | None) -> None:
    """Identity before content, content before state: the first failing check names the reason."""
    decision = decide(facts, op, operation_lookup_failed=False)
    if reason is None:
        assert decision == Replay()
    else:
        assert reason_of(decision) is reason


# --- state ---------------------------------------------------------------------------------------


def test_confirmed_replays() -> None:
    """An identical request for a confirmed operation is answered from the stored response."""
    assert decide(make_facts(), confirmed(), operation_lookup_failed=False) == Replay()


def test_failed_is_denied() -> None:
    """An identical request for a failed operation is denied OPERATION_FAILED."""
    decision = decide(
        make_facts(), make_operation(status=Status.FAILED), operation_lookup_failed=False
    )
    assert reason_of(decision) is Reason.OPERATION_FAILED


def test_revoked_detail_is_the_revocation_reason() -> None:
    """A revoked approval is denied with the operator's reason as the detail."""
    op = make_operation(revoked_at=NOW, revoked_reason="customer withdrew")
    assert decide(make_facts(), op, operation_lookup_failed=False) == Deny(
        Reason.APPROVAL_REVOKED, "customer withdrew"
    )


@pytest.mark.parametrize(
    ("expires_in", "reason"),
    [
        pytest.param(timedelta(seconds=-1), Reason.APPROVAL_EXPIRED, id="a second ago"),
        pytest.param(timedelta(0), Reason.APPROVAL_EXPIRED, id="exactly at read_at"),
        pytest.param(timedelta(seconds=1), None, id="a second ahead"),
    ],
)
def test_expiry_uses_the_database_read_time(expires_in: timedelta, reason: Reason | None) -> None:
    """Expiry compares expires_at with the row's read_at, not this process's wall clock."""
    # read_at far in the past and far in the future, so the wall clock would decide otherwise
    for read_at in (datetime(2001, 1, 1, tzinfo=UTC), datetime(2099, 1, 1, tzinfo=UTC)):
        op = make_operation(read_at=read_at, expires_at=read_at + expires_in)
        decision = decide(make_facts(), op, operation_lookup_failed=False)
        if reason is None:
            assert decision == Forward(ClaimKind.FIRST)
        else:
            assert reason_of(decision) is reason


def dispatched(**overrides: Any) -> Operation:
    return make_operation(status=Status.DISPATCHED, attempts=1, dispatched_at=NOW, **overrides)


@pytest.mark.parametrize(
    ("lease_left", "retry_after"),
    [
        pytest.param(timedelta(seconds=10), 10, id="whole seconds"),
        pytest.param(timedelta(seconds=2, milliseconds=1), 3, id="rounded up"),
        pytest.param(timedelta(milliseconds=1), 1, id="at least one"),
        pytest.param(timedelta(microseconds=1), 1, id="a microsecond"),
    ],
)
def test_in_flight_retry_after(lease_left: timedelta, retry_after: int) -> None:
    """A live lease is a 409 whose Retry-After is ceil(lease_until - read_at), at least 1."""
    read_at = datetime(2001, 1, 1, tzinfo=UTC)  # the wall clock must not matter
    op = dispatched(
        read_at=read_at,
        expires_at=read_at + timedelta(hours=1),
        lease_owner="replica-a",
        lease_until=read_at + lease_left,
    )
    decision = decide(make_facts(), op, operation_lookup_failed=False)
    assert isinstance(decision, Deny)
    assert decision.reason is Reason.OPERATION_IN_FLIGHT
    assert decision.retry_after_seconds == retry_after


# (scenario, provider, lease_until relative to read_at, last_outcome, expected)
RESEND_CASES: list[tuple[str, Provider, timedelta | None, str | None, Decision | Reason]] = [
    ("not sent, no dedup", PAY, None, LastOutcome.NOT_SENT, Forward(ClaimKind.RESEND)),
    ("not sent, lease expired", PAY, timedelta(seconds=-1), "not_sent", Forward(ClaimKind.RESEND)),
    (
        "lease ends exactly at read_at",
        PAY,
        timedelta(0),
        LastOutcome.NOT_SENT,
        Forward(ClaimKind.RESEND),
    ),
    ("timeout, dedup", PAY_DEDUP, None, LastOutcome.UNKNOWN_TIMEOUT, Forward(ClaimKind.RESEND)),
    ("no outcome recorded, dedup", PAY_DEDUP, None, None, Forward(ClaimKind.RESEND)),
    (
        "timeout, lookups declared: ask first",
        PAY_LOOKS_UP,
        None,
        LastOutcome.UNKNOWN_TIMEOUT,
        Forward(ClaimKind.RESEND_AFTER_LOOKUP),
    ),
    (
        "not sent, lookups declared: nothing to ask",
        PAY_LOOKS_UP,
        None,
        "not_sent",
        Forward(ClaimKind.RESEND),
    ),
    (
        "timeout, no dedup",
        PAY,
        None,
        LastOutcome.UNKNOWN_TIMEOUT,
        Reason.RECONCILE_REQUIRED,
    ),
    ("dropped, no dedup", PAY, None, LastOutcome.UNKNOWN_DROPPED, Reason.RECONCILE_REQUIRED),
    ("5xx, no dedup", PAY, None, LastOutcome.UNKNOWN_STATUS, Reason.RECONCILE_REQUIRED),
    ("truncated, no dedup", PAY, None, LastOutcome.UNKNOWN_TRUNCATED, Reason.RECONCILE_REQUIRED),
    ("no outcome recorded, no dedup", PAY, None, None, Reason.RECONCILE_REQUIRED),
    (
        "live lease even if not sent",
        PAY,
        timedelta(seconds=3),
        LastOutcome.NOT_SENT,
        Reason.OPERATION_IN_FLIGHT,
    ),
    (
        "live lease even with dedup",
        PAY_DEDUP,
        timedelta(seconds=3),
        LastOutcome.UNKNOWN_TIMEOUT,
        Reason.OPERATION_IN_FLIGHT,
    ),
]


@pytest.mark.parametrize(
    ("provider", "lease_left", "last_outcome", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in RESEND_CASES],
)
def test_dispatched_without_live_lease(
    provider: Provider,
    lease_left: timedelta | None,
    last_outcome: str | None,
    expected: Decision | Reason,
) -> None:
    """Resend only without a live lease and when not sent or the provider deduplicates."""
    op = dispatched(
        lease_until=None if lease_left is None else NOW + lease_left, last_outcome=last_outcome
    )
    decision = decide(make_facts(provider=provider), op, operation_lookup_failed=False)
    if isinstance(expected, Reason):
        assert reason_of(decision) is expected
    else:
        assert decision == expected
    assert decide_by_state(provider, op) == decision


def test_escalated_operation_is_denied() -> None:
    """A dispatched operation escalated to a human is not re-sent, even if re-sending is safe."""
    op = dispatched(
        escalated_at=NOW, escalation_reason="reconcile gave up", last_outcome=LastOutcome.NOT_SENT
    )
    assert decide(make_facts(provider=PAY_DEDUP), op, operation_lookup_failed=False) == Deny(
        Reason.OPERATION_ESCALATED, "reconcile gave up"
    )


def test_confirmed_escalated_operation_replays() -> None:
    """Settled state wins over escalation: a confirmed operation replays."""
    assert decide(make_facts(), confirmed(escalated_at=NOW), operation_lookup_failed=False) == (
        Replay()
    )


def test_live_reconciliation_is_in_flight() -> None:
    """While opgate reconciles the operation, a re-send is a 409 until the reconcile lease ends."""
    op = dispatched(
        last_outcome=LastOutcome.NOT_SENT, reconcile_lease_until=NOW + timedelta(seconds=4.5)
    )
    decision = decide(make_facts(provider=PAY_DEDUP), op, operation_lookup_failed=False)
    assert isinstance(decision, Deny)
    assert decision.reason is Reason.OPERATION_IN_FLIGHT
    assert decision.retry_after_seconds == 5
    ended = replace(op, reconcile_lease_until=NOW)
    assert decide_by_state(PAY_DEDUP, ended) == Forward(ClaimKind.RESEND)


def test_past_the_key_retention_a_deduplicating_provider_is_not_relied_on() -> None:
    """A day after creation Stripe may have pruned the key: a re-send is then refused."""
    op = dispatched(
        last_outcome=LastOutcome.UNKNOWN_TIMEOUT, created_at=NOW - timedelta(hours=24, seconds=1)
    )
    decision = decide_by_state(PAY_DEDUP, op)
    assert isinstance(decision, Deny)
    assert decision.reason is Reason.RECONCILE_REQUIRED
    assert "no longer deduplicates" in decision.detail


def test_reconcile_detail_names_the_outcome_and_provider() -> None:
    """RECONCILE_REQUIRED says how the last attempt ended and that the provider won't dedup."""
    op = dispatched(last_outcome=LastOutcome.UNKNOWN_TIMEOUT)
    decision = decide_by_state(PAY, op)
    assert isinstance(decision, Deny)
    assert "unknown:timeout" in decision.detail
    assert "pay" in decision.detail


def test_every_reason_checks_can_give_is_covered() -> None:
    """The reasons this module tests are exactly those decide() can produce (with the
    transitions it decides by)."""
    covered = (
        {case[3] for case in PAYLOAD_CASES}
        | {case[3] for case in ORDER_CASES if case[3] is not None}
        | {case[4] for case in RESEND_CASES if isinstance(case[4], Reason)}
        | {
            Reason.OPERATION_REQUIRED,
            Reason.OPERATION_UNKNOWN,
            Reason.APPROVAL_EXPIRED,
            Reason.OPERATION_IN_FLIGHT,
            Reason.OPERATION_ESCALATED,
        }
    )
    source = inspect.getsource(proxy.gate.checks) + inspect.getsource(proxy.gate.transitions)
    produced = {reason for reason in Reason if f"Reason.{reason.name}" in source}
    assert produced == covered


# --- currency: ASCII only; keys a bracket parser may read as the injected field ----------------


@pytest.mark.parametrize(
    "sent",
    [
        pytest.param("\u212aes", id="Kelvin sign lowers to k"),
        pytest.param("u\u017fd", id="long s uppers to S"),
        pytest.param("\uff55\uff53\uff44", id="fullwidth letters"),
        pytest.param("usd\u0307", id="combining dot"),
    ],
)
def test_currency_compares_ascii_only(sent: str) -> None:
    """A currency with non-ASCII letters that Unicode case mapping would equate with the
    approved one is a mismatch, not a match."""
    approved = "kes" if sent.startswith("\u212a") else "usd"
    decision = decide(
        make_facts({**OK_FORM, "currency": sent}),
        make_operation(currency=approved),
        operation_lookup_failed=False,
    )
    assert reason_of(decision) is Reason.CURRENCY_MISMATCH


def test_same_currency() -> None:
    """same_currency: ASCII letters in any case match; anything else does not."""
    assert same_currency("USD", "usd")
    assert same_currency("usd", "usd")
    assert not same_currency("\u212aES", "kes")
    assert not same_currency(None, "usd")
    assert not same_currency(840, "usd")


@pytest.mark.parametrize(
    "key",
    [
        "metadata[operation_id][]",
        "metadata[operation_id][x]",
        "metadata[operation_id]]",
        "metadata.operation_id",
        "metadata]operation_id",
    ],
)
def test_keys_read_as_the_injected_field_are_injection_conflicts(key: str) -> None:
    """A free-looking key (it matches metadata[*]) that a bracket parser may read as the
    injected field is an injection conflict, even holding the operation's own id."""
    facts = make_facts({**OK_FORM, key: "op_1"})
    decision = decide(facts, make_operation(), operation_lookup_failed=False)
    assert reason_of(decision) is Reason.INJECTION_CONFLICT


def test_json_leaves_below_the_injected_pointer_are_injection_conflicts() -> None:
    """A JSON object where the injected string goes is an injection conflict."""
    document = {**OK_JSON, "metadata": {"operation_id": {"x": "op_1"}}}
    decision = decide(json_facts(document), json_operation(), operation_lookup_failed=False)
    assert reason_of(decision) is Reason.INJECTION_CONFLICT


# After a timeline switch of the database (a failover), a row that existed may have been claimed
# and sent on the lost timeline, whatever it says now: it is looked up before its next send.
SWITCH_SEEN = NOW - timedelta(seconds=30)
PAY_LOOKS_UP_NO_DEDUP = load_provider(
    POLICY.format(dedup="false").replace(
        "    path: /v1/refunds\n",
        "    path: /v1/refunds\n    reconcile: {lookups: [{path: /v1/refunds}]}\n",
        1,
    )
)
IN_DOUBT_CASES = [
    ("created", {}),
    ("never left", {"status": Status.DISPATCHED, "attempts": 1, "unsent_attempts": 1,
                    "last_outcome": LastOutcome.NOT_SENT}),
    ("unknown outcome", {"status": Status.DISPATCHED, "attempts": 1,
                         "last_outcome": LastOutcome.UNKNOWN_TIMEOUT}),
]  # fmt: skip


@pytest.mark.parametrize(("scenario", "state"), IN_DOUBT_CASES, ids=[c[0] for c in IN_DOUBT_CASES])
def test_a_row_in_doubt_after_a_switch_is_sent_only_after_its_lookup(
    scenario: str, state: dict[str, Any]
) -> None:
    """Created, never left or unknown: with lookups declared, the send waits for the lookup,
    even where the key or not_sent would have let it go unasked."""
    op = make_operation(lookup_before_send=SWITCH_SEEN, **state)
    for provider in (PAY_LOOKS_UP, PAY_LOOKS_UP_NO_DEDUP):
        assert decide_by_state(provider, op) == Forward(ClaimKind.RESEND_AFTER_LOOKUP)


@pytest.mark.parametrize(("scenario", "state"), IN_DOUBT_CASES, ids=[c[0] for c in IN_DOUBT_CASES])
def test_a_row_in_doubt_whose_rule_has_no_lookup_is_escalated_not_sent(
    scenario: str, state: dict[str, Any]
) -> None:
    """Nothing can ask the provider: the request is refused as escalated (the pipeline then
    escalates the row), even where the provider deduplicates the key."""
    op = make_operation(lookup_before_send=SWITCH_SEEN, **state)
    for provider in (PAY, PAY_DEDUP):
        decision = decide_by_state(provider, op)
        assert isinstance(decision, Deny)
        assert decision.reason is Reason.OPERATION_ESCALATED
        assert "lost timeline" in decision.detail


def test_a_row_in_doubt_still_answers_by_its_settled_or_refused_state_first() -> None:
    """Confirmed replays, revoked and escalated refuse, a live lease waits, as without a switch."""
    doubted = make_operation(lookup_before_send=SWITCH_SEEN)
    assert decide_by_state(PAY, replace(doubted, status=Status.CONFIRMED)) == Replay()
    revoked = decide_by_state(PAY_LOOKS_UP, replace(doubted, revoked_at=NOW, revoked_reason="x"))
    assert isinstance(revoked, Deny)
    assert revoked.reason is Reason.APPROVAL_REVOKED
    escalated = replace(doubted, escalated_at=NOW, escalation_reason="a human decides")
    assert decide_by_state(PAY_LOOKS_UP, escalated) == Deny(
        Reason.OPERATION_ESCALATED, "a human decides"
    )
    in_flight = replace(
        doubted, status=Status.DISPATCHED, attempts=1, lease_until=NOW + timedelta(seconds=3)
    )
    waiting = decide_by_state(PAY_LOOKS_UP, in_flight)
    assert isinstance(waiting, Deny)
    assert waiting.reason is Reason.OPERATION_IN_FLIGHT


def test_a_row_not_in_doubt_is_decided_as_before() -> None:
    """Without the mark, a created row is a first send and not_sent a plain re-send."""
    assert decide_by_state(PAY, make_operation()) == Forward(ClaimKind.FIRST)
    never_left = make_operation(
        status=Status.DISPATCHED, attempts=1, last_outcome=LastOutcome.NOT_SENT
    )
    assert decide_by_state(PAY_LOOKS_UP, never_left) == Forward(ClaimKind.RESEND)


# A provider that takes no idempotency key (an SMS API): `idempotency: none`, and the recipe
# older policies used, a header kept but `send_key: false` on the rule.
NO_KEY_POLICIES = {
    "idempotency none": POLICY.format(dedup="false").replace(
        "idempotency:\n  provider_deduplicates: false\n", "idempotency: none\n"
    ),
    "send_key false": POLICY.format(dedup="false").replace(
        "    path: /v1/refunds\n", "    path: /v1/refunds\n    send_key: false\n", 1
    ),
}


@pytest.mark.parametrize("policy", NO_KEY_POLICIES.values(), ids=NO_KEY_POLICIES.keys())
def test_reconcile_refusal_on_a_call_without_a_key_says_no_key_was_sent(policy: str) -> None:
    """An unknown outcome of a call that carried no key is refused for what is true: no key
    was sent, so a re-send could act twice; not that the provider ignores its key."""
    provider = load_provider(policy)
    op = dispatched(last_outcome=LastOutcome.UNKNOWN_TIMEOUT)
    decision = decide_by_state(provider, op)
    assert isinstance(decision, Deny)
    assert decision.reason is Reason.RECONCILE_REQUIRED
    assert "does not deduplicate" not in decision.detail, decision.detail
    assert "no idempotency key" in decision.detail, decision.detail


def test_a_call_without_a_key_is_not_re_sent_on_a_deduplicating_providers_word() -> None:
    """The provider deduplicates on its key, but this rule sends none (`send_key: false`): an
    unknown outcome is not re-sent on the strength of a key that never left."""
    provider = load_provider(
        POLICY.format(dedup="true\n  retention_seconds: 86400").replace(
            "    path: /v1/refunds\n", "    path: /v1/refunds\n    send_key: false\n", 1
        )
    )
    op = dispatched(last_outcome=LastOutcome.UNKNOWN_TIMEOUT)
    decision = decide_by_state(provider, op)
    assert reason_of(decision) is Reason.RECONCILE_REQUIRED, decision
    rule = provider.rule_named("refund.create")
    assert rule is not None
    assert provider.dedup_window_for(rule) is None
