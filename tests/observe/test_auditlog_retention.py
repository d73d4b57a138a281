"""Retention (proxy/observe/auditlog/retention.py): ``opgate audit prune`` archives and deletes
what the checkpoints up to N signed, and ``verify`` still finds the rest intact, while records
deleted any other way remain a break. Real opgate traffic, real PostgreSQL, the real CLI."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path

import asyncpg
import pytest

from proxy.observe.auditlog import records
from proxy.observe.auditlog.chain import record_hash
from tests.support.auditlog import AUDIT_KEY, FLUSH_DEADLINE, get, run_cli
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import AGENT_TOKEN, Opgate, StartOpgate, fault_policy
from tests.support.transparency import LOG_SIGNER

READ = "/fault/v1/charges/ch_1"
REFUND = "/fault/v1/refunds"
GOOD_BODY = "amount=500&currency=usd&charge=ch_1"


def _env() -> dict[str, str]:
    return {"OPGATE_SECRET_AUDIT_KEY": AUDIT_KEY, "PATH": "/usr/bin:/bin"}


async def _traffic(gate: Opgate) -> str:
    """One confirmed operation, two reads, one unauthenticated denial; the operation id."""
    op = await gate.approve()
    status, _, _ = await gate.send(
        REFUND, data=GOOD_BODY, headers={"X-Operation-Id": op["operation_id"]}
    )
    assert status == 200
    for _ in range(2):
        assert await get(gate, READ, AGENT_TOKEN) == 200
    assert await get(gate, READ) == 401
    operation_id: str = op["operation_id"]
    return operation_id


async def _stored_and_signed(gate: Opgate) -> int:
    """Wait until the writer has stored what is queued (its window left open), then sign."""
    observability = gate.running.gateway.observability
    assert observability is not None
    writer, checkpointer = observability.writer, observability.checkpointer
    assert writer is not None
    assert checkpointer is not None
    deadline = asyncio.get_running_loop().time() + FLUSH_DEADLINE
    while writer.pending:
        assert asyncio.get_running_loop().time() < deadline, "the writer did not catch up"
        await asyncio.sleep(0.02)  # polling a condition, with a deadline
    checkpoint_id = await checkpointer.checkpoint()
    assert checkpoint_id is not None
    return checkpoint_id


@pytest.fixture
def audit_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("OPGATE_SECRET_AUDIT_KEY", AUDIT_KEY)
    return AUDIT_KEY


async def _two_runs(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> tuple[str, str, int]:
    """Two runs of opgate on one database (the same instance id: one request stream, two
    runs). A checkpoint in the middle of the second run is the cut; the first run's operation,
    the second run's operation (after the cut)."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        old_operation = await _traffic(gate)
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        await _traffic(gate)
        cut = await _stored_and_signed(gate)
        new_operation = await _traffic(gate)
    return old_operation, new_operation, cut


async def test_a_pruned_log_still_verifies(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
    audit_key: str,
    tmp_path: Path,
) -> None:
    """Prune through a checkpoint in the middle of a run: the archive holds every removed
    record, verbatim and re-hashable; what is left verifies (chains, signatures, numbering from
    the floor on); the first run's operation is gone, the last one's is whole."""
    old_operation, new_operation, cut = await _two_runs(start_opgate, policy_dir, fault_provider)
    archive = tmp_path / "audit-archive.jsonl"
    command = ["audit", "prune", "--database-url", database_url, "--archive", str(archive)]
    code, out = await run_cli(*command, "--through-checkpoint", str(cut), env=_env())
    assert code == 0, out
    lines = [json.loads(line) for line in archive.read_text().splitlines()]
    assert f"pruned {len(lines)} records" in out
    for line in lines:
        at = datetime.fromisoformat(line["at"])
        recomputed = record_hash(
            bytes.fromhex(line["prev_hash"]),
            line["stream"],
            line["seq"],
            at,
            line["kind"],
            line["operation_id"],
            line["record"],
        )
        assert recomputed.hex() == line["hash"]
    code, out = await run_cli("audit", "verify", "--database-url", database_url, env=_env())
    assert code == 0, out
    assert f"pruned through seal {cut}" in out
    conn = await asyncpg.connect(database_url)
    try:
        left = await conn.fetchval(
            "SELECT count(*) FROM audit_log WHERE stream = $1", old_operation
        )
        kept = await conn.fetchval(
            "SELECT count(*) FROM audit_log WHERE stream = $1", new_operation
        )
        first_kept = await conn.fetchval(
            "SELECT min((record ->> 'instance_seq')::bigint) FROM audit_log"
            " WHERE stream LIKE 'requests/%'"
        )
    finally:
        await conn.close()
    assert (left, kept) == (0, 4)  # 3 transitions, and the settled request's record (0022)
    assert first_kept > 1  # the second run's first numbers went with the cut
    code, _ = await run_cli(*command, "--through-checkpoint", str(cut), env=_env())
    assert code == 1  # the archive exists: never overwritten


async def test_records_deleted_without_prune_or_behind_a_forged_prune_are_breaks(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
    audit_key: str,
) -> None:
    """Deleting what a checkpoint signed is a break, and so is the same deletion behind a
    retention record whose MAC was not made with the audit key."""
    _, _, cut = await _two_runs(start_opgate, policy_dir, fault_provider)
    conn = await asyncpg.connect(database_url)
    try:
        stream: str = await conn.fetchval(
            "SELECT DISTINCT stream FROM audit_log WHERE stream LIKE 'requests/%'"
        )
        signed = max(
            head.seq
            for checkpoint in await records.checkpoints(conn)
            if checkpoint.checkpoint_id <= cut
            for head in checkpoint.heads
            if head.stream == stream
        )
        async with conn.transaction():  # around the trigger, as an attacker would
            await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute(
                "DELETE FROM audit_log WHERE stream = $1 AND seq <= $2", stream, signed
            )
        code, out = await run_cli("audit", "verify", "--database-url", database_url, env=_env())
        assert code == 1
        assert f"stream {stream} seq {signed + 1}" in out
        assert "missing (deleted)" in out
        forged = {
            "through_checkpoint": cut,
            "archive_sha256": "0" * 64,
            "records": 1,
            "floors": {stream: 10**6},
            "mac": "00" * 32,
        }
        await records.append_batch(conn, records.STREAM_RETENTION, "retention", [forged])
    finally:
        await conn.close()
    code, out = await run_cli("audit", "verify", "--database-url", database_url, env=_env())
    assert code == 1
    assert "does not verify with the audit key" in out
    assert "missing (deleted)" in out


async def test_prune_refuses_a_broken_log_and_needs_the_key(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
    audit_key: str,
    tmp_path: Path,
) -> None:
    """Nothing is pruned from a log that does not verify, nor without the audit key."""
    _, _, cut = await _two_runs(start_opgate, policy_dir, fault_provider)
    archive = tmp_path / "archive.jsonl"
    command = ["audit", "prune", "--database-url", database_url, "--archive", str(archive)]
    command += ["--through-checkpoint", str(cut)]
    code, _ = await run_cli(*command, env={"PATH": "/usr/bin:/bin"})
    assert code == 2
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE audit_log SET record = record || '{\"x\": 1}'"
            " WHERE (stream, seq) = (SELECT stream, seq FROM audit_log ORDER BY at LIMIT 1)"
        )
        before = await conn.fetchval("SELECT count(*) FROM audit_log")
        code, _ = await run_cli(*command, env=_env())
        assert code == 1
        assert await conn.fetchval("SELECT count(*) FROM audit_log") == before
    finally:
        await conn.close()
    assert not archive.exists()


async def test_verify_reports_pruned_leaves_as_pruned_and_others_as_deleted(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
    audit_key: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the transparency log on, a legitimate prune leaves its leaves: verify counts the
    records gone at or before the cuts as pruned (one line, exit 0); a record deleted after
    a cut is still reported deleted (exit 1)."""
    monkeypatch.setenv("OPGATE_SECRET_TRANSPARENCY_KEY", LOG_SIGNER.skey())
    env = {**_env(), "OPGATE_SECRET_TRANSPARENCY_KEY": LOG_SIGNER.skey()}
    _, new_operation, cut = await _two_runs(start_opgate, policy_dir, fault_provider)
    archive = tmp_path / "audit-archive.jsonl"
    command = ["audit", "prune", "--database-url", database_url, "--archive", str(archive)]
    code, out = await run_cli(*command, "--through-checkpoint", str(cut), env=env)
    assert code == 0, out
    pruned = len(archive.read_text().splitlines())
    code, out = await run_cli("audit", "verify", "--database-url", database_url, env=env)
    assert code == 0, out
    assert f"{pruned} records pruned (at or before the cuts of seal {cut}" in out
    assert "gone (deleted)" not in out
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():  # around the trigger, as an attacker would
            await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute("DELETE FROM audit_log WHERE stream = $1 AND seq = 1", new_operation)
    finally:
        await conn.close()
    code, out = await run_cli("audit", "verify", "--database-url", database_url, env=env)
    assert code == 1
    assert f"(stream {new_operation} seq 1): the record is gone (deleted)" in out
