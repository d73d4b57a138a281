"""Known-answer vectors of opgate's own formats (``tests/vectors/*.json``): reading them, and the
one producer that needs a database, the bundle built from fixed records.

The vectors were produced once (``python -m tests.vectors.make``) from fixed keys and inputs and
committed. A test computes one side only, from the committed inputs, and compares it with the
committed bytes; so an encoding changed on both sides together (the writer and the verifier, the
PL/pgSQL and the Python) still fails, until someone regenerates the vectors on purpose and the
diff of ``tests/vectors/`` shows the change for review.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

import asyncpg

from proxy.observe.auditlog import bundle, integrator
from proxy.store import transparency as tstore
from proxy.transparency import note
from tests.support.paths import REPO

VECTORS = REPO / "tests" / "vectors"
REGENERATE = "python -m tests.vectors.make (only when an encoding changes on purpose)"


def load(name: str) -> dict[str, Any]:
    """The committed vector ``tests/vectors/<name>.json``."""
    loaded: dict[str, Any] = json.loads((VECTORS / f"{name}.json").read_text("utf-8"))
    return loaded


async def build_bundle(conn: asyncpg.Connection, inputs: dict[str, Any]) -> str:
    """The bundle (as ``opgate audit bundle`` writes it) of ``inputs``: its records written to a
    freshly migrated database at their fixed times, each hashed by PostgreSQL's own
    ``opgate_audit_hash``, integrated and signed with the fixed log key, cosigned by the fixed
    witness at a fixed time."""
    log = note.Signer.from_skey(inputs["log_skey"])
    witness = note.Signer.from_skey(inputs["witness_skey"])
    heads: dict[str, tuple[int, bytes]] = {}
    row = dict(inputs["operation"])
    row["response_body"] = base64.b64decode(row["response_body"])
    for column in ("expires_at", "settled_at"):
        row[column] = datetime.fromisoformat(row[column])
    await conn.execute(
        f"INSERT INTO operations ({', '.join(row)})"
        f" VALUES ({', '.join(f'${n}' for n in range(1, len(row) + 1))})",
        *row.values(),
    )  # no audit_event: its records are the fixed ones below
    async with conn.transaction():  # one transaction: the leaves in (stream, seq) order
        for item in inputs["records"]:
            seq, prev = heads.get(item["stream"], (0, bytes(32)))
            digest = await conn.fetchval(
                "INSERT INTO audit_log (stream, seq, at, kind, operation_id, record, prev_hash,"
                " hash) SELECT $1, $2, $3, $4, $5, $6::jsonb, $7,"
                " opgate_audit_hash($7, $1, $2, $3, $4, $5, $6::jsonb) RETURNING hash",
                item["stream"], seq + 1, datetime.fromisoformat(item["at"]), item["kind"],
                item["operation_id"], item["record"], prev,
            )  # fmt: skip
            heads[item["stream"]] = (seq + 1, bytes(digest))
    signed = await integrator.integrate(conn, log)
    assert signed is not None
    text = note.parse_note(signed.checkpoint).text
    line = witness.sign(text, timestamp=inputs["cosigned_at"]).line()
    await tstore.insert_cosignature(conn, signed.size, witness.name, line)
    document = await bundle.build(
        conn, inputs["operation_id"], log.verifier(), [witness.verifier().vkey()], 1
    )
    return bundle.dumps(document)
