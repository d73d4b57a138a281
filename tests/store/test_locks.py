"""opgate's advisory locks (proxy/store/locks.py) on a real PostgreSQL, two sessions racing: a
kind is a key space of its own, one key serialises "lock, count, insert", several keys are
taken in key order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import asyncpg
import pytest_asyncio

from proxy.store import locks
from proxy.store.locks import LockKey, LockKind, lock_count_insert
from tests.support.polling import until


@dataclass
class Sessions:
    """Two sessions racing on one fresh database, and a third that watches pg_locks."""

    first: asyncpg.Connection
    second: asyncpg.Connection
    watcher: asyncpg.Connection


@pytest_asyncio.fixture(loop_scope="session")
async def sessions(database_url: str) -> AsyncIterator[Sessions]:
    """The sessions, and a table the "insert" writes to."""
    opened = Sessions(*[await asyncpg.connect(database_url) for _ in range(3)])
    try:
        await opened.first.execute("CREATE TABLE made (who text NOT NULL)")
        yield opened
    finally:
        for conn in (opened.first, opened.second, opened.watcher):
            await conn.close()


async def _waiting(conn: asyncpg.Connection, pid: int) -> list[tuple[int, int]]:
    """The two-int advisory keys session ``pid`` waits for."""
    rows = await conn.fetch(
        "SELECT classid::bigint AS kind, objid::bigint AS key FROM pg_locks"
        " WHERE locktype = 'advisory' AND objsubid = 2 AND NOT granted AND pid = $1",
        pid,
    )
    return [(r["kind"], r["key"]) for r in rows]


async def _waiting_previous_release(conn: asyncpg.Connection, pid: int) -> list[tuple[int, int]]:
    """The one-bigint advisory keys (the previous release's) session ``pid`` waits for."""
    rows = await conn.fetch(
        "SELECT classid::bigint AS high, objid::bigint AS low FROM pg_locks"
        " WHERE locktype = 'advisory' AND objsubid = 1 AND NOT granted AND pid = $1",
        pid,
    )
    return [(r["high"], r["low"]) for r in rows]


async def _previous_release_oids(conn: asyncpg.Connection, name: str) -> tuple[int, int]:
    """The previous release's key of ``name`` as pg_locks shows it (high, low 32 bits)."""
    key: int = await conn.fetchval("SELECT hashtextextended($1, 0)", name)
    return (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF


async def _held(conn: asyncpg.Connection, pid: int) -> list[tuple[int, int]]:
    rows = await conn.fetch(
        "SELECT classid::bigint AS kind, objid::bigint AS key FROM pg_locks"
        " WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND pid = $1",
        pid,
    )
    return [(r["kind"], r["key"]) for r in rows]


def _as_oids(key: LockKey) -> tuple[int, int]:
    """A key as pg_locks shows it (two unsigned oids)."""
    kind, number = key.ints
    return kind & 0xFFFFFFFF, number & 0xFFFFFFFF


def test_a_key_is_its_kind_then_its_names_hash() -> None:
    """The key's numbers are fixed values (a release that changed them would not take turns
    with the release before): every kind's number, and the hash of one name."""
    assert {k.name: k.value for k in LockKind} == {
        "BUDGET": 1,
        "OPEN_MANDATE": 2,
        "PROPOSALS": 3,
        "AUDIT_CHECKPOINT": 4,
        "TRANSPARENCY": 5,
        "X402_LIMIT": 6,
    }
    assert LockKey(LockKind.BUDGET, "x").ints == (1, 762385986)
    assert LockKey(LockKind.OPEN_MANDATE, "x").ints == (2, 762385986)
    # two names whose hashes are equal share the lock: they take turns where they need not
    assert LockKey(LockKind.BUDGET, "n18622").ints == LockKey(LockKind.BUDGET, "n41826").ints


async def test_two_kinds_with_the_same_name_do_not_block_each_other(sessions: Sessions) -> None:
    """One session holds each kind's lock of the name "same" in turn: the other takes every
    other kind's lock of that name at once, and not that kind's."""
    first, second = sessions.first, sessions.second
    for held in LockKind:
        async with first.transaction():
            await locks.lock(first, [LockKey(held, "same")])
            for other in LockKind:
                async with second.transaction():
                    taken = await locks.try_lock(second, LockKey(other, "same"))
                assert taken is (other is not held), (held, other)


async def test_the_same_key_serialises_lock_count_insert(sessions: Sessions) -> None:
    """Two sessions may each insert if nothing is there yet: the second waits for the first's
    lock, then counts the first's row, and is refused; one row in all."""
    first, second = sessions.first, sessions.second
    key = LockKey(LockKind.PROPOSALS, "tenant-1")
    counted = asyncio.Event()
    go_on = asyncio.Event()

    async def count(conn: asyncpg.Connection) -> int:
        n: int = await conn.fetchval("SELECT count(*) FROM made")
        if conn is first:
            counted.set()
            await go_on.wait()  # the lock held until the second session waits for it
        return n

    def insert(who: str) -> Callable[[asyncpg.Connection], Awaitable[str]]:
        return lambda conn: conn.execute("INSERT INTO made VALUES ($1)", who)

    def nothing_yet(n: int) -> bool:
        return n == 0

    one = asyncio.create_task(lock_count_insert(first, [key], count, nothing_yet, insert("one")))
    await counted.wait()
    other = asyncio.create_task(
        lock_count_insert(second, [key], count, nothing_yet, insert("other"))
    )
    pid = second.get_server_pid()
    waits = await until(
        lambda: _waiting_previous_release(sessions.watcher, pid), "the second waits for the lock"
    )
    assert waits == [await _previous_release_oids(sessions.watcher, "proposals:tenant-1")]
    go_on.set()
    made_one, made_other = await one, await other
    assert (made_one.admitted, made_one.counted) == (True, 0)
    assert (made_other.admitted, made_other.counted, made_other.inserted) == (False, 1, None)
    assert await first.fetchval("SELECT array_agg(who) FROM made") == ["one"]


async def test_several_locks_are_taken_in_key_order(sessions: Sessions) -> None:
    """Keys given in any order are taken in key order (kind, then hash): with the greater key
    held elsewhere, the session holds the lesser one while it waits for the greater. Two
    claims on the same budgets therefore never wait on each other crosswise."""
    lesser, greater = sorted(
        [LockKey(LockKind.BUDGET, "a"), LockKey(LockKind.BUDGET, "b")], key=lambda k: k.ints
    )
    holder, second = sessions.first, sessions.second
    await holder.execute("SELECT pg_advisory_lock($1, $2)", *greater.ints)

    async def take() -> None:
        async with second.transaction():
            await locks.lock(second, [greater, lesser, greater])

    taking = asyncio.create_task(take())
    pid = second.get_server_pid()
    waits = await until(lambda: _waiting(sessions.watcher, pid), "the session waits")
    assert waits == [_as_oids(greater)]
    assert await _held(sessions.watcher, pid) == [_as_oids(lesser)]
    await holder.execute("SELECT pg_advisory_unlock($1, $2)", *greater.ints)
    await taking
    assert await _held(sessions.watcher, pid) == []  # released with the transaction


async def test_a_refusal_rolls_back_what_the_count_wrote(sessions: Sessions) -> None:
    """What ``count`` wrote (a nonce consumed) is undone when ``admit`` refuses the count."""
    first = sessions.first

    async def count(conn: asyncpg.Connection) -> int:
        await conn.execute("INSERT INTO made VALUES ('counted')")
        return 1

    async def insert(conn: asyncpg.Connection) -> str:
        raise AssertionError("not admitted: never inserted")

    made = await lock_count_insert(
        first, [LockKey(LockKind.OPEN_MANDATE, "d")], count, lambda n: False, insert
    )
    assert (made.admitted, made.counted, made.inserted) == (False, 1, None)
    assert await first.fetchval("SELECT count(*) FROM made") == 0
    assert not first.is_in_transaction()


async def test_a_process_of_the_previous_release_and_this_one_take_turns(
    sessions: Sessions,
) -> None:
    """During a rolling deploy, a process of the release before the two-int key space holds its
    lock of a budget, an open mandate or a tenant's proposals: this release's lock of the same
    waits for it (else one claim of each could pass a limit together); a kind the previous
    release locked by row (the checkpoint) has no such lock."""
    first, second = sessions.first, sessions.second
    cases = {
        LockKey(LockKind.BUDGET, "budget:6:stripe;"): "budget:6:stripe;",
        LockKey(LockKind.OPEN_MANDATE, "abc123"): "ap2-open:abc123",
        LockKey(LockKind.PROPOSALS, "tenant-1"): "proposals:tenant-1",
    }
    assert locks.previous_release_names([LockKey(LockKind.AUDIT_CHECKPOINT, "")]) == []
    for key, previous in cases.items():
        async with first.transaction():  # the previous release's process, as it locked
            await first.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", previous)
            taking = asyncio.create_task(_lock_in_transaction(second, key))
            pid = second.get_server_pid()
            waits = await until(
                lambda pid=pid: _waiting_previous_release(sessions.watcher, pid), f"{key} waits"
            )
            assert waits == [await _previous_release_oids(sessions.watcher, previous)]
            assert not taking.done()
        await taking  # taken once the previous release's transaction ended


async def _lock_in_transaction(conn: asyncpg.Connection, key: LockKey) -> None:
    async with conn.transaction():
        await locks.lock(conn, [key])
