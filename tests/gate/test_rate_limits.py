"""Rate limits through the real pipeline: a burst above a provider's limit is refused 429
rate_limited with Retry-After, audited, and nothing beyond the limit reaches the provider."""

from __future__ import annotations

import asyncio
from pathlib import Path

from structlog.testing import capture_logs

from tests.support.fault_provider import FaultProvider
from tests.support.opgate import SECOND_AGENT_TOKEN, StartOpgate, fault_policy, problem

READ = "/fault/v1/refunds"


def limited(policy_dir: Path, rate_limits: str) -> None:
    text = fault_policy(deduplicates=False).replace("rules:\n", f"{rate_limits}\nrules:\n", 1)
    (policy_dir / "fault.yaml").write_text(text)


async def test_a_burst_above_the_agents_rate_is_refused_and_never_forwarded(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """Eight requests at once from an agent allowed a burst of 3 (and a token every 1000 s):
    three reach the provider, five are 429 rate_limited with Retry-After, each audited; an
    approved refund sent next is refused too, its operation never claimed."""
    limited(policy_dir, "rate_limits: {per_agent: {requests_per_second: 0.001, burst: 3}}")
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        with capture_logs() as logs:
            answers = await asyncio.gather(
                *(gate.send(READ, method="GET", content_type=None) for _ in range(8))
            )
            refund = await gate.send(
                READ,
                data="amount=500&currency=usd&charge=ch_1",
                headers={"X-Operation-Id": op["operation_id"]},
            )
            other_agent = await gate.send(
                READ, method="GET", content_type=None, token=SECOND_AGENT_TOKEN
            )
        row = await gate.operation(op["operation_id"])
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200] * 3 + [429] * 5
    refused = [(headers, body) for status, headers, body in answers if status == 429]
    assert {problem(body)["code"] for _, body in refused} == {"rate_limited"}
    assert all(int(headers["Retry-After"]) >= 999 for headers, _ in refused)
    assert (refund[0], problem(refund[2])["code"]) == (429, "rate_limited")
    assert other_agent[0] == 200  # its own bucket
    assert len(fault_provider.requests) == 4
    assert (row["status"], row["attempts"]) == ("created", 0)
    records = [entry for entry in logs if entry["event"] == "request"]
    assert [r["reason"] for r in records].count("rate_limited") == 6
    assert {r["response_status"] for r in records if r["reason"] == "rate_limited"} == {429}


async def test_a_tenant_in_flight_cap_holds_across_its_agents(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """With one request per tenant in flight (settings), a second agent of the tenant is
    refused 429 rate_limited while the first agent's read is stalled at the provider."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False, total_timeout=30))
    fault_provider.mode = "stall"
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, max_requests_in_flight_per_tenant=1
    ) as gate:
        stalled = asyncio.create_task(gate.send(READ, method="GET", content_type=None))
        await fault_provider.in_flight.wait()
        try:
            status, headers, body = await gate.send(
                READ, method="GET", content_type=None, token=SECOND_AGENT_TOKEN
            )
        finally:
            fault_provider.mode = "ok"
            fault_provider.release()
            await stalled
    assert (status, problem(body)["code"], headers["Retry-After"]) == (429, "rate_limited", "1")
    assert len(fault_provider.requests) == 1
