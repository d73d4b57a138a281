"""The precondition expression form: parsing, validation against a rule, evaluation on a
lookup's answer (proxy/policy/expressions.py)."""

from __future__ import annotations

import contextlib
import json
import textwrap
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.policy.expressions import (
    Approved,
    ExpressionError,
    Literal,
    Pointer,
    evaluate,
    parse,
    problems,
    resolve,
)
from proxy.policy.load import parse_policy_text

CHARGE: dict[str, Any] = {
    "amount": 2000,
    "amount_refunded": 500,
    "refunded": False,
    "status": "succeeded",
    "a/b": 1,
    "m~n": 2,
    "refunds": {"data": [{"id": "re_1"}]},
}
APPROVED: dict[str, Any] = {
    "amount": 1500,
    "currency": "usd",
    "params": {"charge": "ch_1"},
    "path_params": {"intent": "pi_1"},
}


def test_parse_reads_the_stripe_refund_assertions() -> None:
    """Pointers, approved values, a sum and literals parse into their terms."""
    assertion = parse("/amount_refunded + approved.amount <= /amount")
    assert assertion.operator == "<="
    assert assertion.left.terms == (Pointer("/amount_refunded"), Approved("amount"))
    assert assertion.right.terms == (Pointer("/amount"),)
    listed = parse('/status in ["succeeded", "pending"]')
    assert listed.right.terms == (Literal(["succeeded", "pending"]),)
    assert parse("approved.params.charge == /id").left.terms == (Approved("params", "charge"),)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("/a", id="no operator"),
        pytest.param("/a ==", id="no right side"),
        pytest.param("== /a", id="no left side"),
        pytest.param("/a == 1 == 2", id="two operators"),
        pytest.param("/a == 1 and /b == 2", id="and is not in the form"),
        pytest.param("(/a) == 1", id="parentheses"),
        pytest.param("/a - 1 == 2", id="minus is not an operator"),
        pytest.param("/a * 2 == 2", id="product"),
        pytest.param("/a == amount", id="bare word"),
        pytest.param("/a == approved.fee", id="unknown approved field"),
        pytest.param("/a == approved.params", id="params without a name"),
        pytest.param("/a == approved.amount.x", id="amount with a name"),
        pytest.param('/a == "open', id="unterminated string"),
        pytest.param("/a == 'x'", id="single quotes"),
        pytest.param("/a~2 == 1", id="bad pointer escape"),
        pytest.param("/a == 1.5", id="fraction"),
        pytest.param("/a == 01", id="leading zero"),
        pytest.param("/a == 1true", id="terms glued together"),
        pytest.param('/a == "x"/b', id="string glued to a pointer"),
        pytest.param("/a in [/b]", id="pointer in a list"),
        pytest.param("/a in [1 2]", id="list without commas"),
        pytest.param("/a in [1,", id="unclosed list"),
        pytest.param("/a\t== 1", id="tab"),
        pytest.param("/a == __import__", id="python"),
        pytest.param("/a = 1", id="single equals"),
    ],
)
def test_parse_refuses_what_is_not_in_the_form(text: str) -> None:
    """Anything outside the small grammar is an ExpressionError, never a guess."""
    with pytest.raises(ExpressionError):
        parse(text)


@pytest.mark.parametrize(
    ("text", "held"),
    [
        pytest.param("/refunded == false", True, id="boolean equal"),
        pytest.param('/status == "succeeded"', True, id="string equal"),
        pytest.param('/status != "succeeded"', False, id="string unequal"),
        pytest.param("/amount_refunded + approved.amount <= /amount", True, id="room exactly"),
        pytest.param("/amount_refunded + approved.amount + 1 <= /amount", False, id="no room"),
        pytest.param("/amount > 1999", True, id="greater"),
        pytest.param("/amount >= 2001", False, id="not at least"),
        pytest.param("/amount < -1", False, id="negative literal"),
        pytest.param('/status in ["pending", "succeeded"]', True, id="in a list"),
        pytest.param('/status in ["canceled"]', False, id="not in a list"),
        pytest.param("/a~1b == 1", True, id="escaped slash"),
        pytest.param("/m~0n == 2", True, id="escaped tilde"),
        pytest.param('/refunds/data/0/id == "re_1"', True, id="array index"),
        pytest.param('approved.currency == "usd"', True, id="approved currency"),
        pytest.param('approved.path_params.intent == "pi_1"', True, id="path parameter"),
        pytest.param("/refunded == 0", False, id="a boolean is no number"),
        pytest.param('/amount == "2000"', False, id="a string is no number"),
    ],
)
def test_evaluate_on_an_answer(text: str, held: bool) -> None:
    """Each operator on a Stripe-like charge, with strict JSON types."""
    outcome = evaluate(parse(text), CHARGE, APPROVED)
    assert outcome.held is held, outcome


def test_evidence_names_what_each_pointer_read() -> None:
    """The outcome carries the values compared, so a refusal can show them."""
    outcome = evaluate(parse("/amount_refunded + approved.amount <= /amount"), CHARGE, APPROVED)
    assert outcome.as_evidence() == {
        "require": "/amount_refunded + approved.amount <= /amount",
        "values": {"/amount_refunded": 500, "approved.amount": 1500, "/amount": 2000},
        "held": True,
    }


def test_an_absent_pointer_cannot_be_evaluated() -> None:
    """A pointer that names nothing leaves the assertion undecided (held None), not false."""
    outcome = evaluate(parse("/missing == 1"), CHARGE, APPROVED)
    assert (outcome.held, outcome.absent, outcome.skipped) == (None, ("/missing",), False)
    summed = evaluate(parse("/status + 1 <= 2"), CHARGE, APPROVED)
    assert summed.held is None
    assert summed.why is not None


def test_an_assertion_on_an_approved_value_the_operation_lacks_is_skipped() -> None:
    """A full refund (no approved amount) skips the 'room for this amount' assertion."""
    outcome = evaluate(
        parse("/amount_refunded + approved.amount <= /amount"),
        CHARGE,
        {**APPROVED, "amount": None},
    )
    assert outcome.skipped
    assert outcome.held is None


def rule_problems(text: str, **rule: Any) -> list[str]:
    fields = {
        "has_amount": True,
        "has_currency": False,
        "params": frozenset({"charge"}),
        "path_params": frozenset(),
        **rule,
    }
    return problems(parse(text), **fields)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("/amount_refunded + approved.amount <= /amount", [], id="fits the rule"),
        pytest.param("approved.currency == /currency", ["approves no currency"], id="currency"),
        pytest.param("approved.params.customer == /c", ["not among"], id="unknown param"),
        pytest.param("approved.path_params.intent == /c", ["has no {intent}"], id="path"),
        pytest.param('/a + "x" == 1', ["+ sums numbers"], id="summing a string"),
        pytest.param("/a <= true", ["orders numbers"], id="ordering a boolean"),
        pytest.param('/a in "x"', ["needs a list"], id="in a string"),
        pytest.param('approved.amount in ["x"]', ["no item"], id="number in strings"),
        pytest.param('approved.amount == "5"', ["never equal"], id="number equal to string"),
        pytest.param("/a == /b", [], id="two pointers are known only at lookup"),
    ],
)
def test_problems_against_the_rule(text: str, expected: list[str]) -> None:
    """Unknown approved fields and types that can never compare are reported."""
    found = rule_problems(text)
    assert len(found) == len(expected), found
    for problem, part in zip(found, expected, strict=True):
        assert part in problem


def test_the_policy_loader_reports_a_bad_precondition_at_its_rule() -> None:
    """policy check refuses a malformed assertion and one naming an unapproved value."""
    text = textwrap.dedent("""\
        version: 1
        provider: pay
        route_prefix: /pay
        upstream: https://pay.example
        rules:
          - name: refund.create
            method: POST
            path: /v1/refunds
            amount: amount
            params: [charge]
            preconditions:
              lookups:
                - path: /v1/charges/{charge}
                  require: ["/refunded == false", "/a == == 1"]
          - name: charge.capture
            method: POST
            path: /v1/charges/{charge}/capture
            preconditions:
              lookups:
                - path: /v1/charges/{charge}
                  require: ["/captured == approved.currency"]
        """)
    provider, found = parse_policy_text(text, "pay.yaml")
    assert provider is None
    messages = [str(p) for p in found]
    assert len(messages) == 2, messages
    assert "'/a == == 1'" in messages[0]
    assert "pay.yaml:" in messages[0]
    assert "approves no currency" in messages[1]


_SEGMENT = st.text(st.sampled_from("ab_.-~/0"), max_size=4)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=8,
)


@given(st.lists(_SEGMENT, min_size=1, max_size=4), _JSON)
def test_a_pointer_escaped_from_any_keys_resolves_to_the_value_there(
    keys: list[str], value: Any
) -> None:
    """RFC 6901: keys with / and ~ escaped as ~1 and ~0 find exactly the nested value."""
    document: Any = value
    for key in reversed(keys):
        document = {key: document}
    text = "".join("/" + k.replace("~", "~0").replace("/", "~1") for k in keys)
    pointers = [t for t in parse(f"{text} == null").terms() if isinstance(t, Pointer)]
    assert pointers == [Pointer(text)]
    assert resolve(document, pointers[0]) == value


@given(st.integers(-(10**9), 10**9), st.integers(-(10**9), 10**9), st.integers(0, 10**9))
def test_a_sum_compares_as_integers(a: int, b: int, c: int) -> None:
    """'/x + approved.amount <= /y' holds exactly when x + amount <= y."""
    outcome = evaluate(
        parse("/x + approved.amount <= /y"), {"x": a, "y": c}, {"amount": b, "params": {}}
    )
    assert outcome.held is (a + b <= c)


@given(st.text(max_size=30))
def test_parse_never_fails_otherwise_than_by_expression_error(text: str) -> None:
    """Any input parses or raises ExpressionError: no other exception, no evaluation of it."""
    with contextlib.suppress(ExpressionError):
        parse(text)


@given(_JSON.filter(lambda v: not isinstance(v, dict)))
def test_a_literal_equals_itself_in_the_json_it_came_from(value: Any) -> None:
    """A JSON literal written into an assertion compares equal to the same value answered."""
    if isinstance(value, list) and any(isinstance(v, list | dict) for v in value):
        return  # a list literal holds scalars only
    outcome = evaluate(parse(f"/v == {json.dumps(value)}"), {"v": value}, {"params": {}})
    assert outcome.held is True


def test_a_lookup_template_naming_what_the_rule_never_approves_is_refused() -> None:
    """A misspelt {chrge} would skip the lookup on every operation: the loader says so."""
    text = textwrap.dedent("""\
        version: 1
        provider: pay
        route_prefix: /pay
        upstream: https://pay.example
        rules:
          - name: refund.create
            method: POST
            path: /v1/refunds
            params: [charge]
            preconditions:
              lookups:
                - {path: "/v1/charges/{chrge}", query: {x: "{operation_id}"}, require: [/a == 1]}
        """)
    provider, found = parse_policy_text(text, "pay.yaml")
    assert provider is None
    [message] = [str(p) for p in found]
    assert "{chrge} is neither among the rule's params nor a path parameter" in message


_KEY = st.text(st.sampled_from("abz_.-~/09"), min_size=1, max_size=4)
_POINTER_TEXT = st.lists(_KEY, min_size=1, max_size=3).map(
    lambda keys: "".join("/" + k.replace("~", "~0").replace("/", "~1") for k in keys)
)
_SCALAR = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=4)
_TERM = st.one_of(
    _POINTER_TEXT.map(lambda t: (t, Pointer(t))),
    _SCALAR.map(lambda v: (json.dumps(v), Literal(v))),
    st.sampled_from(["amount", "currency"]).map(lambda f: (f"approved.{f}", Approved(f))),
    st.sampled_from(["charge", "metadata[order]", "/payment_id"]).map(
        lambda n: (f"approved.params.{n}", Approved("params", n))
    ),
)


@given(
    st.lists(_TERM, min_size=1, max_size=3),
    st.sampled_from(["==", "!=", "<=", "<", ">=", ">", "in"]),
    st.lists(_TERM, min_size=1, max_size=3),
    st.sampled_from([" ", "  "]),
)
def test_every_assertion_of_the_grammar_parses_to_its_terms(
    left: list[tuple[str, Any]], operator: str, right: list[tuple[str, Any]], space: str
) -> None:
    """Whatever the terms, an assertion written in the form parses back to exactly them."""
    text = space.join(
        [
            f"{space}+{space}".join(t for t, _ in left),
            operator,
            f"{space}+{space}".join(t for t, _ in right),
        ]
    )
    assertion = parse(text)
    assert assertion.operator == operator
    assert assertion.left.terms == tuple(term for _, term in left)
    assert assertion.right.terms == tuple(term for _, term in right)
