"""Preconditions through the real pipeline against the fault provider: when they are asked,
what a failed, hanging or racing lookup does, and shadow mode (proxy/gate/preconditions.py).
The pure parts (triggers, judging an answer) are tested here too, without sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from structlog.testing import capture_logs

from proxy.gate.preconditions import Failed, Held, Unverifiable, judge_answer, recheck_due
from proxy.policy.load import parse_policy_text
from proxy.policy.model import Rule
from proxy.store.operation import Status
from tests.support.facts import make_operation as make_op
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.opgate import StartOpgate, admin_headers, problem
from tests.support.pipeline import GOOD_BODY, op_header
from tests.support.polling import until
from tests.support.preconditions import gets, policy_with_preconditions, posts

REFUND = "/fault/v1/refunds"


@pytest.fixture
def stalled_lookups(fault_provider: FaultProvider) -> Iterator[FaultProvider]:
    """Every GET (the precondition's lookup) takes the list when it arrives and answers it only
    once released; POSTs go as the mode says."""
    fault_provider.chooser = lambda r: FaultMode.STALL_AFTER_COMMIT if r.method == "GET" else None
    yield fault_provider
    fault_provider.chooser = None
    fault_provider.release()


async def refund_directly(provider: FaultProvider) -> None:
    """A human refunds the charge at the provider, not through opgate."""
    async with (
        aiohttp.ClientSession(trust_env=False) as session,
        session.post(
            f"{provider.url}/v1/refunds",
            data={"charge": "ch_1", "amount": "500", "currency": "usd"},
        ) as response,
    ):
        assert response.status == 200


# --- through the pipeline --------------------------------------------------------------------


async def test_a_lookup_that_times_out_refuses_and_sends_nothing(
    start_opgate: StartOpgate, policy_dir: Path, stalled_lookups: FaultProvider
) -> None:
    """The lookup hangs past the provider's timeout: 503 precondition_unverifiable, no POST at
    the provider, the row still created and sendable."""
    (policy_dir / "fault.yaml").write_text(policy_with_preconditions(total_timeout=0.3))
    async with start_opgate(upstream_overrides={"fault": stalled_lookups.url}) as gate:
        op = await gate.approve()
        with capture_logs() as logs:
            status, headers, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        row = await gate.operation(op["operation_id"])
    refused = problem(body)
    assert (status, refused["code"]) == (503, "precondition_unverifiable")
    assert "UpstreamTimeout" in refused["detail"]
    assert refused["precondition"]["lookups"][0]["path"] == "/v1/refunds?charge=ch_1"
    assert headers["Retry-After"] == "1"
    assert (posts(stalled_lookups), len(stalled_lookups.effects)) == (0, 0)
    assert (row["status"], row["attempts"], row["next_action"]) == ("created", 0, "send")
    [audit] = [e for e in logs if e["event"] == "request"]
    assert (audit["decision"], audit["reason"]) == ("deny", "precondition_unverifiable")


async def test_a_superseding_operation_is_checked_and_refused_when_a_human_refunded_meanwhile(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """The first operation failed with no effect (reconciled); a human then refunded the charge.
    The superseding operation, though freshly approved, is asked first and refused, and the
    agent's list of unsettled operations tells it a new approval is needed, with the evidence."""
    text = policy_with_preconditions(recheck=3600, total_timeout=0.3, grace_seconds=0)
    (policy_dir / "fault.yaml").write_text(text)
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        old = await superseded_after_no_effect(gate, fault_provider)
        await refund_directly(fault_provider)
        new = await gate.approve(supersedes=old)
        status, _, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(new))
        row = await gate.operation(new["operation_id"])
        _, _, listed = await gate.send(
            "/_opgate/v1/operations", method="GET", data=None, content_type=None
        )
    refused = problem(body)
    assert (status, refused["code"]) == (409, "precondition_failed")
    assert refused["precondition"]["trigger"] == "supersedes"
    [unsettled] = json.loads(listed)["operations"]  # the old one failed: only the new is open
    assert unsettled["operation"]["operation_id"] == new["operation_id"]
    assert unsettled["next_action"] == "new_approval_required"
    assert unsettled["precondition"] == refused["precondition"]
    [_, assertion] = refused["precondition"]["lookups"][0]["assertions"]
    assert assertion["held"] is False
    [seen] = assertion["values"]["/data"]  # the human's refund, no operation id on it
    assert (seen["id"], seen["metadata"]) == (fault_provider.effects[0].id, {})
    assert len(fault_provider.effects) == 1
    assert (row["status"], row["next_action"]) == ("created", "new_approval_required")
    assert [e["event"] for e in row["events"]] == ["created", "precondition_failed"]


async def test_a_superseding_operation_is_sent_once_when_nothing_happened_meanwhile(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """Same, but nobody refunded: the lookup shows no refund and the new operation goes once."""
    text = policy_with_preconditions(recheck=3600, total_timeout=0.3, grace_seconds=0)
    (policy_dir / "fault.yaml").write_text(text)
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        old = await superseded_after_no_effect(gate, fault_provider)
        lookups_before = len(gets(fault_provider))
        new = await gate.approve(supersedes=old)
        status, headers, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(new))
        row = await gate.operation(new["operation_id"])
    assert (status, headers["X-Operation-Status"]) == (200, "confirmed")
    assert len(gets(fault_provider)) == lookups_before + 1  # asked once, before the send
    [effect] = fault_provider.effects
    assert effect.operation_id == new["operation_id"]
    assert (row["status"], row["attempts"]) == ("confirmed", 1)


async def test_a_re_send_of_an_aged_approval_nothing_of_which_left_is_checked_first(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
) -> None:
    """The first send could not connect (nothing left); two hours later a human has refunded
    the charge. The re-send is the first that could reach the provider, of an approval past
    its recheck age: it is asked first, refused, and nothing is sent. The recovery read says a
    new approval is needed, with the evidence."""
    (policy_dir / "fault.yaml").write_text(policy_with_preconditions(recheck=300))
    with unreachable() as dead_url:
        async with start_opgate(upstream_overrides={"fault": dead_url}) as gate:
            op = await refused_at_connect_then_aged(gate, database_url)
            await refund_directly(fault_provider)
            gate.running.gateway.settings.upstream_overrides["fault"] = fault_provider.url
            status, _, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
            row = await gate.operation(op["operation_id"])
            _, _, listed = await gate.send(
                "/_opgate/v1/operations", method="GET", data=None, content_type=None
            )
    refused = problem(body)
    assert (status, refused["code"]) == (409, "precondition_failed")
    assert refused["precondition"]["trigger"] == "approval_age"
    assert (posts(fault_provider), len(fault_provider.effects)) == (1, 1)  # the human's alone
    assert (row["status"], row["last_outcome"]) == ("dispatched", "not_sent")
    assert row["next_action"] == "new_approval_required"
    [unsettled] = json.loads(listed)["operations"]
    assert unsettled["next_action"] == "new_approval_required"
    assert unsettled["precondition"] == refused["precondition"]
    assert [e["event"] for e in row["events"]] == [
        "created", "claimed", "unknown", "precondition_failed"
    ]  # fmt: skip


async def test_a_re_send_of_an_aged_approval_nothing_of_which_left_goes_once_if_it_holds(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
) -> None:
    """Same, but nobody refunded: one lookup, then the re-send, once."""
    (policy_dir / "fault.yaml").write_text(policy_with_preconditions(recheck=300))
    with unreachable() as dead_url:
        async with start_opgate(upstream_overrides={"fault": dead_url}) as gate:
            op = await refused_at_connect_then_aged(gate, database_url)
            gate.running.gateway.settings.upstream_overrides["fault"] = fault_provider.url
            status, _, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
            row = await gate.operation(op["operation_id"])
    assert status == 200
    assert [r.method for r in fault_provider.requests] == ["GET", "POST"]  # asked, then sent
    [effect] = fault_provider.effects
    assert effect.operation_id == op["operation_id"]
    assert (row["status"], row["attempts"]) == ("confirmed", 2)


async def test_a_re_send_after_an_attempt_that_may_have_left_is_not_checked(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
) -> None:
    """An attempt that timed out may have refunded: a lookup would find its own effect. The
    re-send (the provider deduplicates the key) is not looked up, however old the approval."""
    text = policy_with_preconditions(recheck=300, total_timeout=0.3, deduplicates=True)
    (policy_dir / "fault.yaml").write_text(text)
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.STALL
        status, _, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        assert status == 504
        fault_provider.release()
        fault_provider.mode = FaultMode.OK
        await age_approval(database_url, op["operation_id"], hours=2)
        status, _, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        row = await gate.operation(op["operation_id"])
    assert status == 200
    assert [r.method for r in fault_provider.requests] == ["POST", "POST"]  # no lookup
    assert (row["status"], row["attempts"]) == ("confirmed", 2)


async def refused_at_connect_then_aged(gate: Any, database_url: str) -> dict[str, Any]:
    """An approved operation whose first send found the provider refusing connections (nothing
    left), its approval then two hours old. Returns the approval."""
    op: dict[str, Any] = await gate.approve()
    status, _, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    assert status == 502  # upstream_unavailable: refused before a byte left
    await age_approval(database_url, op["operation_id"], hours=2)
    return op


@contextlib.contextmanager
def unreachable() -> Iterator[str]:
    """A loopback address that refuses connections: bound, never listening."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{closed.getsockname()[1]}"
    finally:
        closed.close()


async def age_approval(database_url: str, operation_id: str, *, hours: int) -> None:
    """As if the approval had been made ``hours`` earlier (the provider was down that long)."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE operations SET created_at = created_at - make_interval(hours => $2)"
            " WHERE operation_id = $1",
            operation_id,
            hours,
        )
    finally:
        await conn.close()


async def superseded_after_no_effect(gate: Any, provider: FaultProvider) -> str:
    """An operation whose attempt timed out with nothing done, then reconciled as failed with
    no effect: the kind a new approval may supersede. Returns its id."""
    op = await gate.approve()
    provider.mode = FaultMode.STALL
    status, _, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    assert status == 504
    provider.release()
    provider.mode = FaultMode.OK
    async with gate.http.post(
        f"{gate.ops_url}/v1/operations/{op['operation_id']}/reconcile", headers=admin_headers()
    ) as response:
        assert response.status == 200
    row = await gate.operation(op["operation_id"])
    assert (row["status"], row["settled_reason"]) == ("failed", "no_effect")
    assert provider.effects == []
    operation_id: str = op["operation_id"]
    return operation_id


async def test_two_concurrent_sends_both_look_up_and_only_one_claims(
    start_opgate: StartOpgate, policy_dir: Path, stalled_lookups: FaultProvider
) -> None:
    """Two sends of one operation both pass the lookup (held until both are out), then race to
    claim: one is sent, the other is refused or replayed, and the provider has one refund."""
    (policy_dir / "fault.yaml").write_text(policy_with_preconditions())
    async with start_opgate(upstream_overrides={"fault": stalled_lookups.url}) as gate:
        op = await gate.approve()
        sends = [
            asyncio.create_task(gate.send(REFUND, data=GOOD_BODY, headers=op_header(op)))
            for _ in range(2)
        ]
        # both lookups are out before either answers
        await until(lambda: stalled_lookups.stalled == 2, "two lookups at the provider")
        stalled_lookups.release()
        answers = await asyncio.gather(*sends)
        row = await gate.operation(op["operation_id"])
    statuses = sorted(status for status, _, _ in answers)
    assert statuses in ([200, 200], [200, 409]), answers
    if statuses == [200, 409]:
        loser = next(body for status, _, body in answers if status == 409)
        assert problem(loser)["code"] == "operation_in_flight"
    assert len(gets(stalled_lookups)) == 2
    assert (posts(stalled_lookups), len(stalled_lookups.effects)) == (1, 1)
    assert (row["status"], row["attempts"]) == ("confirmed", 1)


async def test_two_replicas_sending_one_operation_make_one_effect(
    start_opgate: StartOpgate, policy_dir: Path, stalled_lookups: FaultProvider
) -> None:
    """Two opgate replicas on one database each receive the send and each look up (held until
    both are out); the claim on the shared row lets one send through."""
    (policy_dir / "fault.yaml").write_text(policy_with_preconditions())
    overrides = {"upstream_overrides": {"fault": stalled_lookups.url}}
    async with start_opgate(**overrides) as first, start_opgate(**overrides) as second:
        op = await first.approve()
        sends = [
            asyncio.create_task(gate.send(REFUND, data=GOOD_BODY, headers=op_header(op)))
            for gate in (first, second)
        ]
        await until(lambda: stalled_lookups.stalled == 2, "both replicas' lookups")
        stalled_lookups.release()
        answers = await asyncio.gather(*sends)
        row = await first.operation(op["operation_id"])
    assert 200 in [status for status, _, _ in answers], answers
    assert (posts(stalled_lookups), len(stalled_lookups.effects)) == (1, 1)
    assert (row["status"], row["attempts"]) == ("confirmed", 1)


async def test_shadow_mode_sends_and_audits_would_deny(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """In report mode a failed precondition is only audited (would_deny) and the request goes;
    the operation keeps no failure."""
    (policy_dir / "fault.yaml").write_text(policy_with_preconditions(mode="report"))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        await refund_directly(fault_provider)
        op = await gate.approve()
        with capture_logs() as logs:
            status, _, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        row = await gate.operation(op["operation_id"])
    assert status == 200
    assert len(fault_provider.effects) == 2
    [audit] = [e for e in logs if e["event"] == "request"]
    assert (audit["decision"], audit["would_deny"]) == ("allow", "precondition_failed")
    assert audit["precondition"]["lookups"][0]["assertions"][1]["held"] is False
    assert "precondition_failed" not in [e["event"] for e in row["events"]]


# --- pure ------------------------------------------------------------------------------------


def refund_rule(recheck: float) -> Rule:
    provider, found = parse_policy_text(policy_with_preconditions(recheck), "fault.yaml")
    assert provider is not None, found
    rule = provider.rule_named("refund.create")
    assert rule is not None
    return rule


@pytest.mark.parametrize(
    ("recheck", "age", "supersedes", "status", "expected"),
    [
        pytest.param(0, 0, None, Status.CREATED, "approval_age", id="always"),
        pytest.param(300, 299, None, Status.CREATED, None, id="young approval"),
        pytest.param(300, 300, None, Status.CREATED, "approval_age", id="old approval"),
        pytest.param(300, 1, "op_old", Status.CREATED, "supersedes", id="superseding"),
    ],
)
def test_recheck_due(
    recheck: float, age: int, supersedes: str | None, status: Status, expected: str | None
) -> None:
    """A recheck is due before a created operation's send when its approval is old enough or
    it supersedes another."""
    op = make_op(status=status, supersedes=supersedes)
    op = replace(op, created_at=op.read_at - timedelta(seconds=age))
    assert recheck_due(refund_rule(recheck), op) == expected


@pytest.mark.parametrize(
    ("attempts", "unsent", "outcome", "expected"),
    [
        pytest.param(1, 1, "not_sent", "approval_age", id="the attempt never left"),
        pytest.param(3, 3, "not_sent", "approval_age", id="none of three left"),
        pytest.param(1, 0, "unknown:timeout", None, id="the attempt may have landed"),
        pytest.param(2, 1, "not_sent", None, id="an earlier attempt may have landed"),
        pytest.param(1, 0, None, None, id="its replica died mid-attempt"),
    ],
)
def test_a_re_send_is_checked_only_while_nothing_of_the_operation_left(
    attempts: int, unsent: int, outcome: str | None, expected: str | None
) -> None:
    """A re-send whose every attempt ended before a byte left is the first that can reach the
    provider: checked as a first send. After one that may have reached it, a lookup would find
    that attempt's own effect: not checked (reconciliation settles it)."""
    op = make_op(
        status=Status.DISPATCHED, attempts=attempts, unsent_attempts=unsent, last_outcome=outcome
    )
    aged = replace(op, created_at=op.read_at - timedelta(hours=2))
    assert recheck_due(refund_rule(300), aged) == expected
    assert recheck_due(refund_rule(300), replace(aged, created_at=op.read_at)) is None


def test_an_operation_approved_from_a_proposal_is_always_rechecked() -> None:
    """A proposal was decided on the world as the agent saw it when proposing: its operation's
    first send is rechecked even when its approval is young."""
    op = make_op()
    young = replace(op, created_at=op.read_at, approval_ref="prop_0123456789abcdef01234567")
    assert recheck_due(refund_rule(300), young) == "proposal"
    assert recheck_due(refund_rule(300), replace(young, approval_ref="ticket-1")) is None


def test_a_rule_without_preconditions_never_rechecks() -> None:
    """No preconditions, no lookup, whatever the operation."""
    rule = refund_rule(0).model_copy(update={"preconditions": None})
    assert recheck_due(rule, make_op(supersedes="op_old")) is None


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        pytest.param(200, {"object": "list", "data": []}, Held, id="held"),
        pytest.param(200, {"object": "list", "data": [{"id": "re_1"}]}, Failed, id="refunded"),
        pytest.param(200, {"object": "list"}, Unverifiable, id="absent pointer"),
        pytest.param(200, {"object": "x"}, Failed, id="false beats absent"),
        pytest.param(500, {"data": []}, Unverifiable, id="provider error"),
        pytest.param(404, {}, Unverifiable, id="not found"),
    ],
)
def test_judge_answer(status: int, body: dict[str, Any], kind: type) -> None:
    """An answer's status and values decide held, failed or unverifiable."""
    rule = refund_rule(0)
    assert rule.preconditions is not None
    lookup = rule.preconditions.lookups[0]
    judged = judge_answer(
        lookup, "/v1/refunds?charge=ch_1", status, json.dumps(body).encode(), make_op()
    )
    assert isinstance(judged, kind), judged


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"<html>", id="html"),
        pytest.param(b'{"object": NaN, "data": []}', id="NaN"),
        pytest.param(b'{"object": "list", "data": [Infinity]}', id="Infinity"),
        pytest.param(b'{"object": "list", "data": [] ', id="truncated"),
    ],
)
def test_judge_answer_refuses_what_is_not_json(body: bytes) -> None:
    """An answer that is not JSON (Python's reader would take NaN) cannot be evaluated."""
    rule = refund_rule(0)
    assert rule.preconditions is not None
    judged = judge_answer(rule.preconditions.lookups[0], "/x", 200, body, make_op())
    assert isinstance(judged, Unverifiable)


def test_evidence_from_the_provider_is_made_storable() -> None:
    """A NUL or a lone surrogate in the provider's answer is replaced before it is kept."""
    rule = refund_rule(0)
    assert rule.preconditions is not None
    body = rb'{"object": "li\u0000st", "data": ["\ud800"]}'
    judged = judge_answer(rule.preconditions.lookups[0], "/x", 200, body, make_op())
    assert isinstance(judged, Failed)
    values = [a["values"] for a in judged.evidence["assertions"]]
    assert values == [{"/object": "li\ufffdst"}, {"/data": ["\ufffd"]}]
