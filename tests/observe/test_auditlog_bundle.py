"""Offline bundles (proxy/observe/auditlog/bundle.py, ``opgate audit bundle|verify-bundle``):
a bundle made from a real database verifies in a subprocess with no database and no OPGATE_*
setting; a row rewritten (and re-chained), deleted or inserted by someone with write access to
the database is found by the verifier with nothing but the bundle and the log's public key."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest_asyncio

from proxy.observe.auditlog import bundle, integrator
from proxy.store import audit
from proxy.transparency import note
from tests.support.bundles import audit_cli
from tests.support.bundles import verify_offline as offline
from tests.support.tamper import rechain
from tests.support.transparency import LOG_SIGNER, ROTATED_SIGNER, UNKNOWN_SIGNER

OPERATION = "op_bundle_test"
SIGNER = LOG_SIGNER
VKEY = SIGNER.verifier().vkey()


@pytest_asyncio.fixture(loop_scope="session")
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """An operation's stream of 3 transitions and a request naming it, integrated and signed."""
    connection = await asyncpg.connect(database_url)
    try:
        texts = [
            json.dumps({"event": event, "operation_id": OPERATION})
            for event in ("created", "claimed", "confirmed")
        ]
        await audit.append_texts(connection, OPERATION, "transition", texts)
        request = json.dumps({"decision": "allow", "operation_id": OPERATION})
        await audit.append_texts(connection, "requests/gw-1", "request", [request])
        await audit.append_texts(connection, "policy", "policy_load", ['{"event":"loaded"}'])
        assert await integrator.integrate(connection, SIGNER) is not None
        yield connection
    finally:
        await connection.close()


def opgate(*args: str) -> subprocess.CompletedProcess[str]:
    return audit_cli(*args)


def make_bundle(database_url: str, path: Path) -> None:
    made = opgate(
        "bundle",
        "--operation",
        OPERATION,
        "--database-url",
        database_url,
        "--log-key",
        VKEY,
        "-o",
        str(path),
    )
    assert made.returncode == 0, made.stderr


def verify_offline(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return offline(path, tmp_path, "--log-key", VKEY)


async def test_a_bundle_verifies_offline(
    conn: asyncpg.Connection, database_url: str, tmp_path: Path
) -> None:
    """The operation's 3 transitions and its request record are proven in the signed
    checkpoint by a verifier that has neither database nor settings."""
    path = tmp_path / "op.bundle.json"
    make_bundle(database_url, path)
    checked = verify_offline(path, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok: 4 records proven in a checkpoint of 5 records" in checked.stdout


async def test_a_rewritten_and_rechained_row_is_found(
    conn: asyncpg.Connection, database_url: str, tmp_path: Path
) -> None:
    """A DBA changes the approval's record and re-hashes the chain around it: the records no
    longer are what the signed tree holds."""
    await conn.execute(
        'UPDATE audit_log SET record = record || \'{"event": "approved-by-someone-else"}\''
        " WHERE stream = $1 AND seq = 1",
        OPERATION,
    )
    await rechain(conn, OPERATION)
    path = tmp_path / "op.bundle.json"
    make_bundle(database_url, path)
    checked = verify_offline(path, tmp_path)
    assert checked.returncode == 1
    assert f"stream {OPERATION} seq 1: is not the record the signed log holds" in checked.stdout


async def test_a_deleted_row_is_found(
    conn: asyncpg.Connection, database_url: str, tmp_path: Path
) -> None:
    """A DBA deletes the claim and re-chains what follows: the log still holds its leaf."""
    await conn.execute("DELETE FROM audit_log WHERE stream = $1 AND seq = 2", OPERATION)
    await rechain(conn, OPERATION)
    path = tmp_path / "op.bundle.json"
    make_bundle(database_url, path)
    checked = verify_offline(path, tmp_path)
    assert checked.returncode == 1
    assert f"stream {OPERATION} seq 2: the log holds leaf" in checked.stdout
    assert "record is gone (deleted)" in checked.stdout


async def test_an_inserted_row_is_found(
    conn: asyncpg.Connection, database_url: str, tmp_path: Path
) -> None:
    """A DBA inserts a record before the confirmation and re-chains the stream: the records
    from there on are not what the signed tree holds at their positions."""
    await conn.execute(
        "UPDATE audit_log SET seq = seq + 10 WHERE stream = $1 AND seq >= 2", OPERATION
    )
    await conn.execute(
        "UPDATE audit_log SET seq = seq - 9 WHERE stream = $1 AND seq >= 12", OPERATION
    )
    await conn.execute(
        "INSERT INTO audit_log (stream, seq, kind, operation_id, record, prev_hash, hash)"
        " VALUES ($1, 2, 'transition', $1, '{\"event\": \"approved\"}', '\\x', '\\x')",
        OPERATION,
    )
    await rechain(conn, OPERATION)
    path = tmp_path / "op.bundle.json"
    make_bundle(database_url, path)
    checked = verify_offline(path, tmp_path)
    assert checked.returncode == 1
    assert f"stream {OPERATION} seq 2: is not the record the signed log holds" in checked.stdout


async def test_a_bundle_signed_by_another_key_is_refused(
    conn: asyncpg.Connection, database_url: str, tmp_path: Path
) -> None:
    """An operator who re-signs a rewritten history with a new key does not pass a reviewer
    who holds the log's key."""
    path = tmp_path / "op.bundle.json"
    make_bundle(database_url, path)
    other = note.Signer.generate("opgate.test/audit")
    bundle = json.loads(path.read_text())
    text = note.parse_note(bundle["checkpoint"]).text
    bundle["checkpoint"] = note.sign_note(text, [other])
    bundle["log"] = other.verifier().vkey()
    path.write_text(json.dumps(bundle))
    checked = verify_offline(path, tmp_path)
    assert checked.returncode == 1
    assert "checkpoint: no signature by a known key" in checked.stdout


async def test_a_window_bundle_proves_every_record_written_in_it(
    conn: asyncpg.Connection, database_url: str, tmp_path: Path
) -> None:
    """``--since/--until`` without an operation: every record written in the window, each
    proven on its own (a window need not start a stream, so no chain is required)."""
    path = tmp_path / "window.bundle.json"
    made = opgate(
        "bundle",
        "--since",
        "1970-01-01T00:00:00Z",
        "--until",
        "9999-01-01T00:00:00Z",
        "--database-url",
        database_url,
        "--log-key",
        VKEY,
        "-o",
        str(path),
    )
    assert made.returncode == 0, made.stderr
    checked = verify_offline(path, tmp_path)
    assert checked.returncode == 0, checked.stdout
    assert "ok: 5 records proven in a checkpoint of 5 records" in checked.stdout
    alone = opgate("bundle", "--since", "1970-01-01T00:00:00Z", "--database-url", database_url)
    assert alone.returncode == 2


async def test_bundles_verify_across_a_key_rotation(conn: asyncpg.Connection) -> None:
    """A bundle signed before the log rotated its key and one signed after both verify with
    the log's two keys; each is refused by a reviewer holding only the other key, and by one
    holding a key the log never had."""
    before = await bundle.build(conn, OPERATION, SIGNER.verifier(), [], 0)
    text = json.dumps({"event": "revoked", "operation_id": OPERATION})
    await audit.append_texts(conn, OPERATION, "transition", [text])
    assert await integrator.integrate(conn, ROTATED_SIGNER) is not None
    after = await bundle.build(
        conn, OPERATION, ROTATED_SIGNER.verifier(), [], 0, earlier_logs=[VKEY]
    )
    assert after["earlier_logs"] == [VKEY]
    both = [ROTATED_SIGNER.verifier().vkey(), VKEY]
    for made, signer in ((before, SIGNER), (after, ROTATED_SIGNER)):
        report = bundle.verify(made, both)
        assert report.breaks == []
        assert report.signed_by == f"{signer.name}+{signer.key_id:08x}"
    assert bundle.verify(after, VKEY).breaks == ["checkpoint: no signature by a known key"]
    assert bundle.verify(before, both[0]).breaks == ["checkpoint: no signature by a known key"]
    unknown = UNKNOWN_SIGNER.verifier().vkey()
    assert bundle.verify(after, unknown).breaks == ["checkpoint: no signature by a known key"]
    assert bundle.verify(after).breaks == []  # the bundle's own keys: said in a note
