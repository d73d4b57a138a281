"""The pipeline's first send, against the fault provider on loopback and a real PostgreSQL:
one way for every request, the row loaded, the pure checks decided, then the row claimed, so
that what the checks and the preconditions decide is decided once, before any claim."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from proxy.gate import pipeline, preconditions
from proxy.recovery.reconcile import reconcile_now
from proxy.store.operation import Operation, Status
from proxy.store.store import Claim
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import Opgate, StartOpgate
from tests.support.pipeline import op_header
from tests.support.preconditions import gets, policy_with_preconditions, posts
from tests.support.store_calls import count_store_calls

REFUND = "/fault/v1/refunds"
GOOD_BODY = "amount=500&currency=usd&charge=ch_1"


@pytest.mark.parametrize(
    ("naming", "loaded_by"),
    [  # opgate's header, or the provider's key (as SDKs send it)
        ("X-Operation-Id", "load"),
        ("Idempotency-Key", "load_by_key"),
    ],
)
async def test_the_approved_request_is_loaded_then_claimed(
    fault_gate: Opgate,
    fault_provider: FaultProvider,
    monkeypatch: pytest.MonkeyPatch,
    naming: str,
    loaded_by: str,
) -> None:
    """A first send takes the one way: one load, the checks, one claim, one refund."""
    op = await fault_gate.approve()
    named = op["operation_id"] if naming == "X-Operation-Id" else op["idempotency_key"]
    calls = count_store_calls(fault_gate, monkeypatch)
    status, headers, body = await fault_gate.send(REFUND, data=GOOD_BODY, headers={naming: named})
    assert status == 200, body
    assert (headers["X-Operation-Id"], headers["X-Operation-Status"]) == (
        op["operation_id"],
        "confirmed",
    )
    assert calls == Counter({loaded_by: 1, "claim": 1})
    [received] = fault_provider.requests
    assert received.headers["Idempotency-Key"] == op["idempotency_key"]
    row = await fault_gate.operation(op["operation_id"])
    assert [e["event"] for e in row["events"]] == ["created", "claimed", "confirmed"]


async def test_a_currency_the_checks_accept_in_any_case_is_sent(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """A row whose currency is spelt ``Usd`` (written around the operations API, which keeps
    ``usd``): the checks accept a request in ``usd`` (ASCII letters without case), and it is
    sent once."""
    op = await fault_gate.approve()
    store = fault_gate.running.gateway.store
    await store.run(
        lambda conn: conn.execute(
            "UPDATE operations SET currency = 'Usd' WHERE operation_id = $1", op["operation_id"]
        )
    )
    status, _, body = await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    assert status == 200, body
    assert len(fault_provider.requests) == 1


# --- a rule with preconditions: the lookup, when due, comes before the one claim ----------
async def test_a_fresh_approval_under_preconditions_is_sent_without_a_lookup(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An approval younger than the rule's recheck age needs no lookup: a load and a claim, no
    GET at the provider, one refund."""
    (policy_dir / "fault.yaml").write_text(policy_with_preconditions(recheck=3600))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        calls = count_store_calls(gate, monkeypatch)
        status, headers, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        sent_with = Counter(calls)  # the operations API reads the row too, below
        row = await gate.operation(op["operation_id"])
    assert (status, headers["X-Operation-Status"]) == (200, "confirmed"), body
    assert sent_with == Counter({"load": 1, "claim": 1})
    assert (gets(fault_provider), posts(fault_provider)) == ([], 1)
    assert [e["event"] for e in row["events"]] == ["created", "claimed", "confirmed"]


async def test_an_approval_due_for_its_recheck_is_looked_up_before_its_claim(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same approval, an hour and a second old: the provider is asked, and only then is
    the row claimed, once."""
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
    assert calls == Counter({"load": 1, "claim": 1})
    assert (len(gets(fault_provider)), posts(fault_provider)) == (1, 1)


async def test_a_recheck_trigger_added_to_the_list_is_looked_up_before_any_claim(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The triggers are one list, read once, before the claim: a trigger added to it makes a
    fresh approval's first send ask the provider first, then claim and send it once. Nothing
    is claimed, withdrawn or escalated on the way."""
    unstated = (*preconditions.RECHECK_TRIGGERS, lambda rule_preconditions, op: "unstated")
    (policy_dir / "fault.yaml").write_text(policy_with_preconditions(recheck=3600))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        with monkeypatch.context() as patched:
            patched.setattr(preconditions, "RECHECK_TRIGGERS", unstated)
            status, headers, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        row = await gate.operation(op["operation_id"])
    assert (status, headers["X-Operation-Status"]) == (200, "confirmed"), body
    assert (len(gets(fault_provider)), posts(fault_provider)) == (1, 1)
    assert [e["event"] for e in row["events"]] == ["created", "claimed", "confirmed"]


# --- the claim statement refusing what the checks allow: named, logged, never sent ----------
_REFUSE_CLAIMS = """
CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER refuse_claims BEFORE UPDATE ON operations
    FOR EACH ROW WHEN (NEW.status = 'dispatched' AND NEW.attempts > OLD.attempts)
    EXECUTE FUNCTION refuse_claims();
"""


async def test_a_claim_the_statement_refuses_though_the_checks_allow_it_is_logged(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """Where claim_operation claims nothing on a row that, read again, the transition module
    still lets go (here a trigger stands for a statement that disagrees with it), the agent is
    told claim_refused and the log names the disagreement; nothing is sent."""
    op = await fault_gate.approve()
    await fault_gate.running.gateway.store.run(lambda conn: conn.execute(_REFUSE_CLAIMS))
    with capture_logs() as logs:
        status, _, body = await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    assert status == 409, body
    assert json.loads(body)["code"] == "claim_refused"
    assert fault_provider.requests == []
    [line] = [entry for entry in logs if entry["event"] == "claim_refused"]
    assert line["operation_id"] == op["operation_id"]
    assert (line["transition"], line["claim"], line["attempts"]) == ("first", "first", 0)


# --- the claim commits the decision made on the row as read, before its deadline -------------
_DISPATCHED_NOT_SENT = """
UPDATE operations SET status = 'dispatched', attempts = 1, unsent_attempts = 1,
       last_outcome = 'not_sent', dispatched_at = clock_timestamp(),
       attempt_ended_at = clock_timestamp(), updated_at = clock_timestamp()
 WHERE operation_id = $1
"""


async def test_a_decision_on_a_row_a_concurrent_writer_moved_claims_nothing(
    fault_gate: Opgate, fault_provider: FaultProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-send decided on a row whose last attempt never left, while the reconciler, between
    the read and the claim, takes and gives back the row's lease (leaving it to the agent):
    the claim commits nothing the decision did not see; the agent is told decision_stale,
    nothing is sent, and the next request, decided on the row as it is then, sends it once."""
    op = await fault_gate.approve()
    gw = fault_gate.running.gateway
    await gw.store.run(lambda conn: conn.execute(_DISPATCHED_NOT_SENT, op["operation_id"]))
    real_claim = gw.store.claim
    written: list[Operation | None] = []

    async def claim_after_a_concurrent_write(
        claim: Claim, loaded: Operation | None = None
    ) -> Operation | None:
        if not written:  # the reconciler's pass, on its own connections, commits first
            written.append(await reconcile_now(gw, claim.operation_id))
        return await real_claim(claim, loaded)

    monkeypatch.setattr(gw.store, "claim", claim_after_a_concurrent_write)
    status, _, body = await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    assert status == 409, body
    assert json.loads(body)["code"] == "decision_stale"
    assert fault_provider.requests == []
    [moved] = written
    assert moved is not None
    assert (moved.status, moved.attempts) == (Status.DISPATCHED, 1)
    status, _, body = await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    assert status == 200, body
    assert len(fault_provider.requests) == 1


async def test_a_decision_past_its_deadline_claims_nothing(
    fault_gate: Opgate, fault_provider: FaultProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first send whose decision may live no time at all (its deadline is its read): the
    claim, committed after it, claims nothing; decision_stale, nothing sent, the row created."""
    op = await fault_gate.approve()
    monkeypatch.setattr(pipeline, "_decision_seconds", lambda gw, target: 0.0, raising=False)
    status, _, body = await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    assert status == 409, body
    assert json.loads(body)["code"] == "decision_stale"
    assert fault_provider.requests == []
    row = await fault_gate.running.gateway.store.load(op["operation_id"])
    assert row is not None
    assert (row.status, row.attempts) == (Status.CREATED, 0)
