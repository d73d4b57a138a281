"""The transparency log's statements (proxy/store/transparency.py) on a real PostgreSQL: what
the integrator writes, the readers read back; a reviewer role may read the tree."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest_asyncio

from proxy.store import audit
from proxy.store import transparency as tstore
from proxy.transparency import merkle


@pytest_asyncio.fixture(loop_scope="session")
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def test_an_append_is_read_back(conn: asyncpg.Connection) -> None:
    """Leaves, nodes and the state written by one append are what the readers return."""
    await audit.append_texts(conn, "policy", "policy_load", ['{"a":1}', '{"a":2}'])
    async with conn.transaction():
        assert await tstore.try_lock(conn)
        state = await tstore.state(conn)
        found = await tstore.pending(conn, state.floor_txid, 10)
        assert [(r["stream"], r["seq"]) for r in found.records] == [("policy", 1), ("policy", 2)]
        leaves = [(r["stream"], r["seq"], bytes(r["hash"])) for r in found.records]
        grown = merkle.append_leaves(0, [], [merkle.leaf_hash(h) for _, _, h in leaves])
        await tstore.append(conn, 0, leaves, grown.nodes, found.xmin)
        await tstore.insert_checkpoint(conn, 2, grown.root, "note\n")
    assert (await tstore.state(conn)).tree_size == 2
    assert await tstore.nodes_at(conn, [(1, 0)]) == {(1, 0): grown.root}
    leaf = await tstore.leaf(conn, "policy", 2)
    assert leaf is not None
    assert (leaf["leaf_index"], bytes(leaf["record_hash"])) == (1, leaves[1][2])
    assert (await tstore.pending(conn, found.xmin, 10)).records == []
    await tstore.insert_cosignature(conn, 2, "w.test", "— w.test AAAA\n")
    assert await tstore.witness_size(conn, "w.test") == 2
    signed = await tstore.checkpoint_at(conn, 2)
    assert signed is not None
    assert signed["cosignatures"] == ["— w.test AAAA\n"]


async def test_a_reviewer_may_read_the_tree(conn: asyncpg.Connection) -> None:
    """``opgate audit grant-reviewer`` covers the transparency tables (verify-tree, prove)."""
    role = f"reviewer_{uuid.uuid4().hex[:8]}"
    await conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        await audit.grant(conn, await audit.reviewer_grants(conn, role))
        for table in ("transparency_leaves", "transparency_nodes", "transparency_checkpoints"):
            assert await conn.fetchval("SELECT has_table_privilege($1, $2, 'SELECT')", role, table)
        assert not await conn.fetchval(
            "SELECT has_table_privilege($1, 'transparency_leaves', 'INSERT')", role
        )
    finally:
        await conn.execute(f'DROP OWNED BY "{role}"')
        await conn.execute(f'DROP ROLE "{role}"')
