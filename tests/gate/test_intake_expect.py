"""``Expect: 100-continue`` on the agent listener: the body is invited only when the headers
alone pass; a request refused on its headers gets its rejection instead of a 100, before any
body was sent."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from structlog.testing import capture_logs

from tests.support.audit_logs import audits
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import AGENT_TOKEN, Opgate
from tests.support.raw_http import exchange, request_bytes

BODY = b"amount=500&currency=usd&charge=ch_1"


async def head_then_first_line(
    gate: Opgate, headers: dict[str, str], length: int
) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter]:
    """Send only the request head; return the first status line the server answers with."""
    address = urlsplit(gate.agent_url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    lines = [
        "POST /fault/v1/refunds HTTP/1.1",
        f"Host: {address.netloc}",
        "Content-Type: application/x-www-form-urlencoded",
        f"Content-Length: {length}",
        "Expect: 100-continue",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await writer.drain()
    status = (await asyncio.wait_for(reader.readline(), 10)).decode().strip()
    return status, reader, writer


async def test_an_approved_request_is_invited_and_completes(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """Headers that pass: 100 Continue, then the body, then the provider's answer."""
    op = await fault_gate.approve()
    status, reader, writer = await head_then_first_line(
        fault_gate,
        {"Authorization": f"Bearer {AGENT_TOKEN}", "X-Operation-Id": op["operation_id"]},
        len(BODY),
    )
    try:
        assert status == "HTTP/1.1 100 Continue"
        await reader.readline()  # the blank line that ends the interim answer
        writer.write(BODY)
        await writer.drain()
        final = (await asyncio.wait_for(reader.readline(), 10)).decode().strip()
    finally:
        writer.close()
    assert final == "HTTP/1.1 200 OK"
    assert len(fault_provider.effects) == 1
    assert "Expect" not in fault_provider.requests[0].headers


async def test_a_request_refused_on_its_headers_gets_no_invitation(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """A wrong token, or a declared length over the policy's limit: the rejection comes
    instead of 100 Continue, and nothing reaches the provider."""
    op = await fault_gate.approve()
    for headers, length, expected in (
        ({"Authorization": "Bearer opg_wrong"}, len(BODY), "HTTP/1.1 401 Unauthorized"),
        (
            {"Authorization": f"Bearer {AGENT_TOKEN}", "X-Operation-Id": op["operation_id"]},
            10_000_000,
            "HTTP/1.1 413 Request Entity Too Large",
        ),
    ):
        status, _, writer = await head_then_first_line(fault_gate, headers, length)
        writer.close()
        assert status == expected
    assert fault_provider.requests == []


async def test_an_unknown_expectation_is_refused_as_a_problem_and_audited(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """``Expect`` other than 100-continue: 417 problem+json ``expectation_unsupported`` from
    the pipeline, with its audit record, and nothing reaches the provider."""
    op = await fault_gate.approve()
    headers = [
        ("Authorization", f"Bearer {AGENT_TOKEN}"),
        ("X-Operation-Id", op["operation_id"]),
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Expect", "something-else"),
    ]
    with capture_logs() as logs:
        answer = await exchange(
            fault_gate.agent_url, request_bytes("POST", "/fault/v1/refunds", headers, BODY)
        )
    assert (answer.status, answer.headers.get("Content-Type")) == (
        417,
        "application/problem+json",
    )
    assert answer.problem()["code"] == "expectation_unsupported"
    [record] = audits(logs)
    assert (record["reason"], record["response_status"]) == ("expectation_unsupported", 417)
    assert fault_provider.requests == []
