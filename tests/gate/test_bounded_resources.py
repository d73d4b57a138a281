"""What one agent can hold: a body that trickles in is cut off at a total deadline (408), and
an agent's requests in flight are capped (429) while other agents and tenants get through.
Real opgate, real sockets, the fault provider as ground truth."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from structlog.testing import capture_logs
from yarl import URL

from proxy.gate.checks import Agent
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.opgate import (
    ADMIN_TOKEN,
    AGENT_TOKEN,
    OTHER_TENANT_TOKEN,
    REFUND_APPROVAL,
    SECOND_AGENT_TOKEN,
    Opgate,
    StartOpgate,
    fault_policy,
    problem,
)
from tests.support.polling import until

REFUND = "/fault/v1/refunds"
GOOD_BODY = "amount=500&currency=usd&charge=ch_1"
BODY_DEADLINE = 1.5
BYTE_INTERVAL = 0.5  # one byte per half second: every single read is quick, the whole is not
AGENT_A = Agent(agent_id="agent-a", tenant="t1")


@dataclass
class Trickled:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes
    seconds: float  # from the first header byte to the whole answer
    bytes_sent: int  # of the body, when the answer arrived


async def trickle(url: str, head: str, body: bytes, *, answer_within: float = 5.0) -> Trickled:
    """Send ``head`` at once, then ``body`` one byte per BYTE_INTERVAL, reading the answer
    concurrently; fails if no whole answer arrives within ``answer_within`` seconds."""
    parsed = URL(url)
    assert parsed.host is not None
    assert parsed.port is not None
    reader, writer = await asyncio.open_connection(parsed.host, parsed.port)
    sent = 0

    async def send_slowly() -> None:
        nonlocal sent
        for index in range(len(body)):
            writer.write(body[index : index + 1])
            await writer.drain()
            sent += 1
            await asyncio.sleep(BYTE_INTERVAL)  # the pace of the slow client under test

    started = time.monotonic()
    writer.write(head.encode("latin-1"))
    sender = asyncio.create_task(send_slowly())
    try:
        async with asyncio.timeout(answer_within):
            status_line = await reader.readuntil(b"\r\n")
            headers: dict[str, str] = {}
            while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            answer = await reader.readexactly(int(headers.get("content-length", "0")))
        seconds, bytes_sent = time.monotonic() - started, sent
    finally:
        sender.cancel()
        writer.close()
    return Trickled(int(status_line.split()[1]), headers, answer, seconds, bytes_sent)


def agent_head(
    url: str,
    target: str,
    headers: dict[str, str],
    length: int,
    content_type: str = "application/x-www-form-urlencoded",
) -> str:
    """A POST's head as bytes on the wire: ``Host`` names ``url``, the body is ``length`` long."""
    lines = [f"POST {target} HTTP/1.1", f"Host: {URL(url).host}:{URL(url).port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += [f"Content-Type: {content_type}", f"Content-Length: {length}"]
    return "\r\n".join(lines) + "\r\n\r\n"


def audit_records(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry.get("event") == "request" and "decision" in entry]


def assert_body_timeout(answer: Trickled, total: int) -> None:
    """408 body_timeout, answered at the deadline (not after the whole body), connection closed."""
    assert answer.status == 408, answer
    assert answer.headers["content-type"] == "application/problem+json"
    assert problem(answer.body)["code"] == "body_timeout"
    assert BODY_DEADLINE <= answer.seconds < BODY_DEADLINE + 2.0
    assert answer.bytes_sent < total
    assert answer.headers.get("connection", "").lower() == "close"


async def test_a_body_trickled_past_the_total_deadline_is_408_and_nothing_leaves(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """One byte every half second never trips a per-read timeout; the total deadline answers
    408 body_timeout, audited, with nothing sent and the operation row untouched."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, body_read_timeout_seconds=BODY_DEADLINE
    ) as gate:
        op = await gate.approve()
        headers = {"Authorization": f"Bearer {AGENT_TOKEN}", "X-Operation-Id": op["operation_id"]}
        body = GOOD_BODY.encode()
        with capture_logs() as logs:
            answer = await trickle(
                gate.agent_url, agent_head(gate.agent_url, REFUND, headers, len(body)), body
            )
        row = await gate.operation(op["operation_id"])
    assert_body_timeout(answer, len(body))
    assert fault_provider.requests == []
    assert (row["status"], row["attempts"], len(row["events"])) == ("created", 0, 1)
    [audit] = audit_records(logs)
    assert (audit["decision"], audit["reason"], audit["response_status"]) == (
        "deny",
        "body_timeout",
        408,
    )
    assert audit["agent_id"] == "agent-a"


async def test_the_forward_listener_bounds_the_body_read_the_same_way(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, tmp_path: Path
) -> None:
    """An absolute-form request through the forward listener whose body trickles in gets the
    same 408 at the same deadline, and the provider sees nothing."""
    loopback = "forward_proxy:\n  allow_destinations: [loopback]\n"
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False) + loopback)
    async with start_opgate(
        forward_listen="127.0.0.1:0",
        ca_dir=tmp_path / "ca",
        upstream_overrides={"fault": fault_provider.url},
        body_read_timeout_seconds=BODY_DEADLINE,
    ) as gate:
        assert gate.running.forward_url is not None
        op = await gate.approve()
        basic = base64.b64encode(f"agent:{AGENT_TOKEN}".encode()).decode()
        headers = {"Proxy-Authorization": f"Basic {basic}", "X-Operation-Id": op["operation_id"]}
        body = GOOD_BODY.encode()
        target = f"{fault_provider.url}/v1/refunds"
        head = agent_head(fault_provider.url, target, headers, len(body))
        with capture_logs() as logs:
            answer = await trickle(gate.running.forward_url, head, body)
        row = await gate.operation(op["operation_id"])
    assert_body_timeout(answer, len(body))
    assert fault_provider.requests == []
    assert row["status"] == "created"
    assert [(r["listener"], r["reason"]) for r in audit_records(logs)] == [
        ("forward", "body_timeout")
    ]


async def test_the_operations_api_bounds_the_body_read_the_same_way(
    start_opgate: StartOpgate, policy_dir: Path, http: aiohttp.ClientSession
) -> None:
    """An approval whose JSON body trickles in is answered 408 body_timeout at the deadline
    and creates nothing."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(body_read_timeout_seconds=BODY_DEADLINE) as gate:
        body = json.dumps(REFUND_APPROVAL).encode()
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        head = agent_head(gate.ops_url, "/v1/operations", headers, len(body), "application/json")
        answer = await trickle(gate.ops_url, head, body)
        async with http.get(f"{gate.ops_url}/v1/operations?status=all", headers=headers) as listing:
            listed = await listing.json()
    assert_body_timeout(answer, len(body))
    assert listed["operations"] == []


def in_flight(gate: Opgate, agent: Agent) -> int:
    return gate.running.gateway.in_flight.count(agent)


async def test_one_request_over_the_agents_cap_is_429_while_others_get_through(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """With a cap of 2 and a stalled provider, three concurrent requests of one agent (three
    operations) get exactly one 429 agent_concurrency_exceeded with Retry-After, sent
    nowhere, while another agent of the tenant and another tenant are still forwarded."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False, total_timeout=30))
    fault_provider.script(FaultMode.STALL_AFTER_COMMIT, FaultMode.STALL_AFTER_COMMIT)
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, max_requests_in_flight_per_agent=2
    ) as gate:
        ops = [await gate.approve() for _ in range(3)]
        with capture_logs() as logs:
            tasks = [
                asyncio.create_task(
                    gate.send(REFUND, data=GOOD_BODY, headers={"X-Operation-Id": o["operation_id"]})
                )
                for o in ops
            ]
            done, pending = await asyncio.wait(tasks, timeout=5, return_when="FIRST_COMPLETED")
            try:
                assert len(done) == 1, "no request of the three was refused"
                await until(lambda: fault_provider.stalled == 2, "two requests at the provider")
                [(status, headers, body)] = [t.result() for t in done]
                others = [
                    await gate.send(
                        REFUND,
                        data=GOOD_BODY,
                        headers={"X-Operation-Id": (await gate.approve(**extra))["operation_id"]},
                        token=token,
                    )
                    for token, extra in (
                        (SECOND_AGENT_TOKEN, {}),
                        (OTHER_TENANT_TOKEN, {"tenant": "t2"}),
                    )
                ]
            finally:
                fault_provider.release()
                stalled = await asyncio.gather(*pending)
        refused_op = next(o for o, t in zip(ops, tasks, strict=True) if t in done)
        refused_row = await gate.operation(refused_op["operation_id"])
    assert status == 429, body
    assert problem(body)["code"] == "agent_concurrency_exceeded"
    assert int(headers["Retry-After"]) >= 1
    assert [s for s, _, _ in others] == [200, 200]
    assert sorted(s for s, _, _ in stalled) == [200, 200]
    assert len(fault_provider.requests) == 4
    assert refused_op["operation_id"] not in {e.operation_id for e in fault_provider.effects}
    assert (refused_row["status"], refused_row["attempts"]) == ("created", 0)
    refusals = [r for r in audit_records(logs) if r["reason"] == "agent_concurrency_exceeded"]
    assert [(r["agent_id"], r["response_status"]) for r in refusals] == [("agent-a", 429)]


async def test_a_forwarded_request_holds_its_slot_until_its_outcome_is_recorded(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """An agent that hangs up on a forwarded request still holds its one slot (its next
    request is 429) until the provider answers and the row is settled; then it is free."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False, total_timeout=30))
    fault_provider.mode = FaultMode.STALL_AFTER_COMMIT
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, max_requests_in_flight_per_agent=1
    ) as gate:
        first, second = await gate.approve(), await gate.approve()
        hung_up = asyncio.create_task(
            gate.send(REFUND, data=GOOD_BODY, headers={"X-Operation-Id": first["operation_id"]})
        )
        await fault_provider.in_flight.wait()
        hung_up.cancel()  # the agent goes away; the request has already left
        await asyncio.gather(hung_up, return_exceptions=True)
        status, _, body = await gate.send(
            REFUND, data=GOOD_BODY, headers={"X-Operation-Id": second["operation_id"]}
        )
        assert (status, problem(body)["code"]) == (429, "agent_concurrency_exceeded")
        fault_provider.mode = FaultMode.OK
        fault_provider.release()
        await until(lambda: in_flight(gate, AGENT_A) == 0, "the slot released")
        settled = await gate.operation(first["operation_id"])
        status, _, _ = await gate.send(
            REFUND, data=GOOD_BODY, headers={"X-Operation-Id": second["operation_id"]}
        )
    assert settled["status"] == "confirmed"
    assert status == 200
    assert len(fault_provider.effects) == 2


async def test_an_agent_hanging_up_mid_body_frees_its_slot(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """A request abandoned half-way through its body releases its slot: the agent's next
    request is forwarded, not refused."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, max_requests_in_flight_per_agent=1
    ) as gate:
        op = await gate.approve()
        headers = {"Authorization": f"Bearer {AGENT_TOKEN}", "X-Operation-Id": op["operation_id"]}
        url = URL(gate.agent_url)
        assert url.host is not None
        assert url.port is not None
        _, writer = await asyncio.open_connection(url.host, url.port)
        writer.write(agent_head(gate.agent_url, REFUND, headers, len(GOOD_BODY)).encode())
        writer.write(GOOD_BODY[:5].encode())
        await writer.drain()
        await until(lambda: in_flight(gate, AGENT_A) == 1, "the request holds a slot")
        writer.close()
        await writer.wait_closed()
        await until(lambda: in_flight(gate, AGENT_A) == 0, "the slot released")
        status, _, _ = await gate.send(
            REFUND, data=GOOD_BODY, headers={"X-Operation-Id": op["operation_id"]}
        )
    assert status == 200
    assert len(fault_provider.requests) == 1
