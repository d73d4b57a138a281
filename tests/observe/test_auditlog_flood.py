"""Unauthenticated traffic cannot fill the primary's disk: recorded paths are bounded and
repeated pre-authentication denials are counted per source, against real PostgreSQL and a real
opgate."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from typing import Any

import asyncpg
from yarl import URL

from tests.support.auditlog import flushed, get, stored_requests, verified_ok
from tests.support.opgate import AGENT_TOKEN, Opgate

FLOOD = 2_000
PATH_BYTES = 8_000  # under aiohttp's request-line limit (8,190 bytes), which answers 400 itself
CONCURRENCY = 16
GROWTH_LIMIT = 2 * 1024 * 1024


def random_path(size: int) -> str:
    """``size`` bytes of unreserved characters, incompressible (PostgreSQL compresses TOAST)."""
    return "/" + secrets.token_urlsafe(size)[: size - 1]


async def database_size(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        size: int = await conn.fetchval("SELECT pg_database_size(current_database())")
        return size
    finally:
        await conn.close()


async def _flood(gate: Opgate, paths: list[str]) -> list[int]:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(path: str) -> int:
        async with limit, gate.http.get(URL(gate.agent_url + path, encoded=True)) as response:
            await response.read()
            return response.status

    return await asyncio.gather(*(one(p) for p in paths))


async def test_an_unauthenticated_flood_grows_the_database_by_under_2_mb(
    fault_gate: Opgate, database_url: str
) -> None:
    """2,000 unauthenticated requests with random 8 kB paths, routed and unrouted, add less
    than 2 MB to the database once the writer has stored them, and every one is counted."""
    await flushed(fault_gate)
    before = await database_size(database_url)
    paths = [random_path(PATH_BYTES) for _ in range(FLOOD // 2)]
    paths += ["/fault/v1" + random_path(PATH_BYTES - 9) for _ in range(FLOOD // 2)]
    statuses = await _flood(fault_gate, paths)
    assert sorted(set(statuses)) == [401, 404]
    await flushed(fault_gate)
    grown = await database_size(database_url) - before
    assert grown < GROWTH_LIMIT, f"the database grew by {grown} bytes"
    stored = await stored_requests(database_url)
    individual = [r for r in stored if r.get("request_id")]
    counted = sum(r["count"] for r in stored if r.get("record_type") == "denials")
    assert len(individual) + counted == FLOOD
    assert {r["reason"] for r in stored if r.get("reason")} == {"no_route", "agent_unauthenticated"}
    assert await verified_ok(database_url)


async def test_a_long_path_is_recorded_cut_with_the_whole_paths_digest(
    fault_gate: Opgate, database_url: str
) -> None:
    """A path longer than 512 bytes is recorded as its first 512 bytes plus the SHA-256 of the
    whole raw path; a short path is recorded whole, without a digest."""
    long_path = "/fault/v1/charges/" + "a" * 3_000
    assert await get(fault_gate, long_path, AGENT_TOKEN) == 200
    assert await get(fault_gate, "/fault/v1/charges/ch_1", AGENT_TOKEN) == 200
    await flushed(fault_gate)
    long_record, short_record = [r for r in await stored_requests(database_url) if r.get("path")]
    assert long_record["path"] == long_path[:512]
    assert long_record["path_sha256"] == hashlib.sha256(long_path.encode()).hexdigest()
    assert (short_record["path"], short_record["path_sha256"]) == ("/fault/v1/charges/ch_1", None)


async def test_repeated_denials_from_one_source_are_one_counted_record(
    fault_gate: Opgate, database_url: str
) -> None:
    """The first unauthenticated denial from a source is stored whole; the repeats in the same
    window become one `denials` record with their count and first and last path digests."""
    paths = [f"/nowhere/{i}" for i in range(5)]
    for path in paths:
        assert await get(fault_gate, path) == 404
    await flushed(fault_gate)
    stored = await stored_requests(database_url)
    [first] = [r for r in stored if r.get("request_id")]
    assert (first["path"], first["reason"], first["source"]) == (paths[0], "no_route", "127.0.0.1")
    [denials] = [r for r in stored if r.get("record_type") == "denials"]
    assert _subset(denials) == {
        "listener": "agent",
        "source": "127.0.0.1",
        "decision": "deny",
        "reason": "no_route",
        "response_status": 404,
        "count": 4,
        "first_path": paths[1],
        "first_path_sha256": _sha256(paths[1]),
        "last_path_sha256": _sha256(paths[4]),
    }
    assert denials["first_time"] <= denials["last_time"]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _subset(record: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "listener",
        "source",
        "decision",
        "reason",
        "response_status",
        "count",
        "first_path",
        "first_path_sha256",
        "last_path_sha256",
    )
    return {k: record.get(k) for k in keys}


async def test_authenticated_denials_are_never_aggregated(
    fault_gate: Opgate, database_url: str
) -> None:
    """An authenticated agent's refusals are each stored whole: only pre-authentication
    denials (no agent) are counted."""
    for _ in range(3):
        status, _, body = await fault_gate.send("/fault/v1/refunds", data="amount=1")
        assert status == 400, body
    await flushed(fault_gate)
    stored = await stored_requests(database_url)
    assert [r["agent_id"] for r in stored if r.get("request_id")] == ["agent-a"] * 3
    assert not [r for r in stored if r.get("record_type") == "denials"]
