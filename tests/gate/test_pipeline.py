"""The agent request pipeline against a real provider on loopback (the fault provider) and a
real PostgreSQL: what leaves, what is refused, and what the row says afterwards."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from structlog.testing import capture_logs
from yarl import URL

import proxy.observe.record_life
from proxy.observe.audit import AuditRecord, Sealed
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.opgate import (
    AGENT_TOKEN,
    PROVIDER_SECRET,
    Opgate,
    StartOpgate,
    fault_policy,
    problem,
)
from tests.support.pipeline import GOOD_BODY, REFUND, REJECTIONS, op_header


async def test_forwards_the_validated_body_with_injections(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """An approved request leaves once, canonical, with operation id, key and real credential."""
    op = await fault_gate.approve()
    status, headers, body = await fault_gate.send(
        REFUND,
        data="amount=500&currency=usd&charge=ch%5F1&reason=duplicate",
        headers={**op_header(op), "X-Agent-Note": "dropped", "Stripe-Account": "acct_other"},
    )
    assert status == 200, body
    assert headers["X-Operation-Id"] == op["operation_id"]
    assert headers["X-Operation-Status"] == "confirmed"
    [received] = fault_provider.requests
    assert received.body == (
        b"amount=500&currency=usd&charge=ch_1&reason=duplicate"
        b"&metadata%5Boperation_id%5D=" + op["operation_id"].encode()
    )
    assert received.headers["Authorization"] == f"Bearer {PROVIDER_SECRET}"
    assert received.headers["Idempotency-Key"] == op["idempotency_key"]
    assert received.headers["X-Operation-Id"] == op["operation_id"]
    assert "X-Agent-Note" not in received.headers
    assert "Stripe-Account" not in received.headers
    assert AGENT_TOKEN not in str(received.headers)
    row = await fault_gate.operation(op["operation_id"])
    assert row["status"] == "confirmed"
    assert row["provider_response"]["object_id"] == fault_provider.effects[0].id
    assert [e["event"] for e in row["events"]] == ["created", "claimed", "confirmed"]


async def test_names_the_operation_by_its_approved_idempotency_key(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """An unmodified SDK call that only sends the approved key finds its operation."""
    op = await fault_gate.approve()
    status, headers, _ = await fault_gate.send(
        REFUND, data=GOOD_BODY, headers={"Idempotency-Key": op["idempotency_key"]}
    )
    assert status == 200
    assert headers["X-Operation-Id"] == op["operation_id"]
    assert len(fault_provider.effects) == 1


async def _set_row(database_url: str, operation_id: str, assignment: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            f"UPDATE operations SET {assignment} WHERE operation_id = $1", operation_id
        )
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("scenario", "approval", "request_overrides", "status", "code"),
    REJECTIONS,
    ids=[r[0] for r in REJECTIONS],
)
async def test_rejections_send_nothing_and_leave_the_row_unchanged(
    fault_gate: Opgate,
    fault_provider: FaultProvider,
    scenario: str,
    approval: dict[str, Any],
    request_overrides: dict[str, Any],
    status: int,
    code: str,
) -> None:
    """Each rejection code: a problem+json answer, nothing at the provider, the row untouched."""
    op = await fault_gate.approve(**approval)
    overrides = dict(request_overrides)
    headers = {} if overrides.pop("no_op", False) else op_header(op)
    headers.update(overrides.pop("headers", {}))
    path = overrides.pop("path", REFUND)
    with capture_logs() as logs:
        got_status, got_headers, body = await fault_gate.send(
            path, data=overrides.pop("data", GOOD_BODY), headers=headers, **overrides
        )
    assert got_status == status, body
    assert got_headers["Content-Type"] == "application/problem+json"
    payload = problem(body)
    assert payload["code"] == code
    assert payload["status"] == status
    assert payload["detail"]
    assert payload["next_action"]
    assert fault_provider.requests == []
    row = await fault_gate.operation(op["operation_id"])
    assert row["status"] == "created"
    assert row["attempts"] == 0
    [audit] = [entry for entry in logs if entry["event"] == "request"]
    assert audit["decision"] == "deny"
    assert audit["reason"] == code


async def test_two_operation_id_headers_are_ambiguous(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """A header sent twice with different values is refused, never guessed."""
    first, second = await fault_gate.approve(), await fault_gate.approve()
    url = f"{fault_gate.agent_url}{REFUND}"
    headers = [
        ("Authorization", f"Bearer {AGENT_TOKEN}"),
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("X-Operation-Id", first["operation_id"]),
        ("X-Operation-Id", second["operation_id"]),
    ]
    from multidict import CIMultiDict

    async with fault_gate.http.post(url, data=GOOD_BODY, headers=CIMultiDict(headers)) as resp:
        assert resp.status == 400
        assert (await resp.json(content_type=None))["code"] == "ambiguous_request"
    assert fault_provider.requests == []


@pytest.mark.parametrize(
    "path", ["/fault/v1/../v1/refunds", "/fault/v1//refunds", "/fault/v1/refund%73"]
)
async def test_non_canonical_paths_are_refused(
    fault_gate: Opgate, fault_provider: FaultProvider, path: str
) -> None:
    """A path that could be normalised two ways is refused before any rule matches."""
    op = await fault_gate.approve()
    url = URL(f"{fault_gate.agent_url}{path}", encoded=True)
    async with fault_gate.http.post(
        url,
        data=GOOD_BODY,
        headers={
            "Authorization": f"Bearer {AGENT_TOKEN}",
            **op_header(op),
            "Content-Type": "application/x-www-form-urlencoded",
        },
    ) as resp:
        assert resp.status == 400
        assert (await resp.json(content_type=None))["code"] == "path_not_canonical"
    assert fault_provider.requests == []


async def test_revoked_and_expired_approvals_send_nothing(
    fault_gate: Opgate, fault_provider: FaultProvider, database_url: str
) -> None:
    """A revoked approval and an expired one are both refused; the provider sees nothing."""
    revoked, expired = await fault_gate.approve(), await fault_gate.approve()
    async with fault_gate.http.post(
        f"{fault_gate.ops_url}/v1/operations/{revoked['operation_id']}/revoke",
        json={"reason": "customer withdrew"},
        headers={"Authorization": "Bearer opg_test_admin_token_abcdefabcdef"},
    ) as resp:
        assert resp.status == 200
    await _set_row(database_url, expired["operation_id"], "expires_at = now() - interval '1 s'")
    status, _, body = await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(revoked))
    assert (status, problem(body)["code"]) == (403, "approval_revoked")
    status, _, body = await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(expired))
    assert (status, problem(body)["code"]) == (403, "approval_expired")
    assert fault_provider.requests == []


async def test_confirmed_operation_replays_the_stored_answer(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """A re-sent confirmed operation gets the stored answer; nothing is forwarded again."""
    op = await fault_gate.approve()
    first = await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    again = await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    assert first[0] == again[0] == 200
    assert again[2] == first[2]
    assert again[1]["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first[1]
    assert len(fault_provider.requests) == 1


async def test_replay_with_a_different_payload_is_a_mismatch(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """Same operation, different amount after confirmation: 422, not the stored answer."""
    op = await fault_gate.approve()
    await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    status, _, body = await fault_gate.send(
        REFUND, data="amount=900&currency=usd&charge=ch_1", headers=op_header(op)
    )
    assert (status, problem(body)["code"]) == (422, "amount_mismatch")
    assert len(fault_provider.requests) == 1


async def test_failed_operation_is_not_sent_again(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """A definite failure settles the row failed; a re-send gets 409 with the provider's answer."""
    op = await fault_gate.approve()
    fault_provider.mode = FaultMode.FAIL
    status, headers, _ = await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    assert status == 402
    assert headers["X-Operation-Status"] == "failed"
    fault_provider.mode = FaultMode.OK
    status, _, body = await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    payload = problem(body)
    assert (status, payload["code"]) == (409, "operation_failed")
    assert payload["provider_response"]["status"] == 402
    assert len(fault_provider.requests) == 1
    assert (await fault_gate.operation(op["operation_id"]))["status"] == "failed"


UNKNOWN_PATHS = [
    ("500 after commit", FaultMode.ERROR_AFTER_COMMIT, 502, "unknown:status"),
    ("dropped after commit", FaultMode.DROP_AFTER_COMMIT, 502, "unknown:dropped"),
    ("stalled past the timeout", FaultMode.STALL_AFTER_COMMIT, 504, "unknown:timeout"),
]


@pytest.mark.parametrize(
    ("scenario", "mode", "status", "outcome"), UNKNOWN_PATHS, ids=[u[0] for u in UNKNOWN_PATHS]
)
async def test_unknown_outcome_stays_dispatched_and_is_not_resent_without_dedupe(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    scenario: str,
    mode: FaultMode,
    status: int,
    outcome: str,
) -> None:
    """Unknown is never rounded down: the row stays dispatched; a provider that does not
    deduplicate gets no second request (409 reconcile_required) and has one effect."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False, total_timeout=0.5))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        fault_provider.mode = mode
        got, headers, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        assert (got, problem(body)["code"]) == (status, "outcome_unknown")
        assert headers["X-Operation-Status"] == "dispatched"
        row = await gate.operation(op["operation_id"])
        assert (row["status"], row["last_outcome"], row["lease_until"]) == (
            "dispatched",
            outcome,
            None,
        )
        fault_provider.mode = FaultMode.OK
        got, _, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        assert (got, problem(body)["code"]) == (409, "reconcile_required")
        fault_provider.release()
    assert len(fault_provider.requests) == 1
    assert len(fault_provider.effects) == 1


@pytest.mark.parametrize(
    ("scenario", "mode", "status", "outcome"), UNKNOWN_PATHS, ids=[u[0] for u in UNKNOWN_PATHS]
)
async def test_unknown_outcome_is_resent_with_the_same_key_when_the_provider_deduplicates(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    scenario: str,
    mode: FaultMode,
    status: int,
    outcome: str,
) -> None:
    """With a deduplicating provider, the re-send carries the same key and finds the first
    effect: one effect at the provider, the row confirmed with it."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=True, total_timeout=0.5))
    fault_provider.deduplicate = True
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve()
        fault_provider.mode = mode
        got, _, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        assert got == status
        fault_provider.release()
        fault_provider.mode = FaultMode.OK
        got, headers, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        assert got == 200, body
        assert headers["X-Operation-Status"] == "confirmed"
        row = await gate.operation(op["operation_id"])
    assert len(fault_provider.effects) == 1
    assert len(fault_provider.requests) == 2
    keys = {r.headers["Idempotency-Key"] for r in fault_provider.requests}
    assert keys == {op["idempotency_key"]}
    assert row["status"] == "confirmed"
    assert row["attempts"] == 2
    assert row["provider_response"]["object_id"] == fault_provider.effects[0].id


async def test_connection_refused_is_not_sent_and_may_be_sent_again(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
) -> None:
    """A provider that refuses the connection got no byte: the re-send is allowed even without
    deduplication, and the operation completes once."""
    import socket

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening: refused
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    try:
        async with start_opgate(upstream_overrides={"fault": dead_url}) as gate:
            op = await gate.approve()
            got, _, body = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
            assert (got, problem(body)["code"]) == (502, "upstream_unavailable")
            row = await gate.operation(op["operation_id"])
            assert (row["status"], row["last_outcome"]) == ("dispatched", "not_sent")
            gate.running.gateway.settings.upstream_overrides["fault"] = fault_provider.url
            got, _, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
            assert got == 200
    finally:
        closed.close()
    assert len(fault_provider.effects) == 1


async def test_an_attempt_in_flight_holds_off_every_other(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """50 concurrent identical requests: one reaches the provider; while it is in flight the
    other 49 get 409 operation_in_flight with Retry-After."""
    op = await fault_gate.approve()
    fault_provider.mode = FaultMode.STALL_AFTER_COMMIT
    tasks = [
        asyncio.create_task(fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op)))
        for _ in range(50)
    ]
    await fault_provider.in_flight.wait()
    pending: set[asyncio.Task[Any]] = set(tasks)
    while len(pending) > 1:
        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    fault_provider.release()
    results = await asyncio.gather(*tasks)
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200] + [409] * 49
    refused = [(h, problem(b)) for s, h, b in results if s == 409]
    assert {p["code"] for _, p in refused} == {"operation_in_flight"}
    assert all(int(h["Retry-After"]) >= 1 for h, _ in refused)
    assert len(fault_provider.requests) == 1
    assert len(fault_provider.effects) == 1


async def test_racing_identical_requests_reach_the_provider_once(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """50 identical requests racing with a fast provider: exactly one is forwarded; the others
    are told it is in flight or get the replayed answer."""
    op = await fault_gate.approve()
    results = await asyncio.gather(
        *(fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op)) for _ in range(50))
    )
    assert len(fault_provider.requests) == 1
    forwarded = [(h, b) for s, h, b in results if s == 200 and "Idempotent-Replayed" not in h]
    assert len(forwarded) == 1
    replays = [b for s, h, b in results if s == 200 and "Idempotent-Replayed" in h]
    # a replay decided in the middle of the race still carries the answer that won it
    assert all(body == forwarded[0][1] for body in replays)
    for status, _, body in results:
        assert status in (200, 409)
        if status == 409:
            assert problem(body)["code"] == "operation_in_flight"


async def test_json_rule_forwards_canonical_json_with_the_pointer_injected(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
) -> None:
    """JSON bodies: checked by pointer, re-serialised canonically, operation id injected."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False, body="json"))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await gate.approve(params={"/charge": "ch_1"})
        sent = '{ "amount": 500, "currency": "usd", "charge": "ch_1", "metadata": {"note": "x"} }'
        status, _, body = await gate.send(
            REFUND, data=sent, headers=op_header(op), content_type="application/json"
        )
        assert status == 200, body
        duplicate = '{"amount": 500, "currency": "usd", "charge": "ch_1", "amount": 5}'
        status, _, body = await gate.send(
            REFUND, data=duplicate, headers=op_header(op), content_type="application/json"
        )
        assert (status, problem(body)["code"]) == (400, "body_invalid")
    [received] = fault_provider.requests
    assert json.loads(received.body) == {
        "amount": 500,
        "currency": "usd",
        "charge": "ch_1",
        "metadata": {"note": "x", "operation_id": op["operation_id"]},
    }
    assert b" " not in received.body
    assert received.headers["Content-Type"] == "application/json"


async def test_reads_pass_without_an_operation_and_are_audited(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """A GET the policy lets through needs no operation; it still leaves one audit record."""
    with capture_logs() as logs:
        status, _, _ = await fault_gate.send(
            "/fault/v1/refunds?limit=3", method="GET", data=None, content_type=None
        )
    assert status == 200
    assert fault_provider.requests[0].query_string == "limit=3"
    [audit] = [e for e in logs if e["event"] == "request"]
    assert (audit["decision"], audit["rule"], audit["operation_id"]) == ("allow", "read", None)


async def test_missing_provider_credential_sends_nothing(
    fault_gate: Opgate, fault_provider: FaultProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a configured provider credential opgate answers 503 and forwards nothing."""
    monkeypatch.delenv("OPGATE_SECRET_FAULT_KEY")
    op = await fault_gate.approve()
    from proxy.gate.credentials import CredentialSource

    fault_gate.running.gateway.credentials = CredentialSource(None)
    status, _, body = await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    assert (status, problem(body)["code"]) == (503, "credential_unavailable")
    assert fault_provider.requests == []
    assert (await fault_gate.operation(op["operation_id"]))["status"] == "created"


async def test_secrets_never_reach_the_audit_log(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """Neither the agent's token nor the provider credential appears in any log entry."""
    op = await fault_gate.approve()
    with capture_logs() as logs:
        await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        await fault_gate.send(
            REFUND, data="amount=1&currency=usd&charge=ch_1", headers=op_header(op)
        )
        await fault_gate.send(REFUND, data=GOOD_BODY, token="opg_wrong_token_value")
    text = json.dumps(logs, default=str)
    assert len([e for e in logs if e["event"] == "request"]) == 3
    for secret in (AGENT_TOKEN, PROVIDER_SECRET, "opg_wrong_token_value"):
        assert secret not in text


async def test_the_audit_record_is_queued_before_the_answer_is_written(
    fault_gate: Opgate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record (numbered, queued for the audit log, logged) is made before the answer is
    written, so an agent that does not read cannot hold it back; once, for the answer sent."""
    order: list[str] = []
    emit, write_eof = proxy.observe.record_life.emit, web.Response.write_eof
    emit_stored = proxy.observe.record_life.emit_stored

    def emitting(record: AuditRecord) -> None:
        order.append(f"record {record.response_status}")
        emit(record)

    def emitting_stored(sealed: Sealed) -> None:  # stored by the settle (migration 0022)
        order.append(f"record {sealed.fields['response_status']}")
        emit_stored(sealed)

    async def writing_eof(self: web.Response, data: bytes = b"") -> None:
        if "X-Operation-Status" in self.headers:  # opgate's answer, not the fault provider's
            order.append(f"answer {self.status}")
        await write_eof(self, data)

    op = await fault_gate.approve()
    # the one owner of a record's life sends it (proxy/observe/record_life.py)
    monkeypatch.setattr(proxy.observe.record_life, "emit", emitting)
    monkeypatch.setattr(proxy.observe.record_life, "emit_stored", emitting_stored)
    monkeypatch.setattr(web.Response, "write_eof", writing_eof)
    status, _, _ = await fault_gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=op_header(op))
    assert status == 200
    assert order[:2] == ["record 200", "answer 200"]  # aiohttp's own write_eof then: a no-op
    assert [entry for entry in order if entry.startswith("record")] == ["record 200"]
