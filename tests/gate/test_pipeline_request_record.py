"""Stage 7 and 8 together: the request record of a claimed operation is written by the
statement that records the operation's outcome (migration 0022), in the operation's stream,
chained after the transition; the batch writer keeps every other record, and takes this one
back only when that statement fails."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from structlog.testing import capture_logs

from tests.support.audit_doc import documented_request_fields
from tests.support.auditlog import flushed, run_cli
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.opgate import Opgate, StartOpgate, fault_policy
from tests.support.pg_relay import TcpRelay, dsn_through_relay, relay_target
from tests.support.pipeline import GOOD_BODY, REFUND, op_header
from tests.support.polling import until

_RECORDS = (
    "SELECT stream, seq, kind, operation_id, record::text AS record, prev_hash, hash, txid::text"
    " AS txid FROM audit_log WHERE record ->> 'request_id' = $1 OR stream = $2 ORDER BY stream,"
    " seq"
)


async def _rows(database_url: str, request_id: str, operation_id: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(database_url)
    try:
        return [dict(r) for r in await conn.fetch(_RECORDS, request_id, operation_id)]
    finally:
        await conn.close()


async def _send_logged(gate: Opgate, op: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One refund for ``op``; its status and its request log line."""
    with capture_logs() as logs:
        status, _, _ = await gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
    [line] = [entry for entry in logs if entry["event"] == "request"]
    return status, line


@pytest.mark.parametrize(
    ("mode", "statement_event", "status_after"),
    [
        (FaultMode.OK, "confirmed", "confirmed"),  # settle_operation
        (FaultMode.ERROR_AFTER_COMMIT, "unknown", "dispatched"),  # release_unknown
    ],
    ids=["settled", "attempt_ended_unknown"],
)
async def test_a_claimed_request_is_recorded_by_its_outcome_statement(
    fault_gate: Opgate,
    fault_provider: FaultProvider,
    database_url: str,
    mode: FaultMode,
    statement_event: str,
    status_after: str,
) -> None:
    """The record is in the operation's stream right after the outcome's transition, chained on
    it, committed by the same transaction, the head on the row past it; the writer stores
    nothing for it and numbers nothing (its log line says the same, without a number)."""
    writer = await flushed(fault_gate)
    written_before = writer.written
    op = await fault_gate.approve()
    fault_provider.mode = mode
    _, line = await _send_logged(fault_gate, op)
    await flushed(fault_gate)
    assert writer.written == written_before  # nothing went through the batch writer
    operation_id = op["operation_id"]
    rows = await _rows(database_url, line["request_id"], operation_id)
    assert [(r["stream"], r["seq"], r["kind"]) for r in rows] == [
        (operation_id, 1, "transition"),
        (operation_id, 2, "transition"),
        (operation_id, 3, "transition"),
        (operation_id, 4, "request"),
    ]
    transition, request = rows[2], rows[3]
    assert json.loads(transition["record"])["event"] == statement_event
    assert bytes(request["prev_hash"]) == bytes(transition["hash"])
    assert request["txid"] == transition["txid"]  # one statement, one commit
    assert request["operation_id"] == operation_id
    stored = json.loads(request["record"])
    assert set(stored) == documented_request_fields()
    assert stored["instance_seq"] is None
    assert (stored["status_before"], stored["status_after"]) == ("created", status_after)
    assert stored["event"] == "request"
    assert {k: v for k, v in line.items() if k != "log_level"} == stored  # the line is the record
    conn = await asyncpg.connect(database_url)
    try:
        head = await conn.fetchrow(
            "SELECT audit_seq, audit_hash FROM operations WHERE operation_id = $1", operation_id
        )
    finally:
        await conn.close()
    assert (head["audit_seq"], bytes(head["audit_hash"])) == (4, bytes(request["hash"]))
    code, out = await run_cli("audit", "verify", "--database-url", database_url, env=_env())
    assert code == 0, out


async def test_a_refused_read_is_still_numbered_by_the_writer(
    fault_gate: Opgate, database_url: str
) -> None:
    """A request that claims nothing (an unknown operation) keeps its numbered record in the
    instance's stream."""
    status, line = await _send_logged(fault_gate, {"operation_id": "op_nowhere"})
    assert status == 404
    await flushed(fault_gate)
    [row] = await _rows(database_url, line["request_id"], "-")
    assert row["stream"].startswith("requests/")
    assert json.loads(row["record"])["instance_seq"] == line["instance_seq"] >= 1


async def test_a_settle_cut_off_leaves_the_record_to_the_writer_exactly_once(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, database_url: str
) -> None:
    """The database goes while the provider answers: the settle fails, and the record (what
    opgate answered: still dispatched) goes through the batch writer once the database is
    back, numbered, exactly once; nothing is in the operation's stream past its claim."""
    relay = TcpRelay()
    relayed = dsn_through_relay(database_url, *await relay.start(*relay_target(database_url)))
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    try:
        async with start_opgate(
            database_url=relayed,
            upstream_overrides={"fault": fault_provider.url},
            pool_acquire_timeout_seconds=1.0,
        ) as gate:
            op = await gate.approve()
            fault_provider.mode = FaultMode.STALL_AFTER_COMMIT
            sending = asyncio.create_task(_send_logged(gate, op))
            await asyncio.wait_for(fault_provider.in_flight.wait(), 10)
            await relay.cut()
            fault_provider.release()
            status, line = await asyncio.wait_for(sending, 30)
            assert status == 200  # the provider's answer, passed through
            assert line["status_after"] == "dispatched"
            assert isinstance(line["instance_seq"], int)
            await relay.restore()
            await flushed(gate)
    finally:
        await relay.stop()
    rows = await _rows(database_url, line["request_id"], op["operation_id"])
    kinds = [(r["stream"] == op["operation_id"], r["kind"]) for r in rows]
    assert kinds == [(True, "transition"), (True, "transition"), (False, "request")], rows
    stored = json.loads(rows[-1]["record"])
    assert stored == {k: v for k, v in line.items() if k != "log_level"}
    code, out = await run_cli("audit", "verify", "--database-url", database_url, env=_env())
    assert code == 0, out


async def test_verify_takes_both_forms_and_catches_an_edited_request_record(
    fault_gate: Opgate,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A log with request records of claimed operations in both places (the writer's, as
    before 0022; the operation's stream) verifies; an edited one in an operation's stream is
    named by its stream and position."""
    with monkeypatch.context() as before_0022:  # records made as before: through the writer
        before_0022.setattr("proxy.observe.record_life.seal", lambda record: None)
        old = await fault_gate.approve()
        status, old_line = await _send_logged(fault_gate, old)
        assert status == 200
        assert isinstance(old_line["instance_seq"], int)
    new = await fault_gate.approve()
    status, new_line = await _send_logged(fault_gate, new)
    assert status == 200
    assert new_line["instance_seq"] is None
    await flushed(fault_gate)
    code, out = await run_cli("audit", "verify", "--database-url", database_url, env=_env())
    assert code == 0, out
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE audit_log SET record = jsonb_set(record, '{provider_answer_sha256}', '\"0\"')"
            " WHERE stream = $1 AND kind = 'request'",
            new["operation_id"],
        )
    finally:
        await conn.close()
    code, out = await run_cli("audit", "verify", "--database-url", database_url, env=_env())
    assert code == 1, out
    assert f"stream {new['operation_id']} seq 4" in out, out


async def test_the_record_of_an_agent_that_hangs_up_is_written_once(
    fault_gate: Opgate, fault_provider: FaultProvider, database_url: str
) -> None:
    """An agent that hangs up while its refund is at the provider leaves one record: the
    handler's (as far as it knew) or the settle's, never both."""
    op = await fault_gate.approve()
    fault_provider.mode = FaultMode.STALL_AFTER_COMMIT
    with capture_logs() as logs:
        sending = asyncio.create_task(
            fault_gate.send(REFUND, data=GOOD_BODY, headers=op_header(op))
        )
        await asyncio.wait_for(fault_provider.in_flight.wait(), 10)
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        fault_provider.release()

        async def settled() -> bool:
            return (await fault_gate.operation(op["operation_id"]))["status"] == "confirmed"

        await until(settled, "the refund settled")
        await flushed(fault_gate)
    lines = [e for e in logs if e["event"] == "request"]
    assert [line["operation_id"] for line in lines] == [op["operation_id"]]
    conn = await asyncpg.connect(database_url)
    try:
        stored = await conn.fetchval(
            "SELECT count(*) FROM audit_log WHERE kind = 'request' AND operation_id = $1"
            " AND NOT record ? 'record_type'",
            op["operation_id"],
        )
    finally:
        await conn.close()
    assert stored == 1


def _env() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin"}
