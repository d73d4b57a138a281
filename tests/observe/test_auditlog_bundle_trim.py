"""Bundles that cannot be trimmed (proxy/observe/auditlog/bundle.py): an operation sent twice,
as its signed records say, is never read as sent once from a bundle whose author dropped a
middle record (with or without an unsigned window), or the stream's tail; and the witnesses'
quorum comes from the reviewer, never from the bundle."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest_asyncio

from proxy.observe.auditlog import bundle, integrator
from proxy.store import audit
from tests.support.bundles import MINTED_OPERATION, audit_in_process, mint_bundle
from tests.support.transparency import LOG_SIGNER, WITNESS_SIGNER

OPERATION = "op_sent_twice"
VKEY = LOG_SIGNER.verifier().vkey()
EVENTS = (
    ("created", {"approved_by": "alice", "action": "refund.create", "provider": "fault"}),
    ("claimed", {"attempt": 1}),
    ("unknown", {"attempt": 1, "outcome": "unknown:timeout"}),
    ("claimed", {"attempt": 2}),
    ("confirmed", {"provider_status": 200, "object_id": "re_1"}),
)


@pytest_asyncio.fixture(loop_scope="session")
async def made(database_url: str) -> AsyncIterator[dict[str, Any]]:
    """The bundle of an operation claimed twice (an unknown outcome, then a re-send),
    integrated and signed."""
    conn = await asyncpg.connect(database_url)
    try:
        texts = [
            json.dumps({"event": event, "operation_id": OPERATION, "detail": detail})
            for event, detail in EVENTS
        ]
        await audit.append_texts(conn, OPERATION, "transition", texts)
        assert await integrator.integrate(conn, LOG_SIGNER) is not None
        yield await bundle.build(conn, OPERATION, LOG_SIGNER.verifier(), [], 0)
    finally:
        await conn.close()


def sends(report: bundle.BundleReport) -> list[str]:
    return [line for found in report.operations for line in found.lines if "sent" in line]


async def test_the_whole_bundle_says_sent_twice(made: dict[str, Any]) -> None:
    """The untrimmed bundle verifies and says what the signed log says: two sends."""
    report = bundle.verify(made, VKEY)
    assert report.breaks == []
    assert sends(report)[0].startswith("sent 2 times (2 attempts)")


async def test_a_middle_record_dropped_under_a_window_is_refused(made: dict[str, Any]) -> None:
    """The second claim dropped and an unsigned ``since`` set: still a gap in the stream."""
    trimmed = dict(made, since="1970-01-01T00:00:00+00:00")
    trimmed["records"] = [r for r in made["records"] if r["seq"] != 4]
    report = bundle.verify(trimmed, VKEY)
    assert any(f"stream {OPERATION}: record 4 is missing" in b for b in report.breaks)


async def test_a_dropped_tail_is_refused(made: dict[str, Any]) -> None:
    """The second claim and the confirmation dropped from the end: the signed head says the
    stream goes on to seq 5."""
    trimmed = dict(made, records=[r for r in made["records"] if r["seq"] <= 3])
    report = bundle.verify(trimmed, VKEY)
    assert any(f"stream {OPERATION}: records 4-5 are missing" in b for b in report.breaks)


async def test_the_quorum_is_the_reviewers(made: dict[str, Any]) -> None:
    """A witness named without ``--quorum`` means that witness must have cosigned: the
    bundle's own ``"quorum": 0`` does not lower it."""
    witness = WITNESS_SIGNER.verifier().vkey()
    report = bundle.verify(dict(made, quorum=0), VKEY, [witness])
    assert report.breaks == ["checkpoint: cosigned by 0 of the 1 witnesses given, 1 needed"]


async def test_a_trimmed_bundle_fails_at_the_command_line(tmp_path: Path) -> None:
    """``verify-bundle`` of a bundle whose tail (the second claim and the confirmation) was
    dropped: exit 1, BROKEN, and the summary never says "sent once"."""
    minted = mint_bundle()
    minted["records"] = [r for r in minted["records"] if r["seq"] <= 3]
    path = tmp_path / "trimmed.json"
    path.write_text(json.dumps(minted))
    code, out, _ = await audit_in_process("verify-bundle", str(path), "--log-key", VKEY)
    assert code == 1, out
    assert f"stream {MINTED_OPERATION}: records 4-6 are missing" in out
    assert "sent once" not in out


async def test_a_window_holds_each_of_its_operations_whole(database_url: str) -> None:
    """A window that starts after the operation's first records still carries its whole stream
    and the proof of its end: it verifies and says what the log says, sent twice."""
    conn = await asyncpg.connect(database_url)
    try:
        texts = [
            json.dumps({"event": event, "operation_id": OPERATION, "detail": detail})
            for event, detail in EVENTS
        ]
        await audit.append_texts(conn, OPERATION, "transition", texts[:3])
        since = await conn.fetchval("SELECT clock_timestamp()")
        await audit.append_texts(conn, OPERATION, "transition", texts[3:])
        until = await conn.fetchval("SELECT clock_timestamp() + interval '1 minute'")
        assert await integrator.integrate(conn, LOG_SIGNER) is not None
        made = await bundle.build(conn, None, LOG_SIGNER.verifier(), [], 0, (since, until))
    finally:
        await conn.close()
    assert sorted(r["seq"] for r in made["records"] if r["stream"] == OPERATION) == [1, 2, 3, 4, 5]
    report = bundle.verify(made, VKEY)
    assert report.breaks == []
    assert sends(report)[0].startswith("sent 2 times (2 attempts)")
