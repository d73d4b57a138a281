"""The pipeline's first send claimed as sent (proxy/gate/exact.py), against the fault provider
on loopback and a real PostgreSQL: one statement reads and claims the row, and a claim the
checks would refuse is withdrawn before anything leaves."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import proxy.gate.pipeline
from proxy.gate import preconditions
from proxy.gate.checks import RequestFacts
from proxy.gate.decision import Deny
from proxy.gate.reasons import Reason
from proxy.store.operation import Operation
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import Opgate, StartOpgate, problem
from tests.support.pipeline import op_header
from tests.support.preconditions import gets, policy_with_preconditions, posts
from tests.support.store_calls import count_store_calls

REFUND = "/fault/v1/refunds"
GOOD_BODY = "amount=500&currency=usd&charge=ch_1"


@pytest.mark.parametrize(
    "naming",
    ["X-Operation-Id", "Idempotency-Key"],  # opgate's header, or the provider's key (as SDKs send)
)
async def test_the_approved_request_is_read_and_claimed_by_one_statement(
    fault_gate: Opgate,
    fault_provider: FaultProvider,
    monkeypatch: pytest.MonkeyPatch,
    naming: str,
) -> None:
    op = await fault_gate.approve()
    named = op["operation_id"] if naming == "X-Operation-Id" else op["idempotency_key"]
    calls = count_store_calls(fault_gate, monkeypatch)
    status, headers, body = await fault_gate.send(REFUND, data=GOOD_BODY, headers={naming: named})
    assert status == 200, body
    assert (headers["X-Operation-Id"], headers["X-Operation-Status"]) == (
        op["operation_id"],
        "confirmed",
    )
    assert calls == Counter({"claim_as_sent": 1})
    [received] = fault_provider.requests
    assert received.headers["Idempotency-Key"] == op["idempotency_key"]
    row = await fault_gate.operation(op["operation_id"])
    assert [e["event"] for e in row["events"]] == ["created", "claimed", "confirmed"]


async def test_a_request_the_checks_accept_but_the_claim_cannot_state_goes_the_ordinary_way(
    fault_gate: Opgate, fault_provider: FaultProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row whose currency is spelt ``Usd`` (written around the operations API, which keeps
    ``usd``): the checks accept a request in ``usd`` (ASCII letters without case), the claim as
    sent compares two spellings only, so the ordinary claim takes the row after the checks."""
    op = await fault_gate.approve()
    store = fault_gate.running.gateway.store
    await store.run(
        lambda conn: conn.execute(
            "UPDATE operations SET currency = 'Usd' WHERE operation_id = $1", op["operation_id"]
        )
    )
    calls = count_store_calls(fault_gate, monkeypatch)
    status, _, body = await fault_gate.send(
        REFUND,
        data=GOOD_BODY,
        headers={"X-Operation-Id": op["operation_id"]},
    )
    assert status == 200, body
    assert calls == Counter({"claim_as_sent": 1, "claim": 1})
    assert len(fault_provider.requests) == 1


async def test_a_claim_the_checks_refuse_is_withdrawn_before_anything_leaves(
    fault_gate: Opgate, fault_provider: FaultProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were the claim's WHERE ever to admit what the checks refuse, the checks still run on the
    claimed row: nothing is sent, the attempt ends as not sent, and the request is refused with
    the checks' reason. A later request may then send it, once."""
    op = await fault_gate.approve()
    headers = {"X-Operation-Id": op["operation_id"]}

    def disagreeing(facts: RequestFacts, row: Operation) -> Deny:
        return Deny(Reason.AMOUNT_MISMATCH, "the checks disagree")

    with monkeypatch.context() as patched:
        patched.setattr(proxy.gate.pipeline, "first_payload_refusal", disagreeing)
        with capture_logs() as logs:
            status, _, body = await fault_gate.send(REFUND, data=GOOD_BODY, headers=headers)
    assert (status, problem(body)["code"]) == (422, "amount_mismatch")
    assert fault_provider.requests == []
    row = await fault_gate.operation(op["operation_id"])
    assert (row["status"], row["last_outcome"]) == ("dispatched", "not_sent")
    assert [e["event"] for e in row["events"]] == ["created", "claimed", "unknown"]
    [audit] = [entry for entry in logs if entry["event"] == "request"]
    assert (audit["decision"], audit["reason"]) == ("deny", "amount_mismatch")
    assert (audit["status_before"], audit["status_after"]) == ("created", "dispatched")
    assert any(entry["event"] == "claimed as sent, refused by the checks" for entry in logs)

    status, _, body = await fault_gate.send(REFUND, data=GOOD_BODY, headers=headers)
    assert status == 200, body
    assert len(fault_provider.requests) == 1


# --- a rule with preconditions: claimed as sent while no recheck is due ---------------------
async def test_a_fresh_approval_under_preconditions_is_read_and_claimed_by_one_statement(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An approval younger than the rule's recheck age needs no lookup: one store call, no
    GET at the provider, one refund."""
    (policy_dir / "fault.yaml").write_text(policy_with_preconditions(recheck=3600))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        calls = count_store_calls(gate, monkeypatch)
        status, headers, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        sent_with = Counter(calls)  # the operations API reads the row too, below
        row = await gate.operation(op["operation_id"])
    assert (status, headers["X-Operation-Status"]) == (200, "confirmed"), body
    assert sent_with == Counter({"claim_as_sent": 1})
    assert (gets(fault_provider), posts(fault_provider)) == ([], 1)
    assert [e["event"] for e in row["events"]] == ["created", "claimed", "confirmed"]


async def test_an_approval_due_for_its_recheck_is_left_for_the_lookup(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same approval, an hour and a second old: the statement claims nothing, the
    provider is asked, and only then is the row claimed."""
    (policy_dir / "fault.yaml").write_text(policy_with_preconditions(recheck=3600))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        await gate.running.gateway.store.run(
            lambda conn: conn.execute(
                "UPDATE operations SET created_at = now() - interval '3601 seconds'"
                " WHERE operation_id = $1",
                op["operation_id"],
            )
        )
        calls = count_store_calls(gate, monkeypatch)
        status, headers, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    assert (status, headers["X-Operation-Status"]) == (200, "confirmed"), body
    assert calls == Counter({"claim_as_sent": 1, "claim": 1})
    assert (len(gets(fault_provider)), posts(fault_provider)) == (1, 1)


async def test_a_claim_due_for_a_recheck_is_withdrawn_and_escalated(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reason to recheck that the claim's WHERE does not state (a trigger added to the
    pipeline's list only): the row so claimed is not sent. Withdrawn, it would be dispatched,
    where no recheck is made, so it is escalated to a human as well, and a later request
    sends nothing either."""
    unstated = (*preconditions.RECHECK_TRIGGERS, lambda rule_preconditions, op: "unstated")
    (policy_dir / "fault.yaml").write_text(policy_with_preconditions(recheck=3600))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        with monkeypatch.context() as patched, capture_logs() as logs:
            patched.setattr(preconditions, "RECHECK_TRIGGERS", unstated)
            status, _, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        row = await gate.operation(op["operation_id"])
        again, _, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    refused = problem(body)
    assert (status, refused["code"]) == (503, "precondition_unverifiable")
    assert "escalated" in refused["detail"]
    assert fault_provider.requests == []
    assert (row["status"], row["last_outcome"], row["next_action"]) == (
        "dispatched",
        "not_sent",
        "escalated",
    )
    events = row["events"]
    assert [e["event"] for e in events] == ["created", "claimed", "escalated", "unknown"]
    assert events[2]["actor"] == gate.running.gateway.settings.instance_id
    assert events[2]["detail"]["trigger"] == "unstated"
    [audit] = [entry for entry in logs if entry["event"] == "request"]
    assert (audit["decision"], audit["reason"]) == ("deny", "precondition_unverifiable")
    assert again >= 400
    assert fault_provider.requests == []
