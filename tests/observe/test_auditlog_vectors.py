"""Known answers for the audit log's formats (tests/vectors/): the record hash, the HMAC
checkpoint and the offline bundle, each recomputed from committed inputs by one side only."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg
import pytest

from proxy.observe.auditlog import bundle
from proxy.observe.auditlog.chain import (
    Checkpoint,
    check_checkpoint_chain,
    checkpoint_mac,
    heads_from_json,
    heads_json,
    record_hash,
)
from tests.support.vectors import REGENERATE, VECTORS, build_bundle, load

RECORDS = load("audit_record")["cases"]
CHECKPOINTS = load("audit_checkpoint")


def _inputs(case: dict[str, Any]) -> tuple[Any, ...]:
    return (
        bytes.fromhex(case["prev_hash"]),
        case["stream"],
        case["seq"],
        datetime.fromisoformat(case["at"]),
        case["kind"],
        case["operation_id"],
        case["record"],
    )


@pytest.mark.parametrize("case", RECORDS, ids=[c["name"] for c in RECORDS])
def test_the_verifier_computes_the_committed_record_hash(case: dict[str, Any]) -> None:
    """chain.record_hash, the verifier's encoding, gives each committed record its committed
    hash."""
    assert record_hash(*_inputs(case)).hex() == case["hash"], REGENERATE


async def test_postgresql_computes_the_committed_record_hashes(database_url: str) -> None:
    """opgate_audit_hash, the writer's encoding in PL/pgSQL, gives each committed record (already
    in jsonb's own text form) its committed hash."""
    conn = await asyncpg.connect(database_url)
    try:
        for case in RECORDS:
            prev, stream, seq, at, kind, operation_id, record = _inputs(case)
            assert await conn.fetchval("SELECT $1::jsonb::text", record) == record
            digest = await conn.fetchval(
                "SELECT opgate_audit_hash($1, $2, $3, $4, $5, $6, $7::jsonb)",
                prev, stream, seq, at, kind, operation_id, record,
            )  # fmt: skip
            assert bytes(digest).hex() == case["hash"], (case["name"], REGENERATE)
    finally:
        await conn.close()


def test_the_committed_hmac_checkpoints_recompute() -> None:
    """Each checkpoint's heads, read and written again, are the committed signed JSON, and its
    MAC under the committed key is the committed one, chained onto the one before."""
    key = bytes.fromhex(CHECKPOINTS["key"])
    chain = []
    for n, cp in enumerate(CHECKPOINTS["checkpoints"], start=1):
        at = datetime.fromisoformat(cp["at"])
        listed = heads_from_json(cp["heads"])
        assert heads_json(listed) == cp["heads"], REGENERATE
        mac = checkpoint_mac(key, bytes.fromhex(cp["prev_mac"]), at, cp["writer"], cp["heads"])
        assert mac.hex() == cp["mac"], REGENERATE
        chain.append(Checkpoint(n, at, cp["writer"], listed, bytes.fromhex(cp["prev_mac"]), mac))
    assert check_checkpoint_chain(key, chain) is None


async def test_the_bundle_of_the_committed_records_is_the_committed_bundle(
    database_url: str,
) -> None:
    """The committed records, written to a migrated database at their fixed times, integrated
    and signed with the fixed keys, bundle into exactly the committed bytes."""
    conn = await asyncpg.connect(database_url)
    try:
        made = await build_bundle(conn, load("bundle_inputs"))
    finally:
        await conn.close()
    committed = (VECTORS / "bundle.json").read_text("utf-8")
    assert made == committed, REGENERATE


def test_the_committed_bundle_verifies() -> None:
    """verify-bundle, given only the fixed log and witness keys, proves every record of the
    committed bundle and reads the operation's story from it, with nothing unproven."""
    inputs = load("bundle_inputs")
    report = bundle.verify(load("bundle"), [inputs["log_vkey"]], [inputs["witness_vkey"]])
    assert (report.breaks, report.unproven, report.notes) == ([], [], [])
    assert (report.proven, report.tree_size, report.cosigners) == (5, 6, ["witness.vectors"])
    [operation] = report.operations
    assert operation.lines[0].startswith("approved by alice (ticket-42)")
    assert "answered confirmed: provider status 200, object pi_v1" in operation.lines
