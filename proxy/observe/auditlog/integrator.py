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
from proxy.transparency import merkle, note
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
        else:
            latest = await tstore.latest_checkpoint(conn)
            if latest is not None and latest["tree_size"] == size:
                return Integrated(size, bytes(latest["root"]), latest["note"], 0)
            root = await tree_root(conn, size)
        signed = note.sign_note(Checkpoint(signer.name, size, root).text(), [signer])
        await tstore.insert_checkpoint(conn, size, root, signed)
    return Integrated(size, root, signed, len(rows))


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
