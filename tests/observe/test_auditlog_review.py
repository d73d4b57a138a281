"""What a security reviewer reads: the chained `created` record holds the whole approval,
`opgate audit export --after CURSOR [--follow]` resumes exactly where it stopped, and a
read-only database role can read the audit log and cannot write it (real PostgreSQL)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

import asyncpg

from tests.support.fault_provider import FaultProvider
from tests.support.opgate import Opgate, StartOpgate, fault_policy

ENV = {"PATH": "/usr/bin:/bin"}


async def created_record(database_url: str, operation_id: str) -> dict[str, Any]:
    conn = await asyncpg.connect(database_url)
    try:
        text = await conn.fetchval(
            "SELECT record::text FROM audit_log WHERE stream = $1 AND record ->> 'event' ="
            " 'created'",
            operation_id,
        )
    finally:
        await conn.close()
    assert text is not None
    record: dict[str, Any] = json.loads(text)
    return record


async def test_the_created_record_carries_the_whole_approval(
    start_opgate: StartOpgate, policy_dir: Path, database_url: str
) -> None:
    """The chained audit record of `created` says what was approved: approver, ref, tenant,
    target, amount, currency, params, path params, expiry, and the key's SHA-256 (never the
    key itself)."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate() as gate:
        op = await gate.approve(idempotency_key="key-that-must-not-be-recorded")
    detail = (await created_record(database_url, op["operation_id"]))["detail"]
    assert detail["approved_by"] == "alice@example.com"
    assert detail["approval_ref"] == "ticket-1"
    assert detail["tenant"] == "t1"
    assert (detail["provider"], detail["action"]) == ("fault", "refund.create")
    assert detail["target"] == {"method": "POST", "path": "/v1/refunds"}
    assert (detail["amount"], detail["currency"]) == (500, "usd")
    assert detail["params"] == {"charge": "ch_1"}
    assert detail["path_params"] == {}
    assert detail["expires_at"].startswith(op["approval"]["expires_at"][:19])
    assert (
        detail["idempotency_key_sha256"]
        == hashlib.sha256(b"key-that-must-not-be-recorded").hexdigest()
    )
    assert "key-that-must-not-be-recorded" not in json.dumps(detail)


async def _cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def _sent(gate: Opgate) -> str:
    op = await gate.approve()
    status, _, _ = await gate.send(
        "/fault/v1/refunds",
        data="amount=500&currency=usd&charge=ch_1",
        headers={"X-Operation-Id": op["operation_id"]},
    )
    assert status == 200
    operation_id: str = op["operation_id"]
    return operation_id


async def test_export_after_a_cursor_resumes_without_loss_or_repeat(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
    tmp_path: Path,
) -> None:
    """Two exports with one cursor file: the second writes exactly the records committed
    since the first, each (stream, seq) once, and nothing when run again."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    cursor = tmp_path / "cursor.json"
    command = ["audit", "export", "--database-url", database_url, "--after", str(cursor)]
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        first_op = await _sent(gate)
        await gate.running.gateway.observability.writer.flush()  # type: ignore[union-attr]
        code, first, _ = await _cli(*command, env=ENV)
        assert code == 0
        second_op = await _sent(gate)
        await gate.running.gateway.observability.writer.flush()  # type: ignore[union-attr]
        code, second, _ = await _cli(*command, env=ENV)
        assert code == 0
        code, third, _ = await _cli(*command, env=ENV)
        assert (code, third) == (0, "")
    seen = [json.loads(line) for line in (first + second).splitlines()]
    positions = [(r["audit_stream"], r["audit_seq"]) for r in seen]
    assert len(positions) == len(set(positions))
    conn = await asyncpg.connect(database_url)
    try:
        stored = {
            (r["stream"], r["seq"]) for r in await conn.fetch("SELECT stream, seq FROM audit_log")
        }
    finally:
        await conn.close()
    assert set(positions) == stored
    first_streams = {json.loads(line)["audit_stream"] for line in first.splitlines()}
    second_streams = {json.loads(line)["audit_stream"] for line in second.splitlines()}
    assert first_op in first_streams
    assert first_op not in second_streams
    assert second_op in second_streams
    saved = json.loads(cursor.read_text())
    assert saved[second_op] == max(s for st, s in positions if st == second_op)


HANG_GUARD_SECONDS = 180


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def test_export_follow_writes_new_records_until_interrupted(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
    tmp_path: Path,
) -> None:
    """`--follow` keeps polling: a record committed while it runs is written, and Ctrl-C
    (SIGINT) ends it cleanly (exit 0) with the cursor saved."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    cursor = tmp_path / "cursor.json"
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proxy",
            "audit",
            "export",
            "--database-url",
            database_url,
            "--after",
            str(cursor),
            "--follow",
            "--poll-seconds",
            "0.1",
            env=ENV,
            stdout=asyncio.subprocess.PIPE,
            # Ctrl-C as in a terminal: a test run started in the background by a shell without
            # job control has SIGINT ignored, which a child inherits (and then never stops)
            preexec_fn=_sigint_as_in_a_terminal,
        )
        assert process.stdout is not None
        try:
            operation_id = await _sent(gate)

            async def line_of_it() -> None:
                while True:
                    line = await process.stdout.readline()  # type: ignore[union-attr]
                    assert line, "export --follow ended by itself"
                    if json.loads(line)["audit_stream"] == operation_id:
                        return

            # The deadlines guard against a hang, they synchronise nothing: the test waits for
            # the line itself, then for the exit. On a loaded 2-core machine the exporter's
            # start (importing opgate) alone took most of an earlier 30 s deadline.
            await asyncio.wait_for(line_of_it(), HANG_GUARD_SECONDS)
            process.send_signal(signal.SIGINT)
            code = await asyncio.wait_for(process.wait(), HANG_GUARD_SECONDS)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert code == 0
    assert operation_id in json.loads(cursor.read_text())


async def test_the_audit_commands_find_the_embedded_database(tmp_path: Path) -> None:
    """With no database URL, `opgate audit verify` uses the embedded PostgreSQL in data_dir,
    as `opgate serve` and `policy explain` do, instead of refusing."""
    # /usr/sbin too: run as root on a fresh machine, the embedded server (pgserver) first
    # creates the user it runs as, with useradd.
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "OPGATE_DATA_DIR": str(tmp_path / "data")}
    code, out, err = await _cli("audit", "verify", env=env)
    assert code == 0, err
    assert out.startswith("ok: ")


async def test_the_reviewer_role_reads_the_audit_log_and_cannot_write_it(
    start_opgate: StartOpgate, policy_dir: Path, database_url: str
) -> None:
    """`opgate audit grant-reviewer ROLE --apply` gives a database role SELECT on the audit
    tables only: it reads audit_log and checkpoints, and INSERT, UPDATE, DELETE and reading
    operations are refused."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate() as gate:
        await gate.approve()
    role = f"opgate_reviewer_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')
        code, printed, err = await _cli(
            "audit", "grant-reviewer", role, "--database-url", database_url, env=ENV
        )
        assert code == 0, err
        assert f"TO {role}" in printed or f'TO "{role}"' in printed
        code, _, err = await _cli(
            "audit", "grant-reviewer", role, "--apply", "--database-url", database_url, env=ENV
        )
        assert code == 0, err
        as_reviewer = await asyncpg.connect(database_url, user=role)
        try:
            assert await as_reviewer.fetchval("SELECT count(*) FROM audit_log") > 0
            await as_reviewer.fetchval("SELECT count(*) FROM audit_checkpoints")
            for statement in (
                "INSERT INTO audit_log (stream, seq, kind, record, prev_hash, hash)"
                " VALUES ('x', 0, 'request', '{}', '\\x', '\\x')",
                "UPDATE audit_log SET record = '{}'",
                "DELETE FROM audit_log",
                "SELECT count(*) FROM operations",
            ):
                try:
                    await as_reviewer.execute(statement)
                except asyncpg.InsufficientPrivilegeError:
                    continue
                raise AssertionError(f"the reviewer role could run: {statement}")
        finally:
            await as_reviewer.close()
    finally:
        await admin.execute(f'DROP OWNED BY "{role}"')
        await admin.execute(f'DROP ROLE "{role}"')
        await admin.close()
