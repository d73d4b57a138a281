"""The pipeline's first send claimed as sent (proxy/gate/exact.py), against the fault provider
on loopback and a real PostgreSQL: one statement reads and claims the row, and a claim the
checks would refuse is withdrawn before anything leaves."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

import proxy.gate.pipeline
from proxy.gate.checks import RequestFacts
from proxy.gate.decision import Deny
from proxy.gate.reasons import Reason
from proxy.store.operation import Operation
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import Opgate, problem

REFUND = "/fault/v1/refunds"
GOOD_BODY = "amount=500&currency=usd&charge=ch_1"


def count_store_calls(gate: Opgate, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often the gate's store is asked to load, claim and claim as sent."""
    store, calls = gate.running.gateway.store, Counter[str]()
    for name in ("load", "claim", "claim_as_sent"):
        real: Callable[..., Awaitable[Any]] = getattr(store, name)

        async def counted(*args: Any, _name: str = name, _real: Any = real, **kw: Any) -> Any:
            calls[_name] += 1
            return await _real(*args, **kw)

        monkeypatch.setattr(store, name, counted)
    return calls


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
