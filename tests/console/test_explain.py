"""What the console says in words (proxy/console/explain.py), pure: from the shipped policies
and rows as the store gives them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from proxy.console import explain
from proxy.policy.load import load_policy_dir
from tests.support.paths import POLICIES

POLICY = load_policy_dir(POLICIES)


@dataclass(frozen=True)
class Subject:
    operation_id: str
    params: dict[str, Any] = field(default_factory=dict)
    path_params: dict[str, str] = field(default_factory=dict)


@pytest.mark.parametrize(
    ("action", "words"),
    [
        pytest.param("refund.create", "Refund", id="create is the noun"),
        pytest.param("payment_intent.capture", "Capture payment intent", id="verb then noun"),
        pytest.param("read", "Read", id="one word"),
    ],
)
def test_an_action_reads_as_words(action: str, words: str) -> None:
    """A rule's name reads as what it does."""
    assert explain.action_words(action) == words


def test_a_proposal_reads_as_one_sentence() -> None:
    """Action, amount in the currency's exponent, objects, provider, who asked, and why."""
    proposal = {
        "action": "refund.create",
        "amount": 2500,
        "currency": "usd",
        "target": {"path_params": {}},
        "params": {"charge": "ch_1"},
        "provider": "stripe",
        "agent_id": "demo-agent",
        "tenant": "demo",
        "reason": "charged twice",
    }
    assert explain.proposal_sentence(proposal) == (
        "Refund 25.00 USD (2500 minor units) of charge ch_1 at Stripe, asked by demo-agent "
        "(tenant demo): "
        "charged twice"
    )


def test_square_is_searched_for_payments_by_reference_id() -> None:
    """Square's reconcile lookup says what to search: payments with reference_id = the id,
    and the request opgate makes, its query with a plain ``&``."""
    square = POLICY.provider_named("square")
    assert square is not None
    rule = square.rule_named("payment.create")
    assert rule is not None
    [search] = explain.searches(square, rule, Subject("op_1"))
    assert search == {
        "search": "payments with reference_id = op_1",
        "request": "GET /v2/payments?sort_order=DESC&limit=100",
    }


def test_a_rule_without_lookups_is_searched_where_opgate_wrote_the_id() -> None:
    """Without a reconcile lookup, the search is the metadata field opgate injected."""
    stripe = POLICY.provider_named("stripe")
    assert stripe is not None
    rule = stripe.rule_named("payment_intent.confirm")
    assert rule is not None
    assert explain.searches(stripe, rule, Subject("op_1", path_params={"intent": "pi_1"})) == []
    capture = stripe.rule_named("payment_intent.capture")
    assert capture is not None
    assert explain.searches(stripe, capture, Subject("op_1")) == [
        {"search": "an object whose metadata[operation_id] is op_1", "request": ""}
    ]


@dataclass(frozen=True)
class Sent(Subject):
    amount: int | None = None
    currency: str | None = None
    idempotency_key: str = "opk_1"


def test_where_the_id_was_never_sent_the_approved_values_are_searched() -> None:
    """A rule that writes no operation id at the provider (Stripe's confirm) and declares no
    lookup is searched for by its approved values around the attempts and by the idempotency
    key the request carried; opgate does not look it up on its own."""
    stripe = POLICY.provider_named("stripe")
    assert stripe is not None
    confirm = stripe.rule_named("payment_intent.confirm")
    assert confirm is not None
    subject = Sent("op_1", {"payment_method": "pm_1"}, {"intent": "pi_1"})
    assert explain.value_searches(stripe, confirm, subject) == [
        {
            "search": "the effect of POST /v1/payment_intents/{intent}/confirm with intent = "
            "pi_1, payment_method = pm_1, made around the attempts' times (opgate did not send "
            "it its operation id)",
            "request": "",
        },
        {"search": "a request sent with Idempotency-Key = opk_1", "request": ""},
    ]
    assert not explain.looks_up(confirm)
    refund = stripe.rule_named("refund.create")
    assert refund is not None
    assert explain.looks_up(refund)


def test_the_dashboard_link_quotes_each_value() -> None:
    """The policy's dashboard template gets the operation id URL-quoted; no template, no
    link."""
    stripe = POLICY.provider_named("stripe")
    assert stripe is not None
    url = explain.dashboard_url(stripe, Subject("op_1&x=2"))
    assert url == "https://dashboard.stripe.com/search?query=op_1%26x%3D2"
    square = POLICY.provider_named("square")
    assert square is not None
    assert explain.dashboard_url(square, Subject("op_1")) is None


def test_each_attempt_is_one_line_and_each_lookup_try_once() -> None:
    """An attempt's claim and its end make one line; each reconciliation try is one entry."""
    events = [
        {"event": "created", "at": "t0", "actor": "admin", "detail": {}},
        {"event": "claimed", "at": "t1", "actor": "vm", "detail": {"attempt": 1}},
        {
            "event": "unknown",
            "at": "t2",
            "actor": "vm",
            "detail": {"attempt": 1, "outcome": "unknown:status", "provider_status": 500},
        },
        {"event": "claimed", "at": "t3", "actor": "vm", "detail": {"attempt": 2}},
        {
            "event": "reconcile_inconclusive",
            "at": "t4",
            "actor": "loop",
            "detail": {"try": 1, "lookups": [{"path": "/v1/x?a=1&b=2", "result": "found"}]},
        },
    ]
    assert explain.attempts(events) == [
        {"attempt": 1, "at": "t1", "ended": "outcome unknown: the provider answered 500"},
        {"attempt": 2, "at": "t3", "ended": "no end recorded yet: in flight, or its end was lost"},
    ]
    [one] = explain.lookup_tries(events, frozenset({"reconcile_inconclusive", "escalated"}))
    assert (one["try"], one["lookups"]) == (
        1,
        [{"path": "/v1/x?a=1&b=2", "found": "found it: the effect exists"}],
    )
