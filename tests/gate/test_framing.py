"""Requests aiohttp's HTTP parser refuses before any handler runs (two Content-Length headers,
Transfer-Encoding with Content-Length, a request line that is not HTTP, a control byte in a
header): every listener answers them as problem+json ``request_malformed``, and on the agent and
forward listeners each leaves its audit record (proxy/gate/framing.py). Raw sockets, since no
client library sends these bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from structlog.testing import capture_logs

from tests.support.opgate import ADMIN_TOKEN, AGENT_TOKEN, Opgate, StartOpgate, fault_policy
from tests.support.raw_http import RawResponse, exchange, request_bytes

HEAD = (
    "POST /fault/v1/refunds HTTP/1.1\r\nHost: opgate.test\r\n"
    f"Authorization: Bearer {AGENT_TOKEN}\r\n"
)
MALFORMED = [
    pytest.param(
        HEAD + "Content-Length: 1\r\nContent-Length: 2\r\n\r\nab", id="two Content-Length headers"
    ),
    pytest.param(
        HEAD + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        id="Transfer-Encoding with Content-Length",
    ),
    pytest.param("GARBAGE\r\n\r\n", id="request line that is not HTTP"),
    pytest.param(
        HEAD + "X-Operation-Id: op\x00x\r\nContent-Length: 0\r\n\r\n", id="NUL in a header"
    ),
    pytest.param(HEAD + "X-Note: \x1b[31m\r\nContent-Length: 0\r\n\r\n", id="control byte"),
    pytest.param(
        "GET /_opgate/v1/operations/op\xc3( HTTP/1.1\r\nHost: x\r\n\r\n", id="raw byte in the path"
    ),
]


def assert_malformed(response: RawResponse) -> dict[str, Any]:
    assert response.status == 400, response.body
    assert response.headers["Content-Type"] == "application/problem+json"
    payload = response.problem()
    assert (payload["status"], payload["code"]) == (400, "request_malformed")
    assert payload["detail"]
    return payload


async def stored_record(gate: Opgate, database_url: str, request_id: str) -> dict[str, Any]:
    observability = gate.running.gateway.observability
    assert observability is not None
    assert observability.writer is not None
    await observability.writer.flush()
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT record::text FROM audit_log WHERE kind = 'request'"
            " AND record ->> 'request_id' = $1",
            request_id,
        )
    finally:
        await conn.close()
    [row] = rows
    record: dict[str, Any] = json.loads(row[0])
    return record


@pytest.mark.parametrize("request_text", MALFORMED)
async def test_the_agent_listener_answers_framing_errors_as_problems_on_record(
    fault_gate: Opgate, database_url: str, request_text: str
) -> None:
    """aiohttp's own text/plain 400 becomes problem+json request_malformed, and the refusal is
    on record (log line and audit table) like any other: decision deny, reason
    request_malformed."""
    with capture_logs() as logs:
        response = await exchange(fault_gate.agent_url, request_text.encode("latin-1"))
    assert_malformed(response)
    [record] = [entry for entry in logs if entry["event"] == "request"]
    assert (record["listener"], record["decision"], record["reason"]) == (
        "agent",
        "deny",
        "request_malformed",
    )
    assert record["response_status"] == 400
    stored = await stored_record(fault_gate, database_url, record["request_id"])
    assert (stored["decision"], stored["reason"]) == ("deny", "request_malformed")


async def test_the_problem_does_not_echo_the_offending_line(fault_gate: Opgate) -> None:
    """aiohttp's message quotes the refused header line; the detail keeps only its first line,
    so a credential on that line is not echoed into a problem body."""
    request = HEAD + "X-Note: \x01 opg_secret_echo\r\nContent-Length: 0\r\n\r\n"
    payload = assert_malformed(await exchange(fault_gate.agent_url, request.encode("latin-1")))
    assert "opg_secret_echo" not in json.dumps(payload)


@pytest.mark.parametrize("request_text", MALFORMED[:3])
async def test_the_operations_listener_answers_framing_errors_as_problems(
    fault_gate: Opgate, request_text: str
) -> None:
    """The operations API's listener answers the same way (its own calls are not agent
    requests, so no agent audit record)."""
    with capture_logs() as logs:
        response = await exchange(fault_gate.ops_url, request_text.encode("latin-1"))
    assert_malformed(response)
    assert [entry for entry in logs if entry["event"] == "request"] == []


async def test_the_forward_listener_answers_framing_errors_as_problems_on_record(
    start_opgate: StartOpgate, policy_dir: Path, tmp_path: Path
) -> None:
    """The forward-proxy listener too, with a record of listener "forward"."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(forward_listen="127.0.0.1:0", ca_dir=tmp_path / "ca") as gate:
        assert gate.running.forward_url is not None
        request = "POST http://x/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
        with capture_logs() as logs:
            response = await exchange(gate.running.forward_url, request.encode())
    assert_malformed(response)
    [record] = [entry for entry in logs if entry["event"] == "request"]
    assert (record["listener"], record["reason"]) == ("forward", "request_malformed")


async def test_a_well_formed_request_after_a_malformed_one_is_served(fault_gate: Opgate) -> None:
    """The shaping changes only the refusal: the listener keeps serving other connections."""
    assert_malformed(await exchange(fault_gate.agent_url, b"GARBAGE\r\n\r\n"))
    status, _, _ = await fault_gate.send(
        "/fault/v1/refunds?limit=1", method="GET", data=None, content_type=None
    )
    assert status == 200


SECRET = "sk_live_secretvalue_ZZZ"
# Each makes aiohttp's parser quote request bytes in its message (a line over its limit, a
# header it cannot read, a target that is not a URL): none may reach the detail.
ECHOING = [
    pytest.param(
        HEAD.replace(AGENT_TOKEN, SECRET + "Z" * 9000) + "Content-Length: 0\r\n\r\n",
        id="header line over the limit",
    ),
    pytest.param(
        f"GET /fault/v1/refunds?key={SECRET}{'Z' * 9000} HTTP/1.1\r\nHost: x\r\n\r\n",
        id="request line over the limit",
    ),
    pytest.param(
        f"GET /x HTTP/1.1\r\nHost: x\r\nX-{SECRET}{'Z' * 9000}: 1\r\n\r\n",
        id="header name over the limit",
    ),
    pytest.param(f"GET {SECRET} HTTP/1.1\r\nHost: x\r\n\r\n", id="target not a URL"),
    pytest.param(f"GET http://[{SECRET}/ HTTP/1.1\r\nHost: x\r\n\r\n", id="bad absolute URL"),
    pytest.param(f"G{SECRET}\x01T / HTTP/1.1\r\nHost: x\r\n\r\n", id="bad method"),
]


@pytest.mark.parametrize("request_text", ECHOING)
@pytest.mark.parametrize("listener", ["agent", "ops"])
async def test_no_request_byte_is_echoed_in_a_framing_problem(
    fault_gate: Opgate, listener: str, request_text: str
) -> None:
    """Whatever the parser refused, the detail names what is wrong and quotes none of the
    request (an agent's credential would be echoed back, and into logs)."""
    url = fault_gate.agent_url if listener == "agent" else fault_gate.ops_url
    response = await exchange(url, request_text.encode("latin-1"))
    assert response.status == 400, response.body
    assert response.headers["Content-Type"] == "application/problem+json"
    payload = response.problem()
    assert payload["code"] == "request_malformed"
    assert SECRET not in response.body.decode("latin-1"), payload["detail"]
    assert "b'" not in payload["detail"], payload["detail"]


async def test_a_body_over_the_operations_apis_limit_is_a_problem(fault_gate: Opgate) -> None:
    """A 2 MB body to the operations API: 413 problem+json body_too_large, not aiohttp's
    text/plain."""
    body = b'{"pad": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    request = request_bytes(
        "POST",
        "/v1/operations",
        [("Authorization", f"Bearer {ADMIN_TOKEN}"), ("Content-Type", "application/json")],
        body,
    )
    response = await exchange(fault_gate.ops_url, request)
    assert response.status == 413, response.body[:200]
    assert response.headers["Content-Type"] == "application/problem+json"
    payload = response.problem()
    assert (payload["status"], payload["code"]) == (413, "body_too_large")
