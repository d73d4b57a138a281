"""Shadow mode (`mode: report`, proxy/gate/checks.py RELAXED_IN_REPORT_MODE) through the real
pipeline: payload differences are forwarded and audited as would_deny; identity and the state
machine (claims, outcomes, in-flight, replay) are enforced exactly as in enforce mode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from structlog.testing import capture_logs

from tests.support.audit_logs import audits
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.opgate import (
    OTHER_TENANT_TOKEN,
    Opgate,
    StartOpgate,
    fault_policy,
    problem,
)

REFUND = "/fault/v1/refunds"
REPLANNED = "amount=2000&currency=usd&charge=ch_1"


@pytest_asyncio.fixture(loop_scope="session")
async def report_gate(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> AsyncIterator[Opgate]:
    """opgate in front of the fault provider, the whole provider in report mode."""
    text = fault_policy(deduplicates=False).replace(
        "provider: fault\n", "provider: fault\nmode: report\n"
    )
    (policy_dir / "fault.yaml").write_text(text)
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        yield gate


async def test_a_payload_difference_is_forwarded_and_audited_as_would_deny(
    report_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """Another amount than approved is forwarded (and the row claimed and settled as usual);
    the audit says allow with would_deny amount_mismatch; a re-send replays, sending nothing."""
    op = await report_gate.approve()
    with capture_logs() as logs:
        status, headers, _ = await report_gate.send(
            REFUND, data=REPLANNED, headers={"X-Operation-Id": op["operation_id"]}
        )
        again, again_headers, _ = await report_gate.send(
            REFUND, data=REPLANNED, headers={"X-Operation-Id": op["operation_id"]}
        )
    assert status == 200
    assert headers["X-Operation-Status"] == "confirmed"
    [received] = fault_provider.requests
    assert received.body.startswith(b"amount=2000&")
    assert (again, again_headers["Idempotent-Replayed"]) == (200, "true")
    assert len(fault_provider.requests) == 1
    first, second = audits(logs)
    assert (first["decision"], first["reason"], first["would_deny"]) == (
        "allow",
        None,
        "amount_mismatch",
    )
    assert (second["decision"], second["would_deny"]) == ("replay", "amount_mismatch")
    row = await report_gate.operation(op["operation_id"])
    assert [e["event"] for e in row["events"]] == ["created", "claimed", "confirmed"]


async def test_an_exact_request_carries_no_would_deny(report_gate: Opgate) -> None:
    """In report mode a request that passes every check is audited like any other."""
    op = await report_gate.approve()
    with capture_logs() as logs:
        status, _, _ = await report_gate.send(
            REFUND,
            data="amount=500&currency=usd&charge=ch_1",
            headers={"X-Operation-Id": op["operation_id"]},
        )
    assert status == 200
    [record] = audits(logs)
    assert (record["decision"], record["would_deny"]) == ("allow", None)


async def test_identity_checks_are_never_relaxed(
    report_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """Report mode does not let a request without an operation, or with another tenant's
    operation, or with another idempotency key, through: nothing reaches the provider."""
    op = await report_gate.approve()
    missing = await report_gate.send(REFUND, data=REPLANNED)
    foreign = await report_gate.send(
        REFUND,
        data=REPLANNED,
        headers={"X-Operation-Id": op["operation_id"]},
        token=OTHER_TENANT_TOKEN,
    )
    other_key = await report_gate.send(
        REFUND,
        data=REPLANNED,
        headers={"X-Operation-Id": op["operation_id"], "Idempotency-Key": "opk_other"},
    )
    assert [(s, problem(b)["code"]) for s, _, b in (missing, foreign, other_key)] == [
        (400, "operation_required"),
        (404, "operation_unknown"),  # out of scope looks absent (test_scope_oracle.py)
        (422, "idempotency_key_mismatch"),
    ]
    assert fault_provider.requests == []


async def test_the_claim_still_holds_off_a_second_attempt(
    report_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """While a relaxed request is in flight, another (even an exact one) is 409 in flight."""
    op = await report_gate.approve()
    fault_provider.mode = FaultMode.STALL_AFTER_COMMIT
    first = asyncio.create_task(
        report_gate.send(REFUND, data=REPLANNED, headers={"X-Operation-Id": op["operation_id"]})
    )
    await fault_provider.in_flight.wait()
    status, _, body = await report_gate.send(
        REFUND,
        data="amount=500&currency=usd&charge=ch_1",
        headers={"X-Operation-Id": op["operation_id"]},
    )
    fault_provider.release()
    assert (status, problem(body)["code"]) == (409, "operation_in_flight")
    assert (await first)[0] == 200
    assert len(fault_provider.effects) == 1
