"""The pure part of proposals: planned as an approval, four eyes, and what the agent is told."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxy.admin.access import Approver
from proxy.gate.checks import Agent
from proxy.policy.load import load_policy_dir
from proxy.policy.set import PolicySet
from proxy.proposals.rules import (
    ProposalInvalid,
    four_eyes_problem,
    plan_proposal,
    proposal_view,
    read_proposal,
    replan_problems,
)
from proxy.store.proposal import Proposal
from tests.support.opgate import fault_policy

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
AGENT = Agent(agent_id="agent-a", tenant="t1")
BODY: dict[str, Any] = {
    "provider": "fault",
    "action": "refund.create",
    "amount": 500,
    "currency": "USD",
    "params": {"charge": "ch_1"},
    "reason": "a double charge",
}


def policy(tmp_path: Path, *, four_eyes: str = "") -> PolicySet:
    text = fault_policy(deduplicates=True)
    if four_eyes:
        text = text.replace("rules:\n", f"{four_eyes}\nrules:\n", 1)
    (tmp_path / "fault.yaml").write_text(text)
    return load_policy_dir(tmp_path)


def stored(tmp_path: Path, **fields: Any) -> Proposal:
    planned = plan_proposal(
        read_proposal(BODY),
        AGENT,
        policy(tmp_path),
        NOW,
        approval_seconds=600,
        pending_seconds=3600,
    )
    assert not isinstance(planned, list)
    op = planned.operation
    values: dict[str, Any] = {
        "proposal_id": planned.proposal_id,
        "operation_id": op.operation_id,
        "tenant": op.tenant,
        "agent_id": op.agent_id,
        "provider": op.provider,
        "action": op.action,
        "method": op.method,
        "path": op.path,
        "path_params": op.path_params,
        "amount": op.amount,
        "currency": op.currency,
        "params": op.params,
        "idempotency_key": op.idempotency_key,
        "reason": planned.reason,
        "approval_seconds": planned.approval_seconds,
        "status": "pending",
        "expires_at": NOW + timedelta(hours=1),
        "decided_at": None,
        "decided_by": None,
        "decision_note": None,
        "created_at": NOW,
        "read_at": NOW,
        **fields,
    }
    return Proposal(**values)


def test_a_proposal_is_planned_as_the_agents_approval(tmp_path: Path) -> None:
    """The tenant and agent are the token's, the approval reference the proposal id, and the
    currency canonical: the row an approval will copy."""
    planned = plan_proposal(
        read_proposal(BODY), AGENT, policy(tmp_path), NOW, approval_seconds=600, pending_seconds=60
    )
    assert not isinstance(planned, list)
    op = planned.operation
    assert (op.tenant, op.agent_id, op.currency, op.path) == ("t1", "agent-a", "usd", "/v1/refunds")
    assert op.approval_ref == planned.proposal_id
    assert (planned.approval_seconds, planned.pending_seconds) == (600.0, 60)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"tenant": "t2"}, "tenant"),
        ({"agent_id": "agent-z"}, "agent_id"),
        ({"amount": "500"}, "amount"),
        ({"reason": ""}, "reason"),
        ({"reason": "x" * 2001}, "reason"),
        ({"params": {"charge": None}}, "null"),
    ],
    ids=["tenant in body", "agent in body", "string amount", "no reason", "long reason", "null"],
)
def test_what_no_proposal_may_hold_is_invalid(
    tmp_path: Path, change: dict[str, Any], expected: str
) -> None:
    """Identity from the body, money as text, a missing or unbounded reason, a null value."""
    with pytest.raises(ProposalInvalid) as refused:
        plan_proposal(
            read_proposal({**BODY, **change}),
            AGENT,
            policy(tmp_path),
            NOW,
            approval_seconds=600,
            pending_seconds=60,
        )
    assert expected in str(refused.value)


def test_an_unsendable_proposal_gets_the_approval_reasons(tmp_path: Path) -> None:
    """A proposal its rule could not send gets every approval_not_sendable reason, and one
    standing longer than the provider keeps its key is refused as an approval would be."""
    planned = plan_proposal(
        read_proposal({**BODY, "params": {"charge": "ch_1", "nope": "x"}}),
        AGENT,
        policy(tmp_path),
        NOW,
        approval_seconds=600,
        pending_seconds=60,
    )
    assert planned == ["rule refund.create compares no parameters ['nope']"]
    too_long = plan_proposal(
        read_proposal(BODY),
        AGENT,
        policy(tmp_path),
        NOW,
        approval_seconds=2 * 86400,
        pending_seconds=60,
    )
    assert isinstance(too_long, list)
    assert "longer than fault keeps an idempotency key" in too_long[0]


def test_four_eyes_binds_the_agent_and_its_owner_only_where_the_policy_says(
    tmp_path: Path,
) -> None:
    """Under four_eyes the agent's owner and an approver named as the agent are refused, any
    other approver is not; without it, nobody is."""
    proposal = stored(tmp_path)
    owners = {"agent-a": "otto"}
    strict = policy(tmp_path, four_eyes="four_eyes: true")
    for name in ("otto", "agent-a"):
        assert four_eyes_problem(strict, proposal, Approver(name, "approver"), owners)
    assert four_eyes_problem(strict, proposal, Approver("olga", "approver"), owners) is None
    relaxed = policy(tmp_path)
    assert four_eyes_problem(relaxed, proposal, Approver("otto", "approver"), owners) is None


def test_a_rules_four_eyes_overrides_the_providers(tmp_path: Path) -> None:
    """four_eyes: false on the rule lets the owner approve on a four-eyes provider."""
    text = fault_policy(deduplicates=True).replace("rules:\n", "four_eyes: true\nrules:\n", 1)
    text = text.replace(
        "    method: POST\n    path: /v1/refunds\n",
        "    method: POST\n    path: /v1/refunds\n    four_eyes: false\n",
        1,
    )
    (tmp_path / "fault.yaml").write_text(text)
    loaded = load_policy_dir(tmp_path)
    proposal = stored(tmp_path)
    assert (
        four_eyes_problem(loaded, proposal, Approver("otto", "approver"), {"agent-a": "otto"})
        is None
    )


@pytest.mark.parametrize(
    ("fields", "status", "next_action"),
    [
        ({}, "pending", "wait"),
        ({"expires_at": NOW}, "expired", "new_approval_required"),
        (
            {"status": "declined", "decided_at": NOW, "decided_by": "olga"},
            "declined",
            "new_approval_required",
        ),
    ],
    ids=["pending", "expired at the database's clock", "declined"],
)
def test_what_the_agent_is_told(
    tmp_path: Path, fields: dict[str, Any], status: str, next_action: str
) -> None:
    """wait while pending (with the exact request), new_approval_required once declined or
    expired (and no request)."""
    view = proposal_view(policy(tmp_path), stored(tmp_path, **fields), None)
    assert (view["status"], view["next_action"]) == (status, next_action)
    assert ("request" in view) is (status == "pending")


def test_an_approved_proposal_tells_the_operations_next_action(tmp_path: Path) -> None:
    """Once approved the view is the operation's: its next_action, operation id and request."""
    proposal = stored(tmp_path, status="approved", decided_at=NOW, decided_by="olga")
    operation_view = {
        "operation": {"operation_id": proposal.operation_id},
        "next_action": "send",
        "reason": "approved, nothing sent yet",
        "retry_after_seconds": None,
        "request": {"path": "/fault/v1/refunds"},
    }
    view = proposal_view(policy(tmp_path), proposal, operation_view)
    assert (view["next_action"], view["operation_id"]) == ("send", proposal.operation_id)
    assert view["request"] == {"path": "/fault/v1/refunds"}


def test_a_policy_that_changed_since_the_proposal_is_caught_at_approval(tmp_path: Path) -> None:
    """Re-planned under the policy loaded at approval: a parameter the rule no longer compares
    makes it unsendable; unchanged, nothing is wrong."""
    proposal = stored(tmp_path)
    assert replan_problems(proposal, policy(tmp_path), NOW) == []
    (tmp_path / "fault.yaml").write_text(
        fault_policy(deduplicates=True).replace("params: [charge]", "params: []")
    )
    changed = load_policy_dir(tmp_path)
    assert replan_problems(proposal, changed, NOW) == [
        "rule refund.create compares no parameters ['charge']"
    ]
