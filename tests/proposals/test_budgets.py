"""Spend budgets seen from proposals: a proposal that could not fit its budget is refused when
it is proposed, and again when it is approved if the budget was spent meanwhile; both carry
what remains. (Advisory: the claim is what holds a budget, tests/gate/test_budgets.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proxy.gate.identity import token_digest
from tests.support.budgets import budgeted, send, tenant_budget
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import AGENT_TOKEN, Opgate, StartOpgate, admin_headers
from tests.support.proposals import APPROVER_TOKEN, PROPOSAL, decide


async def propose(gate: Opgate, **fields: Any) -> tuple[int, dict[str, Any]]:
    body = json.dumps({**PROPOSAL, **fields}).encode()
    status, _, raw = await gate.send(
        "/_opgate/v1/proposals", data=body, token=AGENT_TOKEN, content_type="application/json"
    )
    return status, json.loads(raw)


async def test_a_proposal_over_the_budget_is_refused_with_what_remains(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """With 1000 to spend, a proposal of 1500 is refused 403 budget_exceeded with 1000
    remaining; one of 800 is pending; after an approved 500 has been sent, approving the 800
    is refused with the 500 that remain, and no operation is created for it."""
    budgeted(policy_dir, tenant_budget(1000))
    approvers = [{"name": "olga", "token_sha256": token_digest(APPROVER_TOKEN)}]
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, approvers=approvers
    ) as gate:
        too_big = await propose(gate, amount=1500)
        fits = await propose(gate, amount=800)
        spent = await gate.approve()
        sent, _ = await send(gate, spent)
        approved = await decide(gate, fits[1]["proposal"]["proposal_id"], "approve")
        operation_id = fits[1]["proposal"]["operation_id"]
        async with gate.http.get(
            f"{gate.ops_url}/v1/operations/{operation_id}", headers=admin_headers()
        ) as response:
            created = response.status
    assert (too_big[0], too_big[1]["code"], too_big[1]["budget"]["remaining"]) == (
        403,
        "budget_exceeded",
        1000,
    )
    assert (fits[0], sent) == (201, 200)
    status, body = approved
    assert (status, body["code"], body["budget"]["remaining"]) == (403, "budget_exceeded", 500)
    assert created == 404
    assert len(fault_provider.requests) == 1
