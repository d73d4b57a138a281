"""Tool calls that hit a hole: a pointer nested thousands deep, and any failure opgate did not
foresee, are refusals with a code and a deny/error record, never an allow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import proxy.mcp.calls
from tests.support.fault_provider import FaultProvider
from tests.support.mcp_client import http_client, refused_code, structured
from tests.support.opgate import AGENT_TOKEN, StartOpgate, fault_policy


async def test_a_free_field_pointer_nested_3000_deep_is_refused_body_invalid_on_record(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """A JSON pointer of 3,000 tokens is refused body_invalid like a body nested too deep:
    one deny record, nothing sent."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False, body="json"))
    pointer = "/metadata" + "/a" * 3000
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve(params={"/charge": "ch_1"})
        with capture_logs() as logs:
            async with http_client(gate.agent_url, AGENT_TOKEN) as client:
                result = await client.call_tool(
                    "execute_operation",
                    {"operation_id": op["operation_id"], "free_fields": {pointer: "x"}},
                )
    assert refused_code(result) == "body_invalid"
    calls = [e for e in logs if e["event"] == "request" and e.get("operation_id")]
    assert [(e["decision"], e["reason"]) for e in calls] == [("deny", "body_invalid")]
    assert not [e for e in logs if e["event"] == "request" and e["decision"] == "allow"][1:]
    assert fault_provider.effects == []


async def test_an_unforeseen_failure_in_a_tool_call_is_a_recorded_refusal_not_an_allow(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever a tool call raises, the agent gets a tool error with the code
    mcp_tool_failed, and the exchange's one record is that error (no allow record)."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug opgate did not foresee")

    monkeypatch.setattr(proxy.mcp.calls, "compose_request", broken)
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        with capture_logs() as logs:
            async with http_client(gate.agent_url, AGENT_TOKEN, mode="legacy") as client:
                result = await client.call_tool(
                    "execute_operation", {"operation_id": op["operation_id"]}
                )
    assert refused_code(result) == "mcp_tool_failed"
    assert "a bug" not in structured(result)["detail"]  # the exception stays in the log
    records = [e for e in logs if e["event"] == "request"]
    call = [e for e in records if e.get("operation_id") == op["operation_id"]]
    assert [(e["decision"], e["reason"]) for e in call] == [("error", "mcp_tool_failed")]
    assert fault_provider.effects == []
