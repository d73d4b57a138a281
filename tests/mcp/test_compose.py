"""The request execute_operation composes from the approved row (pure), and the shape of the
tools' answers."""

from __future__ import annotations

import json

import pytest

from proxy.gate.decision import Deny
from proxy.gate.pipeline import ComposedRequest
from proxy.gate.reasons import Reason
from proxy.mcp.compose import compose_request
from proxy.mcp.stdio import endpoint_url
from proxy.mcp.tools import TOOLS, Answered, ToolError, tool_result
from proxy.policy.load import parse_policy_text
from proxy.policy.model import Provider
from tests.support.operations import operation
from tests.support.opgate import SHIPPED_POLICIES, fault_policy


def provider(text: str) -> Provider:
    parsed, problems = parse_policy_text(text, "inline.yaml")
    assert parsed is not None, problems
    return parsed


def test_the_composed_request_is_the_approved_one_with_the_agents_token() -> None:
    """Method, route-prefixed path, the approved body, key, operation id and the token in
    Proxy-Authorization (which is never forwarded)."""
    fault = provider(fault_policy(deduplicates=False))
    rule = fault.rule_named("refund.create")
    assert rule is not None
    op = operation(amount=500, currency="usd", params={"charge": "ch_1"}, idempotency_key="k1")
    composed = compose_request(fault, rule, op, "opg_token", {})
    assert isinstance(composed, ComposedRequest)
    assert (composed.method, composed.raw_target) == ("POST", "/fault/v1/refunds")
    assert composed.body == b"charge=ch_1&amount=500&currency=usd"
    assert composed.headers["Proxy-Authorization"] == "Bearer opg_token"
    assert composed.headers["X-Operation-Id"] == "op_1"
    assert composed.headers["Idempotency-Key"] == "k1"
    assert composed.headers["Content-Type"] == "application/x-www-form-urlencoded"


def test_free_fields_are_merged_in_and_left_to_the_checks() -> None:
    """A free field is added as given, even one the rule does not leave free: composing
    decides nothing, the pipeline's checks do."""
    fault = provider(fault_policy(deduplicates=False, body="json"))
    rule = fault.rule_named("refund.create")
    assert rule is not None
    op = operation(amount=500, currency="usd", params={"/charge": "ch_1"})
    composed = compose_request(fault, rule, op, "t", {"/reason": "dup", "/description": "x"})
    assert isinstance(composed, ComposedRequest)
    assert json.loads(composed.body) == {
        "charge": "ch_1",
        "amount": 500,
        "currency": "usd",
        "reason": "dup",
        "description": "x",
    }
    assert composed.headers["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    ("scenario", "free_fields"),
    [("form value not text", {"reason": 5}), ("list for a plain form key", {"reason": ["a"]})],
)
def test_free_fields_a_form_body_cannot_carry_are_body_invalid(
    scenario: str, free_fields: dict[str, object]
) -> None:
    """A value the rule's body cannot hold is refused as body_invalid before anything runs."""
    stripe = provider((SHIPPED_POLICIES / "stripe.yaml").read_text())
    rule = stripe.rule_named("refund.create")
    assert rule is not None
    op = operation(provider="stripe", amount=500, params={"charge": "ch_1"})
    refused = compose_request(stripe, rule, op, "t", free_fields)
    assert isinstance(refused, Deny)
    assert refused.reason is Reason.BODY_INVALID


def test_tool_errors_carry_the_code_and_answers_their_json() -> None:
    """A refusal is isError with the problem as structured content and the code first in the
    text; an answer is its JSON, isError only when the provider refused."""
    error = tool_result(ToolError({"code": "approval_revoked", "detail": "revoked"}))
    assert error.is_error
    assert error.structured_content == {"code": "approval_revoked", "detail": "revoked"}
    assert error.content[0].text == "approval_revoked: revoked"  # type: ignore[union-attr]
    answer = tool_result(Answered({"next_action": "proceed"}))
    assert not answer.is_error
    assert json.loads(answer.content[0].text) == {"next_action": "proceed"}  # type: ignore[union-attr]
    assert tool_result(Answered({}, failed=True)).is_error


def test_only_the_execute_tool_may_change_anything() -> None:
    """Annotations: the reads are read-only; only execute is destructive (proposing adds a
    proposal and changes nothing else)."""
    hints = {tool.name: tool.annotations for tool in TOOLS}
    assert all(h is not None for h in hints.values())
    writers = [name for name, h in hints.items() if h and not h.read_only_hint]
    assert writers == ["execute_operation", "propose_operation"]
    assert [name for name, h in hints.items() if h and h.destructive_hint] == ["execute_operation"]


def test_the_relay_accepts_the_listener_or_the_endpoint_address() -> None:
    """--url may name the agent listener or its /_opgate/mcp endpoint."""
    assert endpoint_url("http://127.0.0.1:8080/") == "http://127.0.0.1:8080/_opgate/mcp"
    assert endpoint_url("http://h:1/_opgate/mcp") == "http://h:1/_opgate/mcp"


def test_a_pointer_deeper_than_a_body_may_nest_is_refused_body_invalid() -> None:
    """A free field pointer of 3,000 tokens is refused as a body nested too deep is, not
    walked into a RecursionError."""
    fault = provider(fault_policy(deduplicates=False, body="json"))
    rule = fault.rule_named("refund.create")
    assert rule is not None
    op = operation(amount=500, currency="usd", params={"/charge": "ch_1"})
    refused = compose_request(fault, rule, op, "t", {"/metadata" + "/a" * 3000: "x"})
    assert isinstance(refused, Deny)
    assert refused.reason is Reason.BODY_INVALID
