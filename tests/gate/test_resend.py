"""Before opgate re-sends an attempt whose outcome is unknown, it asks the provider: a found
effect settles the operation and is replayed, conclusive absence lets the re-send go, and an
inconclusive answer lets it go only while the provider still deduplicates on the key."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from proxy.gate.decision import ClaimKind
from proxy.gate.resend import only_paced
from proxy.gate.transitions import ClaimRule, transition
from proxy.store.operation import LastOutcome, Operation, Status
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.operations import NOW, operation
from tests.support.opgate import StartOpgate, admin_headers, fault_policy
from tests.support.pipeline import GOOD_BODY, op_header


def lookups(provider: FaultProvider) -> list[str]:
    return [r.query_string for r in provider.requests if r.method == "GET"]


async def test_a_found_effect_is_replayed_instead_of_re_sent(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """The policy says the provider deduplicates, but it does not: the first attempt committed
    and answered 500; the agent's retry finds the effect by lookup and gets it replayed."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=True, grace_seconds=30))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        assert status == 502
        fault_provider.mode = FaultMode.OK
        status, headers, body = await gate.send(
            "/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op)
        )
        row = await gate.operation(op["operation_id"])
    assert status == 200, body
    assert headers["Idempotent-Replayed"] == "true"
    assert json.loads(body)["id"] == fault_provider.effects[0].id
    assert len(fault_provider.effects) == 1
    assert (row["status"], row["settled_reason"], row["attempts"]) == ("confirmed", "reconciled", 1)
    assert lookups(fault_provider) == ["charge=ch_1"]


async def test_conclusive_absence_lets_the_re_send_go_on_a_provider_that_does_not_deduplicate(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """The first attempt timed out with nothing committed; once the grace has passed the
    provider's complete list shows no effect, so the identical request is sent once more."""
    (policy_dir / "fault.yaml").write_text(
        fault_policy(deduplicates=False, total_timeout=0.3, grace_seconds=0)
    )
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.STALL
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        assert status == 504
        fault_provider.release()
        fault_provider.mode = FaultMode.OK
        status, _, body = await gate.send(
            "/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op)
        )
        row = await gate.operation(op["operation_id"])
    assert status == 200, body
    assert len(fault_provider.effects) == 1
    assert (row["status"], row["attempts"]) == ("confirmed", 2)
    assert lookups(fault_provider) == ["charge=ch_1"]
    assert [e["event"] for e in row["events"]] == [
        "created",
        "claimed",
        "unknown",
        "claimed",
        "confirmed",
    ]


async def test_an_inconclusive_lookup_refuses_the_re_send_on_a_provider_that_does_not_deduplicate(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """The lookup itself fails: nothing is known, the provider does not deduplicate, so the
    agent is told to wait for reconciliation, with when to ask again."""
    (policy_dir / "fault.yaml").write_text(
        fault_policy(deduplicates=False, grace_seconds=0, retry_seconds=30, max_attempts=5)
    )
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT  # the POST and the lookup: 500
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        assert status == 502
        status, headers, body = await gate.send(
            "/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op)
        )
        again, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        row = await gate.operation(op["operation_id"])
    assert (status, json.loads(body)["code"]) == (409, "reconcile_required")
    assert 1 <= int(headers["Retry-After"]) <= 30
    assert again == 409
    assert len(fault_provider.effects) == 1
    # one lookup: the second refusal is paced by the rule's retry_seconds, not asked again
    assert lookups(fault_provider) == ["charge=ch_1"]
    assert (row["status"], row["attempts"]) == ("dispatched", 1)


async def test_an_inconclusive_lookup_lets_the_re_send_go_while_the_key_is_retained(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """The provider deduplicates and the key is within its retention: when the lookup cannot
    tell, the re-send goes with the same key and the provider answers it once."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=True, grace_seconds=0))
    fault_provider.deduplicate = True
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        assert status == 502
        fault_provider.script(FaultMode.ERROR_AFTER_COMMIT, FaultMode.OK)  # lookup fails, POST ok
        status, headers, _ = await gate.send(
            "/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op)
        )
        row = await gate.operation(op["operation_id"])
    assert status == 200
    assert headers.get("Idempotent-Replayed") == "true"  # the provider's own replay
    assert len(fault_provider.effects) == 1
    assert (row["status"], row["attempts"]) == ("confirmed", 2)


async def test_past_the_key_retention_a_re_send_is_treated_as_without_deduplication(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, database_url: str
) -> None:
    """The key's retention has passed since the operation was created (the policy shortened
    it): without a lookup to ask, the re-send is refused, not trusted to the provider."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=True, retention_seconds=300))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve(ttl_seconds=300)  # no approval may outlive the key
        fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        assert status == 502
        conn = await asyncpg.connect(database_url)
        try:  # the operation was created longer ago than the provider keeps keys
            await conn.execute(
                "UPDATE operations SET created_at = now() - interval '10 minutes' "
                "WHERE operation_id = $1",
                op["operation_id"],
            )
        finally:
            await conn.close()
        fault_provider.mode = FaultMode.OK
        status, _, body = await gate.send(
            "/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op)
        )
        view = await gate.send(
            f"/_opgate/v1/operations/{op['operation_id']}",
            method="GET",
            data=None,
            content_type=None,
        )
    assert (status, json.loads(body)["code"]) == (409, "reconcile_required")
    assert "no longer deduplicates" in json.loads(body)["detail"]
    assert json.loads(view[2])["next_action"] != "retry"
    assert len(fault_provider.effects) == 1


async def test_a_re_send_waits_for_its_lookup_when_one_was_just_made(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, database_url: str
) -> None:
    """The policy wrongly says the provider deduplicates. A reconciliation (asked for by an
    admin) just failed, so the re-send's own lookup is not due: the re-send is refused until
    it is, never sent on the key's word, and once due the lookup finds the effect (found by
    tests/test_model.py: the effect used to double)."""
    (policy_dir / "fault.yaml").write_text(
        fault_policy(deduplicates=True, grace_seconds=0, retry_seconds=30)
    )
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT  # the POST and the reconciliation's GET
        status, _, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
        assert status == 502
        async with gate.http.post(
            f"{gate.ops_url}/v1/operations/{op['operation_id']}/reconcile",
            headers=admin_headers(),
        ) as response:
            assert response.status == 200
        assert lookups(fault_provider) == ["charge=ch_1"]
        fault_provider.mode = FaultMode.OK
        refused, headers, body = await gate.send(
            "/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op)
        )
        assert (refused, json.loads(body)["code"]) == (409, "reconcile_required")
        assert 20 <= int(headers["Retry-After"]) <= 30
        assert len(fault_provider.effects) == 1
        conn = await asyncpg.connect(database_url)
        try:  # the next lookup is due
            await conn.execute(
                "UPDATE operations SET next_reconcile_at = now() WHERE operation_id = $1",
                op["operation_id"],
            )
        finally:
            await conn.close()
        status, headers, _ = await gate.send(
            "/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op)
        )
    assert (status, headers.get("Idempotent-Replayed")) == (200, "true")
    assert len(fault_provider.effects) == 1


# --- "only the pacing kept the lookup": asked of the transition module ------------------------
_DECIDED = operation(
    status=Status.DISPATCHED,
    attempts=1,
    last_outcome=LastOutcome.UNKNOWN_TIMEOUT,
    lease_until=NOW - timedelta(seconds=1),
    next_reconcile_at=NOW + timedelta(seconds=30),
    created_at=NOW - timedelta(hours=1),
)
_ASKS = ClaimRule("fault", None, lookups=True)
_MOVED = NOW + timedelta(microseconds=1)
_IN_DOUBT = replace(_DECIDED, status=Status.CREATED, attempts=0, lookup_before_send=NOW)
ONLY_PACED_CASES: dict[str, tuple[Operation, bool]] = {
    "unchanged, the next lookup not due": (_DECIDED, True),
    "unchanged, in doubt after a switch (created)": (_IN_DOUBT, True),
    "moved by another writer": (replace(_DECIDED, updated_at=_MOVED), False),
    "another attempt in flight": (
        replace(_DECIDED, updated_at=_MOVED, attempts=2, lease_until=NOW + timedelta(seconds=9)),
        False,
    ),
    "settled": (replace(_DECIDED, status=Status.CONFIRMED), False),
    "escalated": (replace(_DECIDED, escalated_at=NOW), False),
    "revoked": (replace(_DECIDED, revoked_at=NOW), False),
    "expired": (replace(_DECIDED, expires_at=NOW), False),
    "reconciling": (replace(_DECIDED, reconcile_lease_until=NOW + timedelta(seconds=9)), False),
    "never sent (re-sent without a lookup)": (
        replace(_DECIDED, last_outcome=LastOutcome.NOT_SENT),
        False,
    ),
}


@pytest.mark.parametrize("scenario", sorted(ONLY_PACED_CASES))
def test_only_the_pacing_kept_the_lookup_when_the_transition_still_asks_first(
    scenario: str,
) -> None:
    """The lease refused on a row that is the version decided on and whose transition still
    claims after a lookup: paced (told when the next lookup is due); anything else moved on
    (the claim, guarded by the version, fails and is explained from the row)."""
    current, paced = ONLY_PACED_CASES[scenario]
    decided_on = _IN_DOUBT if current is _IN_DOUBT else _DECIDED
    assert only_paced(current, decided_on, _ASKS) is paced
    step = transition(current, _ASKS)
    assert paced == (step.claim is ClaimKind.RESEND_AFTER_LOOKUP and current.updated_at == NOW)
