"""Bad input on the agent listener gets a 4xx problem+json with a stable code and one audit record
naming it, never a 500 and never a guess: header bytes that are not printable ASCII, JSON that is
too deep or holds numbers the serialiser would rewrite, currencies that only match under Unicode
case mapping, and form keys a provider's bracket parser could read as the injected field. Run
against a real opgate, a real fault provider and real clients (raw sockets where aiohttp's client
will not send the bytes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.support.fault_provider import FaultProvider
from tests.support.opgate import AGENT_TOKEN, Opgate, StartOpgate, fault_policy, problem
from tests.support.pipeline import GOOD_BODY, REFUND, op_header
from tests.support.raw_http import RawResponse, exchange, request_bytes

FORM = "application/x-www-form-urlencoded"


def only_request_record(logs: list[dict[str, Any]]) -> dict[str, Any]:
    [record] = [entry for entry in logs if entry["event"] == "request"]
    return record


async def send_raw(
    gate: Opgate, headers: list[tuple[str, bytes | str]], body: bytes = GOOD_BODY.encode()
) -> tuple[RawResponse, dict[str, Any]]:
    """One refund request with ``headers`` (raw bytes allowed) and the audit record it left."""
    request = request_bytes(
        "POST",
        REFUND,
        [("Authorization", f"Bearer {AGENT_TOKEN}"), ("Content-Type", FORM), *headers],
        body,
    )
    with capture_logs() as logs:
        response = await exchange(gate.agent_url, request)
    return response, only_request_record(logs)


def assert_refused(
    response: RawResponse, record: dict[str, Any], status: int, code: str
) -> dict[str, Any]:
    assert response.status == status, response.body
    assert response.headers["Content-Type"] == "application/problem+json"
    payload = response.problem()
    assert (payload["status"], payload["code"]) == (status, code)
    assert (record["decision"], record["reason"], record["response_status"]) == (
        "deny",
        code,
        status,
    )
    return payload


# --- 1. header bytes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(b"op\xc3(x", id="invalid UTF-8"),
        pytest.param(b"op\xe9", id="latin-1 byte"),
        pytest.param("op_\u00e9".encode(), id="valid UTF-8, not ASCII"),
        pytest.param(b"x" * 256, id="256 characters"),
    ],
)
async def test_an_unreadable_operation_id_header_is_refused(
    fault_gate: Opgate, fault_provider: FaultProvider, value: bytes
) -> None:
    """An X-Operation-Id that is not 1-255 printable ASCII is 400 operation_id_invalid, with
    its audit record, before any lookup (it used to reach the query and answer 500)."""
    response, record = await send_raw(fault_gate, [("X-Operation-Id", value)])
    assert_refused(response, record, 400, "operation_id_invalid")
    assert fault_provider.requests == []


async def test_an_unreadable_idempotency_key_is_refused(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """An idempotency key with an undecodable byte is 400 header_invalid (it used to reach
    the key lookup and answer 500)."""
    response, record = await send_raw(fault_gate, [("Idempotency-Key", b"k\xc3(")])
    assert_refused(response, record, 400, "header_invalid")
    assert fault_provider.requests == []


@pytest.mark.parametrize(
    ("name", "value"),
    [
        pytest.param("User-Agent", b"agent/\xff", id="forwarded header, undecodable byte"),
        pytest.param("Accept-Language", "fr-\u00e9".encode(), id="forwarded header, non-ASCII"),
        pytest.param("Proxy-Authorization", b"Bearer opg_\xff", id="credential header"),
        pytest.param("X-Note", b"\x80", id="ignored header, obs-text byte"),
    ],
)
async def test_an_unreadable_header_value_is_refused(
    fault_gate: Opgate, fault_provider: FaultProvider, name: str, value: bytes
) -> None:
    """Any header value that is not printable ASCII is 400 header_invalid and nothing is
    claimed or sent (an undecodable forwarded header used to fail after the claim)."""
    op = await fault_gate.approve()
    response, record = await send_raw(
        fault_gate, [("X-Operation-Id", op["operation_id"]), (name, value)]
    )
    payload = assert_refused(response, record, 400, "header_invalid")
    assert name in payload["detail"]
    assert fault_provider.requests == []
    assert (await fault_gate.operation(op["operation_id"]))["status"] == "created"


# --- 2, 3. JSON depth and numbers ------------------------------------------------------------


@pytest.fixture
async def json_gate(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> Any:
    """opgate in front of the fault provider with a JSON refund rule (free: /reason,
    /metadata/*)."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False, body="json"))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        yield gate


JSON_REFUND = '{"amount": 500, "currency": "usd", "charge": "ch_1", "reason": %s}'


@pytest.mark.parametrize(
    "reason",
    [
        pytest.param("[" * 29_999 + "]" * 29_999, id="30,000 levels"),
        pytest.param("[" * 64 + "]" * 64, id="65 levels"),
        pytest.param("1e400", id="overflows to Infinity"),
        pytest.param("1.00000000000000000001", id="rounds to 1.0"),
        pytest.param("1" * 5000, id="5,000-digit integer"),
    ],
)
async def test_json_bodies_that_cannot_leave_as_checked_are_refused(
    json_gate: Opgate, fault_provider: FaultProvider, reason: str
) -> None:
    """Too deep (it raised RecursionError: 500), or a number the serialiser would rewrite (1e400
    left as the bare word Infinity): 400 body_invalid with its record, nothing sent."""
    op = await json_gate.approve(params={"/charge": "ch_1"})
    with capture_logs() as logs:
        status, headers, body = await json_gate.send(
            REFUND,
            data=JSON_REFUND % reason,
            headers=op_header(op),
            content_type="application/json",
        )
    assert status == 400, body
    assert headers["Content-Type"] == "application/problem+json"
    assert problem(body)["code"] == "body_invalid"
    record = only_request_record(logs)
    assert (record["decision"], record["reason"]) == ("deny", "body_invalid")
    assert fault_provider.requests == []


async def test_json_numbers_kept_exactly_leave_as_written(
    json_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """A float the serialiser writes back with the same value (0.1, 1.5e3) is forwarded."""
    op = await json_gate.approve(params={"/charge": "ch_1"})
    status, _, body = await json_gate.send(
        REFUND,
        data='{"amount": 500, "currency": "usd", "charge": "ch_1", "reason": 0.1, '
        '"metadata": {"scaled": 1.5e3}}',
        headers=op_header(op),
        content_type="application/json",
    )
    assert status == 200, body
    [received] = fault_provider.requests
    forwarded = json.loads(received.body)
    assert (forwarded["reason"], forwarded["metadata"]["scaled"]) == (0.1, 1500.0)


# --- 4. currency -----------------------------------------------------------------------------


async def test_a_currency_equal_only_under_unicode_case_mapping_is_a_mismatch(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """The Kelvin sign lowers to k, so it used to match an approved "kes" and leave as sent;
    it is a currency_mismatch."""
    op = await fault_gate.approve(currency="kes")
    with capture_logs() as logs:
        status, headers, body = await fault_gate.send(
            REFUND, data="amount=500&currency=%E2%84%AAes&charge=ch_1", headers=op_header(op)
        )
    assert (status, headers["Content-Type"]) == (422, "application/problem+json")
    assert problem(body)["code"] == "currency_mismatch"
    assert only_request_record(logs)["reason"] == "currency_mismatch"
    assert fault_provider.requests == []


async def test_the_approved_currency_spelling_is_what_leaves(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """An agent's "USD" for an approved "usd" passes, and the provider receives "usd"."""
    op = await fault_gate.approve()
    status, _, body = await fault_gate.send(
        REFUND, data="amount=500&currency=USD&charge=ch_1", headers=op_header(op)
    )
    assert status == 200, body
    [received] = fault_provider.requests
    assert received.body.startswith(b"amount=500&currency=usd&charge=ch_1&")


# --- 6. keys a bracket parser reads as the injected field ------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "metadata%5Boperation_id%5D%5B%5D",  # metadata[operation_id][]
        "metadata%5Boperation_id%5D%5Bx%5D",  # metadata[operation_id][x]
        "metadata%5Boperation_id%5D%5D",  # metadata[operation_id]]
        "metadata%5Boperation_id%5Dx",  # metadata[operation_id]x (PHP stops at the ']')
    ],
)
async def test_keys_read_as_the_injected_field_are_refused(
    fault_gate: Opgate, fault_provider: FaultProvider, key: str
) -> None:
    """A key matching the free metadata[*] pattern that Rack, qs or PHP may read as
    metadata[operation_id] used to pass as a free field; it is 422 injection_conflict."""
    op = await fault_gate.approve()
    with capture_logs() as logs:
        status, headers, body = await fault_gate.send(
            REFUND, data=f"{GOOD_BODY}&{key}=op_evil", headers=op_header(op)
        )
    assert (status, headers["Content-Type"]) == (422, "application/problem+json")
    assert problem(body)["code"] == "injection_conflict"
    assert only_request_record(logs)["reason"] == "injection_conflict"
    assert fault_provider.requests == []
