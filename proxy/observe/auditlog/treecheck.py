"""``opgate audit verify-tree``: the database's records against the signed tree.

Reads every leaf with its record as stored now (one repeatable-read snapshot), recomputes each
record's hash from its content and compares it with the hash the leaf committed to, rebuilds
the tree's root from the leaves and checks it against the latest checkpoint, whose signature
must verify with the log's public key (``--log-key``, or the configured ``transparency_key``),
and counts the witnesses' cosignatures. A record rewritten, deleted or displaced after it was
integrated is a break; records not integrated yet are reported with the age of the oldest
(the window in which a record can still vanish unseen: docs/audit.md, *Threats*).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from proxy.observe.auditlog import integrator
from proxy.observe.auditlog.chain import StoredRecord
from proxy.store import transparency as tstore
from proxy.transparency import merkle, note
from proxy.transparency.checkpoint import open_checkpoint


@dataclass
class TreeReport:
    breaks: list[str] = field(default_factory=list)
    leaves: int = 0
    cosigners: list[str] = field(default_factory=list)
    pending: int = 0
    oldest_pending: datetime | None = None


async def check_tree(
    conn: asyncpg.Connection, log: note.Verifier, witness_keys: Sequence[str] = ()
) -> TreeReport:
    report = TreeReport()
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        root, size = merkle.EMPTY_ROOT, 0
        frontier: list[bytes] = []
        async for row in tstore.leaves_with_records(conn):
            where = f"leaf {row['leaf_index']} (stream {row['stream']} seq {row['seq']})"
            committed = bytes(row["record_hash"])
            if row["hash"] is None:
                report.breaks.append(f"{where}: the record is gone (deleted)")
            else:
                stored = StoredRecord(
                    row["stream"],
                    row["seq"],
                    row["at"],
                    row["kind"],
                    row["operation_id"],
                    row["record"],
                    bytes(row["prev_hash"]),
                    bytes(row["hash"]),
                )
                if stored.expected_hash() != committed:
                    report.breaks.append(
                        f"{where}: the record is not the one the tree holds (rewritten or replaced)"
                    )
            grown = merkle.append_leaves(size, frontier, [integrator.record_leaf(committed)])
            frontier = _frontier(size + 1, frontier, grown)
            size, root = size + 1, grown.root
        report.leaves = size
        latest = await tstore.latest_checkpoint(conn)
        pending = await tstore.unintegrated(conn)
        report.pending, report.oldest_pending = pending["records"], pending["oldest"]
        cosignatures: list[str] = []
        if latest is not None:
            signed = await tstore.checkpoint_at(conn, latest["tree_size"])
            assert signed is not None
            cosignatures = list(signed["cosignatures"])
    if latest is None:
        if size:
            report.breaks.append("leaves without any checkpoint")
        return report
    witnesses = [note.Verifier.from_vkey(k) for k in witness_keys]
    try:
        opened = open_checkpoint(latest["note"] + "".join(cosignatures), log, witnesses)
    except note.NoteError as exc:
        report.breaks.append(f"checkpoint {latest['tree_size']}: {exc}")
        return report
    report.cosigners = sorted({s.name for s in opened.cosignatures})
    if opened.checkpoint.size != size or opened.checkpoint.root != root:
        report.breaks.append(
            f"the leaves ({size}) do not make the tree the latest checkpoint signed"
            f" ({opened.checkpoint.size}): leaves rewritten, added or removed"
        )
    return report


def _frontier(size: int, previous: list[bytes], grown: merkle.Grown) -> list[bytes]:
    """The frontier after one leaf: the previous nodes that stay, and the last one written."""
    keep = len(merkle.frontier_positions(size)) - 1
    return [*previous[:keep], grown.nodes[-1][2]]
