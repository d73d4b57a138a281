"""``opgate audit verify`` checks the transparency tree as well as the chains (cli.py,
treecheck.py), as a user runs it (a subprocess): every integrated record's leaf, the stored
nodes against the tree the leaves make, every checkpoint's signature by one of the log's keys
(its current one and those it was rotated from, no other); the chain checks and their output
stay as they were."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import asyncpg
import pytest_asyncio

from proxy.observe.auditlog import integrator
from proxy.store import audit
from tests.support.bundles import audit_cli, audit_in_process
from tests.support.transparency import LOG_SIGNER, ROTATED_SIGNER, UNKNOWN_SIGNER

STREAM = "op_verify_tree"


@pytest_asyncio.fixture(loop_scope="session")
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """Four transitions and a policy record integrated under the log's first key; two more
    transitions under the key it was rotated to (the same origin)."""
    connection = await asyncpg.connect(database_url)
    try:
        texts = [json.dumps({"event": f"e{n}", "operation_id": STREAM}) for n in range(4)]
        await audit.append_texts(connection, STREAM, "transition", texts)
        await audit.append_texts(connection, "policy", "policy_load", ['{"event":"loaded"}'])
        assert await integrator.integrate(connection, LOG_SIGNER) is not None
        texts = [json.dumps({"event": f"e{n}", "operation_id": STREAM}) for n in range(4, 6)]
        await audit.append_texts(connection, STREAM, "transition", texts)
        assert await integrator.integrate(connection, ROTATED_SIGNER) is not None
        yield connection
    finally:
        await connection.close()


async def verify(database_url: str, *keys: str) -> tuple[int, list[str]]:
    """``opgate audit verify`` with these ``--log-key``s (none: the configured ones)."""
    args = [a for key in keys for a in ("--log-key", key)]
    code, out, err = await audit_in_process("verify", "--database-url", database_url, *args)
    assert not err, err
    return code, out.splitlines()


async def test_the_tree_is_verified_across_a_key_rotation(
    conn: asyncpg.Connection, database_url: str
) -> None:
    """With the rotated key configured and the earlier one named (audit_earlier_log_keys),
    both checkpoints verify; the chain summary is unchanged. Without any key, the tree is said
    to be unchecked, not passed; a key that is not a vkey ends the command (exit 2)."""
    current, earlier = ROTATED_SIGNER.verifier(), LOG_SIGNER.verifier()
    done = audit_cli(
        "verify",
        "--database-url",
        database_url,
        env={
            "OPGATE_SECRET_TRANSPARENCY_KEY": ROTATED_SIGNER.skey(),
            "OPGATE_AUDIT_EARLIER_LOG_KEYS": json.dumps([earlier.vkey()]),
        },
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines[0].startswith("ok: 7 records, 0 seals"), lines
    signers = sorted(f"{k.name}+{k.key_id:08x}" for k in (current, earlier))
    assert lines[1] == (
        f"tree: ok: 7 leaves, 11 nodes, 2 checkpoints signed by {', '.join(signers)}; the"
        " latest cosigned by 0 witnesses (-)"
    )

    code, lines = await verify(database_url)
    assert code == 0
    assert lines[1] == "tree: not checked (no transparency_key; give --log-key)"
    code, out, err = await audit_in_process(
        "verify", "--database-url", database_url, "--log-key", "opgate.test/audit"
    )
    assert (code, out) == (2, "")
    assert err.startswith("opgate audit verify: the log's key: not a verifier key")


async def test_a_tampered_node_or_leaf_and_an_unknown_key_are_reported(
    conn: asyncpg.Connection, database_url: str
) -> None:
    """A node rewritten (proofs read it), a leaf rewritten, and, checked with only the log's
    earlier key, the checkpoint its new key signed: each a break of the tree, with exit 1,
    while the chains still verify."""
    await conn.execute(
        "UPDATE transparency_nodes SET hash = $1 WHERE level = 1 AND node_index = 0", b"\x07" * 32
    )
    await conn.execute(
        "UPDATE transparency_leaves SET record_hash = $1 WHERE leaf_index = 5", b"\x07" * 32
    )
    code, lines = await verify(database_url, LOG_SIGNER.verifier().vkey())
    assert code == 1
    assert lines[0] == "BROKEN: the tree: node (1, 0): not the hash its leaves make (rewritten)"
    assert lines[1].startswith("chains ok: 7 records, 0 seals")
    assert lines[2].startswith("tree: BROKEN:")
    problems = [line.strip() for line in lines[3:]]
    assert "node (1, 0): not the hash its leaves make (rewritten)" in problems
    assert (
        f"leaf 5 (stream {STREAM} seq 5): the record is not the one the tree holds (rewritten"
        " or replaced)"
    ) in problems
    assert "checkpoint 7: no signature by a known key" in problems

    code, lines = await verify(database_url, UNKNOWN_SIGNER.verifier().vkey())
    assert code == 1
    assert "checkpoint 5: no signature by a known key" in [line.strip() for line in lines]
