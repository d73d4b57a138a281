"""``opgate audit verify-tree`` (proxy/observe/auditlog/treecheck.py) on a real PostgreSQL: the
stored records against the signed tree. A row rewritten (and re-chained), deleted or inserted
after integration is a break; so are leaves rewritten to match; records not integrated yet are
counted, with the oldest one's age, and are no break."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import asyncpg
import pytest_asyncio

from proxy.observe.auditlog import integrator
from proxy.observe.auditlog.treecheck import check_tree
from proxy.store import audit
from proxy.transparency import heads, note
from proxy.transparency.checkpoint import Checkpoint, parse_checkpoint
from tests.support.polling import until
from tests.support.tamper import rechain

SIGNER = note.Signer.generate("opgate.test/audit")
STREAM = "op_tree_test"


@pytest_asyncio.fixture(loop_scope="session")
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """Four transitions and a policy record, integrated; then one more, not yet integrated."""
    connection = await asyncpg.connect(database_url)
    try:
        texts = [json.dumps({"event": f"e{n}", "operation_id": STREAM}) for n in range(4)]
        await audit.append_texts(connection, STREAM, "transition", texts)
        await audit.append_texts(connection, "policy", "policy_load", ['{"event":"loaded"}'])
        # The integrator's floor is the oldest transaction running anywhere on the server (ids
        # are the cluster's): integrate once nothing older than these records runs, or a
        # transaction of another database (another test's) keeps them above the floor, and a
        # renumbered record is not seen as one (seen once in a full run).
        written = await connection.fetchval("SELECT max(txid) FROM audit_log")
        await until(
            lambda: connection.fetchval(
                "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint > $1", written
            ),
            "no transaction older than the records runs",
            seconds=30,
        )
        assert await integrator.integrate(connection, SIGNER) is not None
        await audit.append_texts(connection, "policy", "policy_load", ['{"event":"reloaded"}'])
        yield connection
    finally:
        await connection.close()


async def test_an_intact_log_verifies_and_counts_what_is_pending(conn: asyncpg.Connection) -> None:
    """Five leaves match the signed root; the record written since is pending, not broken."""
    report = await check_tree(conn, SIGNER.verifier())
    assert report.breaks == []
    assert report.leaves == 5
    assert report.pending == 1
    assert report.oldest_pending is not None


async def test_a_rewritten_row_is_a_break(conn: asyncpg.Connection) -> None:
    """A record edited and its chain re-hashed no longer is what its leaf committed to."""
    await conn.execute(
        'UPDATE audit_log SET record = \'{"event": "forged"}\' WHERE stream = $1 AND seq = 2',
        STREAM,
    )
    await rechain(conn, STREAM)
    report = await check_tree(conn, SIGNER.verifier())
    assert (
        f"leaf 1 (stream {STREAM} seq 2): the record is not the one the tree holds"
        in (report.breaks[0])
    )


async def test_a_deleted_row_is_a_break(conn: asyncpg.Connection) -> None:
    """A record deleted after integration leaves its leaf without a record."""
    await conn.execute("DELETE FROM audit_log WHERE stream = $1 AND seq = 4", STREAM)
    await rechain(conn, STREAM)
    report = await check_tree(conn, SIGNER.verifier())
    assert report.breaks == [f"leaf 3 (stream {STREAM} seq 4): the record is gone (deleted)"]


async def test_an_inserted_row_is_a_break(conn: asyncpg.Connection) -> None:
    """A record inserted before the last transition (the stream re-numbered and re-chained)
    displaces the records after it."""
    await conn.execute("UPDATE audit_log SET seq = seq + 1 WHERE stream = $1 AND seq = 4", STREAM)
    await conn.execute(
        "INSERT INTO audit_log (stream, seq, kind, operation_id, record, prev_hash, hash)"
        " VALUES ($1, 4, 'transition', $1, '{\"event\": \"inserted\"}', '\\x', '\\x')",
        STREAM,
    )
    await rechain(conn, STREAM)
    report = await check_tree(conn, SIGNER.verifier())
    assert report.breaks == [
        f"leaf 3 (stream {STREAM} seq 4): the record is not the one the tree holds (rewritten"
        " or replaced)",
        f"stream {STREAM} seq 5: written before the integrator's floor, yet no leaf holds it"
        " (a leaf deleted, or the record renumbered)",
    ]
    assert report.pending == 2  # the displaced record and the one written after integration


async def test_leaves_rewritten_to_match_do_not_make_the_signed_tree(
    conn: asyncpg.Connection,
) -> None:
    """Rewriting the leaf too (the database holds no key) changes the root the log signed."""
    await conn.execute(
        'UPDATE audit_log SET record = \'{"event": "forged"}\' WHERE stream = $1 AND seq = 2',
        STREAM,
    )
    await rechain(conn, STREAM)
    await conn.execute(
        "UPDATE transparency_leaves l SET record_hash = a.hash FROM audit_log a"
        " WHERE a.stream = l.stream AND a.seq = l.seq"
    )
    report = await check_tree(conn, SIGNER.verifier())
    # the stored nodes are not what the rewritten leaves make, and neither is the signed root,
    # nor the stream heads it signs (the last record's leaf changed with the chain)
    *nodes, signed, ends = report.breaks
    assert ends.startswith("checkpoint 5: the stream heads it signs are not the ones")
    assert nodes[0] == "node (0, 1): not the hash its leaves make (rewritten)"
    assert all(n.startswith("node (") and n.endswith("(rewritten)") for n in nodes)
    assert signed == (
        "checkpoint 5: does not sign the tree the leaves make (leaves rewritten, or the"
        " checkpoint replaced)"
    )


async def test_stream_heads_signed_wrongly_are_a_break(conn: asyncpg.Connection) -> None:
    """Whoever holds the log's key re-signs the latest checkpoint with another heads root (a
    stream's end moved back, as a trimmed bundle would need): the tree still matches, the heads
    the leaves make do not."""
    row = await conn.fetchrow(
        "SELECT tree_size, note FROM transparency_checkpoints ORDER BY tree_size DESC LIMIT 1"
    )
    opened = parse_checkpoint(note.parse_note(row["note"]).text)
    forged = Checkpoint(opened.origin, opened.size, opened.root, (heads.extension_line(bytes(32)),))
    await conn.execute(
        "UPDATE transparency_checkpoints SET note = $2 WHERE tree_size = $1",
        row["tree_size"],
        note.sign_note(forged.text(), [SIGNER]),
    )
    report = await check_tree(conn, SIGNER.verifier())
    assert report.breaks == [
        "checkpoint 5: the stream heads it signs are not the ones its leaves make (where a"
        " stream ends, as a bundle proves it, would be wrong)"
    ]


async def test_a_checkpoint_signed_by_another_key_is_a_break(conn: asyncpg.Connection) -> None:
    """Checked with the log's real key, a checkpoint re-signed by another is refused."""
    other = note.Signer.generate("opgate.test/audit")
    report = await check_tree(conn, other.verifier())
    assert report.breaks == ["checkpoint 5: no signature by a known key"]


async def test_a_tree_of_many_rounds_and_cursor_pages_verifies(database_url: str) -> None:
    """300 records over 7 rounds, each signed: leaves, nodes and checkpoints are read by three
    cursors in step, each over several pages, and all agree; a node deep in the tree rewritten
    is found."""
    conn = await asyncpg.connect(database_url)
    try:
        for round_ in range(7):
            texts = [json.dumps({"event": f"r{round_}.{n}"}) for n in range(43)]
            await audit.append_texts(conn, f"op_many_{round_}", "transition", texts)
            assert await integrator.integrate(conn, SIGNER) is not None
        report = await check_tree(conn, SIGNER.verifier())
        assert report.breaks == []
        assert (report.leaves, report.checkpoints) == (301, 7)
        assert report.nodes == sum(301 >> level for level in range(9))
        await conn.execute(
            "UPDATE transparency_nodes SET hash = $1 WHERE level = 3 AND node_index = 20",
            b"\x00" * 32,
        )
        report = await check_tree(conn, SIGNER.verifier())
        assert report.breaks == ["node (3, 20): not the hash its leaves make (rewritten)"]
    finally:
        await conn.close()
