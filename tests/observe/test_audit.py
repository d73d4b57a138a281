"""Canonical request records: every rejection and every outcome path leaves exactly one, with
exactly the documented fields, in the log line and (the same fields) in the audit table."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import structlog
from structlog.testing import capture_logs

from proxy.gate.reasons import Reason
from proxy.observe.audit import AuditRecord, emit
from tests.support.audit_doc import documented_request_fields
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.opgate import Opgate, StartOpgate, fault_policy
from tests.support.pipeline import GOOD_BODY, REFUND, REJECTIONS, op_header

CAPTURE_KEYS = {"event", "log_level"}  # added by structlog's capture


async def _one_record(gate: Opgate, database_url: str, send: Any) -> dict[str, Any]:
    """Run ``send()``; the single request record it produced, checked against the docs and
    against its copy in PostgreSQL."""
    with capture_logs() as logs:
        await send()
    records = [entry for entry in logs if entry["event"] == "request"]
    assert len(records) == 1, records
    [record] = records
    assert set(record) - {"log_level"} == documented_request_fields()
    observability = gate.running.gateway.observability
    assert observability is not None
    assert observability.writer is not None
    await observability.writer.flush()
    conn = await asyncpg.connect(database_url)
    try:
        stored = await conn.fetch(
            "SELECT record::text FROM audit_log WHERE kind = 'request'"
            " AND record ->> 'request_id' = $1",
            record["request_id"],
        )
    finally:
        await conn.close()
    assert len(stored) == 1
    stored_record = json.loads(stored[0][0])
    assert set(stored_record) == documented_request_fields()
    assert stored_record["event"] == "request"  # the stored record says what it is, as the line
    return record


@pytest.mark.parametrize(
    ("scenario", "approval", "request_overrides", "status", "code"),
    REJECTIONS,
    ids=[r[0] for r in REJECTIONS],
)
async def test_each_rejection_leaves_one_documented_record(
    fault_gate: Opgate,
    database_url: str,
    scenario: str,
    approval: dict[str, Any],
    request_overrides: dict[str, Any],
    status: int,
    code: str,
) -> None:
    """A refused request: one record, decision deny, its code as reason."""
    op = await fault_gate.approve(**approval)
    overrides = dict(request_overrides)
    headers = {} if overrides.pop("no_op", False) else op_header(op)
    headers.update(overrides.pop("headers", {}))
    path = overrides.pop("path", REFUND)
    data = overrides.pop("data", GOOD_BODY)

    async def send() -> None:
        got, _, _ = await fault_gate.send(path, data=data, headers=headers, **overrides)
        assert got == status

    record = await _one_record(fault_gate, database_url, send)
    assert (record["decision"], record["reason"]) == ("deny", code)


# scenario, provider behaviour, expected (decision, reason, status_after)
OUTCOMES = [
    ("confirmed", FaultMode.OK, ("allow", None, "confirmed")),
    ("failed at the provider", FaultMode.FAIL, ("allow", None, "failed")),
    ("5xx: unknown", FaultMode.ERROR_AFTER_COMMIT, ("error", "unknown:status", "dispatched")),
    ("dropped: unknown", FaultMode.DROP_AFTER_COMMIT, ("error", "unknown:dropped", "dispatched")),
]


@pytest.mark.parametrize(("scenario", "mode", "expected"), OUTCOMES, ids=[o[0] for o in OUTCOMES])
async def test_each_outcome_leaves_one_documented_record(
    fault_gate: Opgate,
    fault_provider: FaultProvider,
    database_url: str,
    scenario: str,
    mode: FaultMode,
    expected: tuple[str, str | None, str],
) -> None:
    """A forwarded request: one record, with the outcome and the status transition."""
    op = await fault_gate.approve()
    fault_provider.mode = mode

    async def send() -> None:
        await fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))

    record = await _one_record(fault_gate, database_url, send)
    assert (record["decision"], record["reason"], record["status_after"]) == expected
    assert record["status_before"] == "created"
    assert record["operation_id"] == op["operation_id"]


async def test_replays_and_state_refusals_leave_one_documented_record(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
) -> None:
    """Replay of a confirmed operation, operation_failed, reconcile_required,
    approval_revoked, approval_expired and upstream_unavailable: one record each."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:

        async def sending(op: dict[str, Any]) -> Any:
            async def send() -> None:
                await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))

            return send

        seen: dict[str, dict[str, Any]] = {}
        confirmed, failed, unknown = (
            await gate.approve(),
            await gate.approve(),
            await gate.approve(),
        )
        await gate.send(REFUND, data=GOOD_BODY, headers=op_header(confirmed))
        seen["replay"] = await _one_record(gate, database_url, await sending(confirmed))
        fault_provider.mode = FaultMode.FAIL
        await gate.send(REFUND, data=GOOD_BODY, headers=op_header(failed))
        fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT
        await gate.send(REFUND, data=GOOD_BODY, headers=op_header(unknown))
        fault_provider.mode = FaultMode.OK
        seen[Reason.OPERATION_FAILED] = await _one_record(gate, database_url, await sending(failed))
        seen[Reason.RECONCILE_REQUIRED] = await _one_record(
            gate, database_url, await sending(unknown)
        )
        revoked, expired = await gate.approve(), await gate.approve()
        async with gate.http.post(
            f"{gate.ops_url}/v1/operations/{revoked['operation_id']}/revoke",
            json={"reason": "withdrawn"},
            headers={"Authorization": "Bearer opg_test_admin_token_abcdefabcdef"},
        ) as response:
            assert response.status == 200
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(
                "UPDATE operations SET expires_at = now() - interval '1 s' WHERE operation_id = $1",
                expired["operation_id"],
            )
        finally:
            await conn.close()
        seen[Reason.APPROVAL_REVOKED] = await _one_record(
            gate, database_url, await sending(revoked)
        )
        seen[Reason.APPROVAL_EXPIRED] = await _one_record(
            gate, database_url, await sending(expired)
        )
    assert seen.pop("replay")["decision"] == "replay"
    for code, record in seen.items():
        assert (record["decision"], record["reason"]) == ("deny", code)


async def test_the_remaining_agent_listener_paths_leave_one_documented_record(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ambiguous_request, path_not_canonical, operation_in_flight, operation_escalated,
    credential_unavailable, upstream_unavailable (nothing sent) and unknown:timeout: one record
    each, with the documented fields; with the other tests here and the forward-proxy tests
    (which cover the five forward-mode codes), every code an agent request can end with."""
    from multidict import CIMultiDict
    from yarl import URL

    from proxy.gate.credentials import CredentialSource

    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False, total_timeout=0.3))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        seen: dict[str, dict[str, Any]] = {}
        op = await gate.approve()
        token = {"Authorization": "Bearer opg_test_agent_a_token_0123456789"}

        async def twice_named() -> None:
            headers = CIMultiDict(
                [*token.items(), ("X-Operation-Id", "a"), ("X-Operation-Id", "b")]
            )
            async with gate.http.post(f"{gate.agent_url}{REFUND}", headers=headers) as response:
                assert response.status == 400

        seen[Reason.AMBIGUOUS_REQUEST] = await _one_record(gate, database_url, twice_named)

        async def dotted() -> None:
            url = URL(f"{gate.agent_url}/fault/v1/../v1/refunds", encoded=True)
            async with gate.http.post(url, headers=token) as response:
                assert response.status == 400

        seen[Reason.PATH_NOT_CANONICAL] = await _one_record(gate, database_url, dotted)

        async def send(which: dict[str, Any]) -> None:
            await gate.send(REFUND, data=GOOD_BODY, headers=op_header(which))

        fault_provider.mode = FaultMode.STALL_AFTER_COMMIT
        import asyncio

        first = asyncio.create_task(send(op))
        await fault_provider.in_flight.wait()
        seen[Reason.OPERATION_IN_FLIGHT] = await _one_record(gate, database_url, lambda: send(op))
        await first  # the stalled attempt times out: unknown
        fault_provider.release()

        timed_out = await gate.approve()
        fault_provider.mode = FaultMode.STALL_AFTER_COMMIT
        seen["unknown:timeout"] = await _one_record(gate, database_url, lambda: send(timed_out))
        fault_provider.release()
        fault_provider.mode = FaultMode.OK

        async with gate.http.post(
            f"{gate.ops_url}/v1/operations/{op['operation_id']}/reconcile",
            headers={"Authorization": "Bearer opg_test_admin_token_abcdefabcdef"},
        ) as response:  # no lookup declared: escalated
            assert (await response.json())["next_action"] == "escalated"
        seen[Reason.OPERATION_ESCALATED] = await _one_record(gate, database_url, lambda: send(op))

        fresh = await gate.approve()
        gate.running.gateway.credentials = CredentialSource(None, environ={})
        seen[Reason.CREDENTIAL_UNAVAILABLE] = await _one_record(
            gate, database_url, lambda: send(fresh)
        )
        gate.running.gateway.credentials = CredentialSource(
            None, environ={"OPGATE_SECRET_FAULT_KEY": "sk_test_x"}
        )
        gate.running.gateway.settings.upstream_overrides["fault"] = "http://127.0.0.1:9"
        seen[Reason.UPSTREAM_UNAVAILABLE] = await _one_record(
            gate, database_url, lambda: send(fresh)
        )
    timed = seen.pop("unknown:timeout")
    assert (timed["decision"], timed["reason"]) == ("error", "unknown:timeout")
    assert seen.pop(Reason.UPSTREAM_UNAVAILABLE)["reason"] == "not_sent"
    for code, record in seen.items():
        assert record["reason"] == code, (code, record)
        assert record["decision"] in ("deny", "error")


async def test_a_recovery_read_leaves_one_request_record(
    fault_gate: Opgate, database_url: str
) -> None:
    """docs/audit.md promises one record per request that reaches the agent listener; the
    recovery read is one (and may make opgate ask the provider with its own credential)."""
    op = await fault_gate.approve()

    async def read() -> None:
        status, _, _ = await fault_gate.send(
            f"/_opgate/v1/operations/{op['operation_id']}",
            method="GET",
            data=None,
            content_type=None,
        )
        assert status == 200

    record = await _one_record(fault_gate, database_url, read)
    assert record["operation_id"] == op["operation_id"]


def test_the_audit_line_follows_each_logging_configuration() -> None:
    """The audit line's logger is made once per structlog configuration, and a new
    configuration (here a capture, then another renderer) is followed from the next line on."""
    saved = structlog.get_config()
    lines: list[str] = []

    class ListLogger:
        def info(self, message: str) -> None:
            lines.append(message)

    try:
        with capture_logs() as captured:
            emit(AuditRecord(request_id="first"))
        assert [entry["request_id"] for entry in captured] == ["first"]
        structlog.configure(
            processors=[structlog.processors.JSONRenderer()],
            logger_factory=lambda *args: ListLogger(),
            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        )
        emit(AuditRecord(request_id="second"))
        emit(AuditRecord(request_id="third"))
        assert [json.loads(line)["request_id"] for line in lines] == ["second", "third"]
        with capture_logs() as captured:
            emit(AuditRecord(request_id="fourth"))
        assert [entry["request_id"] for entry in captured] == ["fourth"]
        assert len(lines) == 2
    finally:
        structlog.configure(**saved)
