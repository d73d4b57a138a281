"""The database's records against the signed tree (``opgate audit verify`` and ``verify-tree``).

In one repeatable-read snapshot, three cursors walked in step, leaf by leaf:

- each leaf against its record as stored now: the record's hash recomputed from its content
  must be the hash the leaf committed to (a record rewritten, deleted or displaced after it was
  integrated is a break), and the leaves' indexes run 0, 1, 2... without a gap;
- the tree rebuilt from the leaves against the nodes stored (the ones proofs are read from):
  each node appending writes must be stored with that hash, and no other node stored;
- every signed checkpoint, when the rebuilt tree reaches its size: its signature must verify
  with one of the log's keys (the current one and those it was rotated from, and no other),
  and it must sign the root the leaves make. The latest one must cover every leaf, and the
  stored nodes alone must make its root too.

Then: records below the integrator's floor without a leaf (their leaf deleted) are breaks;
records not integrated yet are reported with the age of the oldest (the window in which a
record can still vanish unseen: docs/audit.md, *Threats*); the latest checkpoint's witnesses
are counted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from proxy.observe.auditlog import integrator
from proxy.observe.auditlog.chain import StoredRecord
from proxy.observe.auditlog.retention import Retention
from proxy.store import transparency as tstore
from proxy.transparency import heads, merkle, note
from proxy.transparency.checkpoint import open_checkpoint, parse_checkpoint

_LEAFLESS_SHOWN = 50


@dataclass
class TreeReport:
    breaks: list[str] = field(default_factory=list)
    leaves: int = 0
    nodes: int = 0
    checkpoints: int = 0
    signers: list[str] = field(default_factory=list)  # the log's keys that signed, "name+id"
    cosigners: list[str] = field(default_factory=list)
    pending: int = 0
    oldest_pending: datetime | None = None
    # leaves whose record a prune removed (at or before a cut of the retention in force):
    # counted, not breaks; the seal the cuts are read from
    pruned: int = 0
    pruned_through: int | None = None


class _Ahead:
    """An async iterator with one row of look-ahead."""

    def __init__(self, rows: AsyncIterator[asyncpg.Record]) -> None:
        self._rows = rows.__aiter__()
        self.row: asyncpg.Record | None = None

    async def advance(self) -> asyncpg.Record | None:
        self.row = await anext(self._rows, None)
        return self.row


def _order(level: int, index: int) -> tuple[int, int]:
    """Where appending writes node (level, index): after its last leaf, lower levels first."""
    return ((index + 1) << level) - 1, level


async def check_tree(
    conn: asyncpg.Connection,
    log: note.Verifier | Sequence[note.Verifier],
    witness_keys: Sequence[str] = (),
    retention: Retention | None = None,
) -> TreeReport:
    """``log``: the log's keys (the current one, and any it was rotated from);
    ``retention``: the cuts of the prunes so far (retention.py), whose records are gone by
    design (their leaves stay: the tree only grows)."""
    report = TreeReport()
    pruned = retention or Retention()
    report.pruned_through = pruned.through_checkpoint
    keys = [log] if isinstance(log, note.Verifier) else list(log)
    signers: set[int] = set()
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        nodes = _Ahead(tstore.nodes_in_order(conn))
        checkpoints = _Ahead(tstore.checkpoints_in_order(conn))
        await nodes.advance()
        await checkpoints.advance()
        root, size = merkle.EMPTY_ROOT, 0
        frontier: list[bytes] = []
        last_signed: tuple[int, bytes] | None = None
        while checkpoints.row is not None and checkpoints.row["tree_size"] == 0:
            last_signed = _checkpoint(checkpoints.row, 0, root, keys, signers, report)
            await checkpoints.advance()
        async for row in tstore.leaves_with_records(conn):
            if row["leaf_index"] != size:
                report.breaks.append(
                    f"leaf {size}: missing (the next leaf stored is {row['leaf_index']})"
                )
            committed = bytes(row["record_hash"])
            _leaf(row, committed, pruned, report)
            grown = merkle.append_leaves(size, frontier, [integrator.record_leaf(committed)])
            for level, index, digest in grown.nodes:
                await _node(nodes, level, index, digest, report)
            frontier = _frontier(size + 1, frontier, grown)
            size, root = size + 1, grown.root
            while checkpoints.row is not None and checkpoints.row["tree_size"] == size:
                last_signed = _checkpoint(checkpoints.row, size, root, keys, signers, report)
                await checkpoints.advance()
        while nodes.row is not None:
            report.breaks.append(
                f"node ({nodes.row['level']}, {nodes.row['node_index']}): stored, but not one"
                " the leaves make (added)"
            )
            await nodes.advance()
        while checkpoints.row is not None:
            report.breaks.append(
                f"the leaves ({size}) do not make the tree the latest checkpoint signed"
                f" ({checkpoints.row['tree_size']}): leaves rewritten, added or removed"
            )
            last_signed = None
            await checkpoints.advance()
        report.leaves = size
        if last_signed is not None:
            signed_size, signed_root = last_signed
            if signed_size != size:
                report.breaks.append(
                    f"{size - signed_size} leaves after the latest checkpoint"
                    f" ({signed_size}): added without the log's signature"
                )
            elif await _stored_root(conn, size) != signed_root:
                report.breaks.append(
                    f"the stored nodes do not make the root the latest checkpoint ({size})"
                    " signed: nodes rewritten (proofs read from them would not verify)"
                )
            signed = await tstore.checkpoint_at(conn, signed_size)
            assert signed is not None
            await _check_heads(conn, signed_size, str(signed["note"]), report)
            cosigned = str(signed["note"]) + "".join(signed["cosignatures"])
            try:
                report.cosigners = _cosigners(cosigned, keys, witness_keys)
            except note.NoteError as exc:
                report.breaks.append(f"checkpoint {signed_size}: {exc}")
        elif size and report.checkpoints == 0:
            report.breaks.append("leaves without any checkpoint")
        for leafless in await tstore.leafless_integrated(conn, _LEAFLESS_SHOWN):
            report.breaks.append(
                f"stream {leafless['stream']} seq {leafless['seq']}: written before the"
                " integrator's floor, yet no leaf holds it (a leaf deleted, or the record"
                " renumbered)"
            )
        pending = await tstore.unintegrated(conn)
        report.pending, report.oldest_pending = pending["records"], pending["oldest"]
    report.signers = sorted(f"{k.name}+{k.key_id:08x}" for k in keys if k.key_id in signers)
    return report


def _leaf(row: asyncpg.Record, committed: bytes, retention: Retention, report: TreeReport) -> None:
    where = f"leaf {row['leaf_index']} (stream {row['stream']} seq {row['seq']})"
    if row["hash"] is None and retention.pruned(row["stream"], row["seq"]):
        report.pruned += 1  # archived and deleted by a prune the retention record vouches for
        return
    if row["hash"] is None:
        report.breaks.append(f"{where}: the record is gone (deleted)")
        return
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


async def _node(nodes: _Ahead, level: int, index: int, digest: bytes, report: TreeReport) -> None:
    """The stored node at (level, index) against the one the leaves make."""
    while nodes.row is not None and _order(nodes.row["level"], nodes.row["node_index"]) < _order(
        level, index
    ):
        report.breaks.append(
            f"node ({nodes.row['level']}, {nodes.row['node_index']}): stored, but not one the"
            " leaves make (added)"
        )
        await nodes.advance()
    stored = nodes.row
    if stored is None or (stored["level"], stored["node_index"]) != (level, index):
        report.breaks.append(f"node ({level}, {index}): missing (deleted)")
        return
    report.nodes += 1
    if bytes(stored["hash"]) != digest:
        report.breaks.append(f"node ({level}, {index}): not the hash its leaves make (rewritten)")
    await nodes.advance()


def _checkpoint(
    row: asyncpg.Record,
    size: int,
    root: bytes,
    keys: Sequence[note.Verifier],
    signers: set[int],
    report: TreeReport,
) -> tuple[int, bytes] | None:
    """One stored checkpoint at the size the rebuilt tree has reached: (size, signed root)."""
    report.checkpoints += 1
    try:
        opened = open_checkpoint(row["note"], keys)
    except note.NoteError as exc:
        report.breaks.append(f"checkpoint {size}: {exc}")
        return None
    signers.add(opened.signed_by)
    signed = opened.checkpoint
    if signed.size != size or signed.root != root:
        report.breaks.append(
            f"checkpoint {size}: does not sign the tree the leaves make (leaves rewritten, or"
            " the checkpoint replaced)"
        )
    elif bytes(row["root"]) != signed.root:
        report.breaks.append(f"checkpoint {size}: its root column is not the root it signs")
    return signed.size, signed.root


async def _check_heads(
    conn: asyncpg.Connection, size: int, signed: str, report: TreeReport
) -> None:
    """The stream heads the latest checkpoint signs (its extension line, heads.py) must be
    those its leaves make: witnesses vouch only for the tree, so this is where a heads root
    signed wrongly (by whoever holds the log's key) is found. Earlier checkpoints' heads are
    not recomputed (it would take every stream's head at every size)."""
    try:
        claimed = heads.signed_root(parse_checkpoint(note.parse_note(signed).text).extensions)
    except (note.NoteError, heads.HeadsError) as exc:
        report.breaks.append(f"checkpoint {size}: {exc}")
        return
    if claimed is None:
        return  # signed before migration 0025: it says nothing of where streams end
    buckets: dict[int, bytes] = {}
    current: list[heads.Head] = []
    bucket = -1
    async for row in tstore.heads_from_leaves(conn, size):
        if row["bucket"] != bucket and current:
            buckets[bucket] = heads.bucket_hash(current)
            current = []
        bucket = row["bucket"]
        current.append(heads.Head(row["stream"], row["seq"], bytes(row["record_hash"])))
    if current:
        buckets[bucket] = heads.bucket_hash(current)
    if heads.root(buckets) != claimed:
        report.breaks.append(
            f"checkpoint {size}: the stream heads it signs are not the ones its leaves make"
            " (where a stream ends, as a bundle proves it, would be wrong)"
        )


async def _stored_root(conn: asyncpg.Connection, size: int) -> bytes | None:
    try:
        return await integrator.tree_root(conn, size)
    except LookupError:
        return None


def _cosigners(
    signed: str, keys: Sequence[note.Verifier], witness_keys: Sequence[str]
) -> list[str]:
    witnesses = [note.Verifier.from_vkey(k) for k in witness_keys]
    opened = open_checkpoint(signed, keys, witnesses)
    return sorted({s.name for s in opened.cosignatures})


def _frontier(size: int, previous: list[bytes], grown: merkle.Grown) -> list[bytes]:
    """The frontier after one leaf: the previous nodes that stay, and the last one written."""
    keep = len(merkle.frontier_positions(size)) - 1
    return [*previous[:keep], grown.nodes[-1][2]]
