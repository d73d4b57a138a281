"""The transparency log's answers to a reviewer, as documents: the latest checkpoint, a
record's inclusion proof, a consistency proof. ``opgate audit checkpoint|prove|consistency``
print them; the operations listener serves them (``/v1/audit/...``). Hashes are base64, as in
the checkpoints (docs/audit.md, *Transparency log*).
"""

from __future__ import annotations

import base64
from typing import Any

import asyncpg

from proxy.observe.auditlog import integrator
from proxy.store import transparency as tstore


class NotProvable(LookupError):
    """The record or the sizes asked for are in no checkpoint (yet)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def parse_record(text: str) -> tuple[str, int]:
    """``STREAM:SEQ`` (a stream may hold ':' itself: requests/host:1:812)."""
    stream, _, seq = text.rpartition(":")
    if not stream or not seq.isdigit():
        raise NotProvable("a record is named STREAM:SEQ")
    return stream, int(seq)


async def signed_checkpoint(conn: asyncpg.Connection, size: int | None = None) -> str:
    """The checkpoint (latest, or of ``size``) with every cosignature kept for it."""
    if size is None:
        latest = await tstore.latest_checkpoint(conn)
        if latest is None:
            raise NotProvable("no checkpoint yet (is transparency_key configured?)")
        size = int(latest["tree_size"])
    signed = await tstore.checkpoint_at(conn, size)
    if signed is None:
        raise NotProvable(f"no checkpoint of size {size}")
    return str(signed["note"]) + "".join(signed["cosignatures"])


async def inclusion_document(
    conn: asyncpg.Connection, stream: str, seq: int, size: int | None = None
) -> dict[str, Any]:
    leaf = await tstore.leaf(conn, stream, seq)
    checkpoint = await signed_checkpoint(conn, size)
    tree_size = int(checkpoint.split("\n")[1])
    if leaf is None or leaf["leaf_index"] >= tree_size:
        raise NotProvable(f"{stream}:{seq} is not in a checkpoint yet")
    record_hash = bytes(leaf["record_hash"])
    proof = await integrator.inclusion(conn, leaf["leaf_index"], tree_size)
    return {
        "stream": stream,
        "seq": seq,
        "record_hash": record_hash.hex(),
        "leaf_index": leaf["leaf_index"],
        "leaf_hash": _b64(integrator.record_leaf(record_hash)),
        "tree_size": tree_size,
        "inclusion": [_b64(p) for p in proof],
        "checkpoint": checkpoint,
    }


async def consistency_document(conn: asyncpg.Connection, old: int, new: int) -> dict[str, Any]:
    if old > new:
        raise NotProvable("OLD must not exceed NEW")
    old_checkpoint = await signed_checkpoint(conn, old) if old else None
    new_checkpoint = await signed_checkpoint(conn, new)
    proof = await integrator.consistency(conn, old, new)
    return {
        "old": {"tree_size": old, "checkpoint": old_checkpoint},
        "new": {"tree_size": new, "checkpoint": new_checkpoint},
        "consistency": [_b64(p) for p in proof],
    }
