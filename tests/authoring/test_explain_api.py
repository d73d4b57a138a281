"""`POST /v1/explain` (proxy/authoring/explain_api.py): the operations API explains a request
against the live policy and the operation read from the database, changing nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.fault_provider import FaultProvider
from tests.support.opgate import Opgate, StartOpgate, admin_headers
from tests.support.preconditions import policy_with_preconditions


async def explain(gate: Opgate, body: dict[str, Any], token: bool = True) -> tuple[int, Any]:
    async with gate.http.post(
        f"{gate.ops_url}/v1/explain", json=body, headers=admin_headers() if token else {}
    ) as response:
        return response.status, await response.json(content_type=None)


async def test_explains_every_check_against_the_stored_operation(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """A re-planned refund: the matched rule, each check in order (amount fails), the decision;
    nothing is claimed or sent."""
    op = await fault_gate.approve()
    status, body = await explain(
        fault_gate,
        {
            "method": "POST",
            "path": "/fault/v1/refunds",
            "headers": {"Content-Type": "application/x-www-form-urlencoded"},
            "body": "amount=900&currency=usd&charge=ch_1",
            "operation_id": op["operation_id"],
        },
    )
    assert status == 200, body
    assert (body["provider"], body["rule"], body["mode"]) == ("fault", "refund.create", "enforce")
    assert body["policy_version"] == fault_gate.running.gateway.policy.version
    assert [(c["check"], c["result"]) for c in body["checks"]] == [
        ("scope", "pass"),
        ("target", "pass"),
        ("idempotency_key", "pass"),
        ("amount", "fail"),
        ("currency", "pass"),
        ("params", "pass"),
        ("injected_field", "pass"),
        ("no_unexpected_fields", "pass"),
    ]
    assert (body["decision"], body["reason"], body["status"]) == ("deny", "amount_mismatch", 422)
    assert fault_provider.requests == []
    assert (await fault_gate.operation(op["operation_id"]))["status"] == "created"


async def test_an_exact_request_is_explained_as_a_first_claim(fault_gate: Opgate) -> None:
    """Named by its idempotency key only, the operation is found as the pipeline finds it."""
    op = await fault_gate.approve(agent_id="agent-a")
    status, body = await explain(
        fault_gate,
        {
            "method": "POST",
            "path": "/fault/v1/refunds",
            "headers": {
                "Content-Type": "application/x-www-form-urlencoded",
                "Idempotency-Key": op["idempotency_key"],
            },
            "body": "amount=500&currency=usd&charge=ch_1",
            "agent": {"id": "agent-a", "tenant": "t1"},
        },
    )
    assert status == 200, body
    assert body["operation_id"] == op["operation_id"]
    assert (body["decision"], body["claim"], body["would_deny"]) == ("allow", "first", None)
    assert body["state"]["claim"] == "first"


async def test_explain_needs_the_admin_token_and_a_valid_request(fault_gate: Opgate) -> None:
    """Without the admin token: 401; with a malformed request: 400 invalid_request."""
    status, _ = await explain(fault_gate, {"method": "GET", "path": "/x"}, token=False)
    assert status == 401
    status, body = await explain(fault_gate, {"method": "GET", "path": "no-slash", "x": 1})
    assert (status, body["code"]) == (400, "invalid_request")


async def test_an_explain_request_that_does_not_parse_one_way_is_refused(
    fault_gate: Opgate,
) -> None:
    """A duplicated key (which one would be explained?) is a 400, as on the agent side."""
    raw = b'{"method": "POST", "method": "GET", "path": "/fault/v1/refunds", "body": ""}'
    async with fault_gate.http.post(
        f"{fault_gate.ops_url}/v1/explain",
        data=raw,
        headers={**admin_headers(), "Content-Type": "application/json"},
    ) as response:
        status, body = response.status, await response.json(content_type=None)
    assert (status, body["code"]) == (400, "invalid_request")


async def test_precondition_lookups_are_judged_on_the_answers_given_not_asked_for(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """The rule asks the provider before every send: explain judges the lookup answer given in
    the request (a refund already made: precondition_failed) and asks the provider nothing."""
    (policy_dir / "fault.yaml").write_text(policy_with_preconditions())
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        status, body = await explain(
            gate,
            {
                "method": "POST",
                "path": "/fault/v1/refunds",
                "headers": {"Content-Type": "application/x-www-form-urlencoded"},
                "body": "amount=500&currency=usd&charge=ch_1",
                "operation_id": op["operation_id"],
                "lookups": {"/v1/refunds?charge=ch_1": {"json": {"object": "list", "data": [1]}}},
            },
        )
    assert status == 200, body
    assert (body["decision"], body["reason"]) == ("deny", "precondition_failed")
    assert body["preconditions"]["result"] == "failed"
    assert fault_provider.requests == []


async def test_an_operation_id_no_operation_can_have_is_refused_before_the_store(
    fault_gate: Opgate,
) -> None:
    """An operation id holding a NUL, too long, not ASCII or empty is 400 operation_id_invalid,
    as at every other entry point (a NUL used to reach the query: 500)."""
    for bad in ("op\x00x", "o" * 256, "op_\u202eé", ""):
        status, body = await explain(
            fault_gate,
            {"method": "POST", "path": "/fault/v1/refunds", "operation_id": bad},
        )
        assert (status, body["code"]) == (400, "operation_id_invalid"), (bad, body)
        named = {"method": "POST", "path": "/fault/v1/refunds", "headers": {"X-Operation-Id": bad}}
        status, body = await explain(fault_gate, named)
        assert status == 200, (bad, body)  # explained: the gate's own intake refuses it
        assert (body["decision"], body["reason"]) == ("deny", "operation_id_invalid"), body
