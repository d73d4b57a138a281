"""The integrator: every audit record becomes a leaf of one RFC 6962 Merkle tree, whose heads
are signed as C2SP checkpoints and shown to witnesses (docs/audit.md, *Transparency log*).

A round, in one transaction, one replica at a time (an advisory lock: the others skip the
round): take the records committed since the last round (store/transparency.py says how none
is missed), append their leaves (``leaf_hash(record hash)``: the record's chain hash commits to
its content and its predecessor) and the tree's new complete nodes, sign a checkpoint of the
new size. Then, outside the transaction, each configured witness is asked to cosign it
(witnesses.py). Every ``interval`` seconds, and once more on close.

The proofs a reviewer asks for (``opgate audit prove``, ``consistency``, ``bundle``) are read
from the same nodes (``inclusion``, ``consistency``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

import asyncpg
import structlog

from proxy.errors import StoreUnavailable
from proxy.observe.auditlog.periodic import Periodic
from proxy.store import transparency as tstore
from proxy.store.store import Store
from proxy.transparency import heads, merkle, note
from proxy.transparency.checkpoint import Checkpoint

_log = structlog.get_logger("opgate.audit")
ROUND_LIMIT = 5000  # records per round's statement; a backlog takes several rounds


def record_leaf(record_hash: bytes) -> bytes:
    """The leaf hash of an audit record: RFC 6962's leaf hash of its chain hash."""
    return merkle.leaf_hash(record_hash)


@dataclass(frozen=True)
class Integrated:
    """A round's outcome: the tree's size and root, the signed checkpoint, records added."""

    size: int
    root: bytes
    checkpoint: str
    added: int


async def _reader(
    conn: asyncpg.Connection, positions: Collection[tuple[int, int]]
) -> merkle.NodeReader:
    known = await tstore.nodes_at(conn, positions)
    missing = set(positions) - known.keys()
    if missing:
        raise LookupError(f"the tree's nodes {sorted(missing)[:3]} are missing")
    return lambda level, index: known[level, index]


async def tree_root(conn: asyncpg.Connection, size: int) -> bytes:
    positions = merkle.frontier_positions(size)
    node = await _reader(conn, positions)
    return merkle.range_hash(0, size, node) if size else merkle.EMPTY_ROOT


async def integrate(
    conn: asyncpg.Connection, signer: note.Signer, limit: int = ROUND_LIMIT
) -> Integrated | None:
    """One round (its own transaction) of at most ``limit`` records; None when another
    replica is integrating."""
    async with conn.transaction():
        if not await tstore.try_lock(conn):
            return None
        state = await tstore.state(conn)
        size = state.tree_size
        if state.heads_size != size:  # never built (migration 0025), or not this tree's
            await _rebuild_heads(conn, size)
        found = await tstore.pending(conn, state.floor_txid, limit)
        rows = found.records
        # Every row below xmin was visible to this read: all taken, unless the limit cut it
        # (then the last row's transaction may have more: the next round starts there). Never
        # above xmin: a transaction open in this snapshot may still commit rows below the last
        # row's txid, which a floor above it would skip for good.
        floor = found.xmin if len(rows) < limit else min(found.xmin, rows[-1]["txid"])
        if rows:
            positions = merkle.frontier_positions(size)
            node = await _reader(conn, positions)
            leaves = [(r["stream"], r["seq"], bytes(r["hash"])) for r in rows]
            grown = merkle.append_leaves(
                size, [node(*p) for p in positions], [record_leaf(h) for _, _, h in leaves]
            )
            await tstore.append(conn, size, leaves, grown.nodes, floor)
            size, root = size + len(rows), grown.root
            heads_root = await _advance_heads(conn, leaves, size)
        else:
            latest = await tstore.latest_checkpoint(conn)
            if latest is not None and latest["tree_size"] == size:
                return Integrated(size, bytes(latest["root"]), latest["note"], 0)
            root = await tree_root(conn, size)
            heads_root = heads.root(await tstore.head_buckets(conn))
        # the stream heads' root as an extension line: where each stream ends, signed
        # (c2sp.org/tlog-checkpoint allows extension lines; witnesses vouch only for the
        # first three, so `opgate audit verify` checks this one against the leaves)
        text = Checkpoint(signer.name, size, root, (heads.extension_line(heads_root),)).text()
        signed = note.sign_note(text, [signer])
        await tstore.insert_checkpoint(conn, size, root, signed)
    return Integrated(size, root, signed, len(rows))


async def _rebuild_heads(conn: asyncpg.Connection, size: int) -> None:
    """The stream heads of the tree of ``size``, from its leaves, and every bucket's hash."""
    await tstore.rebuild_heads(conn, size)
    await _rehash_buckets(conn, range(heads.BUCKETS))


async def _rehash_buckets(conn: asyncpg.Connection, buckets: Collection[int]) -> None:
    found: dict[int, list[heads.Head]] = {b: [] for b in buckets}
    for row in await tstore.heads_in_buckets(conn, buckets):
        found[row["bucket"]].append(
            heads.Head(row["stream"], row["seq"], bytes(row["record_hash"]))
        )
    await tstore.set_head_buckets(conn, {b: heads.bucket_hash(h) for b, h in found.items()})


async def _advance_heads(
    conn: asyncpg.Connection, leaves: list[tuple[str, int, bytes]], size: int
) -> bytes:
    """Move the heads of the streams a round's leaves belong to; the map's new root."""
    last: dict[str, tuple[int, bytes]] = {}
    for stream, seq, digest in leaves:
        if stream not in last or seq > last[stream][0]:
            last[stream] = (seq, digest)
    moved = [(s, heads.bucket_of(s), seq, digest) for s, (seq, digest) in last.items()]
    await tstore.advance_heads(conn, moved, size)
    await _rehash_buckets(conn, {bucket for _, bucket, _, _ in moved})
    return heads.root(await tstore.head_buckets(conn))


async def heads_proof(
    conn: asyncpg.Connection, stream: str
) -> tuple[list[heads.Head], list[bytes], bytes]:
    """The heads of ``stream``'s bucket, the sibling hashes to the map's root, and the root
    (as of the last round: the caller reads it in the snapshot of the checkpoint it uses)."""
    bucket = heads.bucket_of(stream)
    rows = await tstore.heads_in_buckets(conn, [bucket])
    found = sorted(
        (heads.Head(r["stream"], r["seq"], bytes(r["record_hash"])) for r in rows),
        key=lambda h: h.stream,
    )
    buckets = await tstore.head_buckets(conn)
    return found, heads.path(buckets, bucket), heads.root(buckets)


async def inclusion(conn: asyncpg.Connection, leaf_index: int, size: int) -> list[bytes]:
    """The audit path of a leaf in the tree of ``size`` (a size some checkpoint signed)."""
    node = await _reader(conn, merkle.inclusion_positions(leaf_index, size))
    return merkle.inclusion_proof(leaf_index, size, node)


async def consistency(conn: asyncpg.Connection, old: int, new: int) -> list[bytes]:
    """The proof that the tree of ``old`` is a prefix of the tree of ``new``."""
    node = await _reader(conn, merkle.consistency_positions(old, new))
    return merkle.consistency_proof(old, new, node)


Witnessing = Callable[[Integrated], Awaitable[None]]


class Integrator:
    """Integrates every ``interval`` seconds (and on close), then has witnesses cosign."""

    def __init__(
        self,
        store: Store,
        signer: note.Signer,
        interval: float,
        witnessing: Witnessing | None = None,
    ) -> None:
        self._store = store
        self._signer = signer
        self._witnessing = witnessing
        self._rounds = Periodic(
            "audit-integrator",
            interval,
            self.integrate,
            (StoreUnavailable, asyncpg.PostgresError, LookupError),
            "audit_integration_failed",
        )

    def start(self) -> None:
        self._rounds.start()

    async def integrate(self) -> Integrated | None:
        """Rounds until the backlog is integrated; the last round's outcome."""
        while True:
            done = await self._store.run(lambda conn: integrate(conn, self._signer))
            if done is None:
                return None
            if done.added:
                _log.info("audit_integrated", tree_size=done.size, added=done.added)
                if self._witnessing is not None:
                    await self._witnessing(done)
            if done.added < ROUND_LIMIT:
                return done

    async def close(self) -> None:
        await self._rounds.close()
