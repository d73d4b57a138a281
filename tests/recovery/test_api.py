"""The recovery read on the agent listener: the authoritative row and the next action,
scoped to the agent's tenant."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from yarl import URL

from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.opgate import (
    AGENT_TOKEN,
    OTHER_TENANT_TOKEN,
    SECOND_AGENT_TOKEN,
    Opgate,
    StartOpgate,
    fault_policy,
)


def agent_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {AGENT_TOKEN}"}


async def read(gate: Opgate, path: str, token: str | None = None) -> tuple[int, Any]:
    kwargs: dict[str, Any] = {} if token is None else {"token": token}
    status, _, body = await gate.send(path, method="GET", data=None, content_type=None, **kwargs)
    return status, json.loads(body)


async def test_a_new_operation_says_send_with_the_exact_request(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """Before anything was sent the answer is `send`, with the request the approval allows;
    sending exactly that completes the operation."""
    op = await fault_gate.approve()
    status, view = await read(fault_gate, f"/_opgate/v1/operations/{op['operation_id']}")
    assert (status, view["next_action"]) == (200, "send")
    request = view["request"]
    assert request["path"] == "/fault/v1/refunds"
    assert request["form"] == {"amount": "500", "currency": "usd", "charge": "ch_1"}
    assert request["headers"]["Idempotency-Key"] == op["idempotency_key"]
    body = "&".join(f"{k}={v}" for k, v in request["form"].items())
    status, _, _ = await fault_gate.send(request["path"], data=body, headers=request["headers"])
    assert status == 200
    status, view = await read(fault_gate, f"/_opgate/v1/operations/{op['operation_id']}")
    assert view["next_action"] == "proceed"
    assert view["operation"]["provider_response"]["object_id"] == fault_provider.effects[0].id
    assert "request" not in view


async def test_other_tenants_and_other_agents_see_nothing(fault_gate: Opgate) -> None:
    """Another tenant's agent, or another agent for an agent-bound operation, gets the same
    404 as for an id that does not exist; no token is 401."""
    shared, bound = await fault_gate.approve(), await fault_gate.approve(agent_id="agent-a")
    for path, token in (
        (f"/_opgate/v1/operations/{shared['operation_id']}", OTHER_TENANT_TOKEN),
        (f"/_opgate/v1/operations/{bound['operation_id']}", SECOND_AGENT_TOKEN),
        ("/_opgate/v1/operations/op_does_not_exist", None),
    ):
        status, problem = await read(fault_gate, path, token)
        assert (status, problem["code"]) == (404, "operation_unknown")
    status, _, body = await fault_gate.send(
        f"/_opgate/v1/operations/{shared['operation_id']}",
        method="GET",
        data=None,
        content_type=None,
        token=None,
    )
    assert (status, json.loads(body)["code"]) == (401, "agent_unauthenticated")


async def test_list_shows_the_agents_unsettled_operations(fault_gate: Opgate) -> None:
    """An agent lists its tenant's unsettled operations (not other tenants', not settled)."""
    mine = await fault_gate.approve()
    await fault_gate.approve(tenant="t2")
    status, listing = await read(fault_gate, "/_opgate/v1/operations")
    assert status == 200
    ids = [item["operation"]["operation_id"] for item in listing["operations"]]
    assert ids == [mine["operation_id"]]
    status, others = await read(fault_gate, "/_opgate/v1/operations", OTHER_TENANT_TOKEN)
    assert [i["operation"]["tenant"] for i in others["operations"]] == ["t2"]


@pytest.mark.parametrize(
    "raw_id",
    [
        pytest.param("op%00x", id="percent-encoded NUL"),
        pytest.param("op%C3%28", id="percent-encoded invalid UTF-8"),
        pytest.param("op%E2%84%AA", id="percent-encoded non-ASCII"),
        pytest.param("op%20x", id="space"),
        pytest.param("o" * 256, id="256 characters"),
    ],
)
async def test_an_invalid_operation_id_in_the_path_is_refused(
    fault_gate: Opgate, raw_id: str
) -> None:
    """An id that is not 1-255 printable ASCII once strictly decoded is 400
    operation_id_invalid with its audit record (a NUL used to reach the query: 500)."""
    url = URL(f"{fault_gate.agent_url}/_opgate/v1/operations/{raw_id}", encoded=True)
    with capture_logs() as logs:
        async with fault_gate.http.get(url, headers=agent_headers()) as response:
            status, content_type = response.status, response.headers["Content-Type"]
            payload = await response.json(content_type=None)
    assert (status, content_type) == (400, "application/problem+json")
    assert payload["code"] == "operation_id_invalid"
    [record] = [entry for entry in logs if entry["event"] == "request"]
    assert (record["decision"], record["reason"]) == ("deny", "operation_id_invalid")


async def test_every_recovery_read_leaves_an_audit_record(fault_gate: Opgate) -> None:
    """A recovery read is an agent request like any other: one record each, naming the agent,
    the operation and what it was told (a read of another tenant's operation says so)."""
    op = await fault_gate.approve()
    with capture_logs() as logs:
        mine, _ = await read(fault_gate, f"/_opgate/v1/operations/{op['operation_id']}")
        listed, _ = await read(fault_gate, "/_opgate/v1/operations")
        theirs, _ = await read(
            fault_gate, f"/_opgate/v1/operations/{op['operation_id']}", OTHER_TENANT_TOKEN
        )
        anonymous, _ = await read(fault_gate, "/_opgate/v1/operations", token="")
    assert (mine, listed, theirs, anonymous) == (200, 200, 404, 401)
    records = [entry for entry in logs if entry["event"] == "request"]
    assert [(r["decision"], r["reason"], r["response_status"]) for r in records] == [
        ("allow", None, 200),
        ("allow", None, 200),
        ("deny", "operation_scope_mismatch", 404),
        ("deny", "agent_unauthenticated", 401),
    ]
    assert records[0]["operation_id"] == op["operation_id"]
    assert records[0]["rule"] == "recovery"
    assert records[2]["tenant"] == "t2"


async def test_recovery_reads_count_against_the_agents_cap(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """A recovery read may call the provider (reconciliation): it takes a slot of the agent's
    requests in flight like any other request, so an agent at its cap is told 429."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, max_requests_in_flight_per_agent=1
    ) as gate:
        op = await gate.approve()
        fault_provider.mode = FaultMode.STALL
        stalled = asyncio.create_task(
            gate.send("/fault/v1/refunds", data="amount=500&currency=usd&charge=ch_1",
                      headers={"X-Operation-Id": op["operation_id"]})
        )  # fmt: skip
        await fault_provider.in_flight.wait()
        status, body = await read(gate, f"/_opgate/v1/operations/{op['operation_id']}")
        fault_provider.release()
        await stalled
    assert (status, body["code"]) == (429, "agent_concurrency_exceeded")
