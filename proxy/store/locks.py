"""opgate's advisory locks, in one key space, and the one transaction that uses them to count
before it inserts.

A lock's key is PostgreSQL's two-int form, ``pg_advisory_xact_lock(int4, int4)``: the first
int is the lock's kind (``LockKind``: what it serialises), the second its name's hash. Two
kinds can never take the same lock whatever their names spell; a name needs no prefix. The
one-bigint form (the migrations' lock, proxy/store/migrate.py) is another space in PostgreSQL
(``pg_locks.objsubid`` 1, not 2): no key here can meet it.

Two names of one kind whose hashes are equal (32 bits) share a lock: they take turns where
they need not, never the other way round. Several locks are taken in the order of their keys
(kind, hash), each once, so two transactions never wait on each other crosswise, even where
two names share a hash.

``lock_count_insert`` is "may one more be made?" done once: in one transaction, the locks,
then the count, then (only if ``admit`` accepts the count) the insert or claim; a refusal rolls
the transaction back. Whatever counts under the same lock sees every insert made before it, in
any process, and none between its count and its own insert.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Generic, TypeVar

import asyncpg

from proxy.store import queries

C = TypeVar("C")
R = TypeVar("R")


class LockKind(IntEnum):
    """What a lock serialises: the first int of its key. A new kind is one line here, with a
    number never used before (a number is never reused: a process of the release before would
    read it as the old kind)."""

    BUDGET = 1  # claims on one spend budget (name: proxy/policy/budgets.py BudgetKey.lock_name)
    OPEN_MANDATE = 2  # uses of one AP2 open mandate (name: its identity digest)
    PROPOSALS = 3  # proposals of one tenant waiting for a human (name: the tenant)
    AUDIT_CHECKPOINT = 4  # the audit log's checkpoint writers (name: "")
    TRANSPARENCY = 5  # the Merkle tree's integrator (name: "")
    X402_LIMIT = 6  # payments under one x402 budget or rate limit (name: PaymentLimitKey.lock_name)


@dataclass(frozen=True)
class LockKey:
    """One lock: its kind and its name within the kind."""

    kind: LockKind
    name: str

    @property
    def ints(self) -> tuple[int, int]:
        """The two int4 of the key: the kind, then the first four bytes of the name's SHA-256
        as a signed integer (a hash of opgate's own: PostgreSQL's ``hashtext`` is not
        documented to stay the same between its releases)."""
        digest = hashlib.sha256(self.name.encode("utf-8")).digest()
        return int(self.kind), int.from_bytes(digest[:4], "big", signed=True)


# The name each kind's lock had in the release before this key space (one bigint,
# ``hashtextextended(name, 0)``): taken as well, first, so that during a rolling deploy a
# process of that release and one of this take turns on a budget, a mandate or a tenant's
# proposals instead of each holding a lock the other never asks for (one claim from each could
# otherwise pass a limit together). The audit checkpoint and the integrator need none: they
# also lock a row. To be dropped in the release after, once no process of the old one runs.
_PREVIOUS_RELEASE_PREFIX = {
    LockKind.BUDGET: "",  # BudgetKey.lock_name spelled the whole name ("budget:...")
    LockKind.OPEN_MANDATE: "ap2-open:",
    LockKind.PROPOSALS: "proposals:",
}


def previous_release_names(keys: Iterable[LockKey]) -> list[str]:
    """The previous release's lock names of ``keys``, each once, in the order it took them
    (by name; it never took two kinds in one transaction)."""
    names = {
        _PREVIOUS_RELEASE_PREFIX[k.kind] + k.name
        for k in keys
        if k.kind in _PREVIOUS_RELEASE_PREFIX
    }
    return sorted(names)


async def lock(conn: asyncpg.Connection, keys: Iterable[LockKey]) -> None:
    """Wait for each lock of ``keys`` (each key once, in key order), held until the caller's
    transaction ends; before them, the previous release's locks of the same keys, in its
    order (so no process of either release waits crosswise on one of the other)."""
    keys = list(keys)
    for name in previous_release_names(keys):
        await queries.execute(conn, "previous_release_lock", lock_name=name)
    for kind, key in sorted({k.ints for k in keys}):
        await queries.execute(conn, "advisory_lock", kind=kind, key=key)


async def try_lock(conn: asyncpg.Connection, key: LockKey) -> bool:
    """The lock if no other transaction holds it (held until the caller's ends); else False,
    at once."""
    kind, number = key.ints
    locked: bool = await queries.fetchval(conn, "advisory_try_lock", kind=kind, key=number)
    return locked


@dataclass(frozen=True)
class Counted(Generic[C, R]):
    """What ``lock_count_insert`` counted under its locks, whether ``admit`` accepted it, and
    what the insert returned (None where it did not run)."""

    counted: C
    admitted: bool
    inserted: R | None


class _NotAdmitted(Exception):
    """Leaves the transaction (rolled back) with the count that was refused."""

    def __init__(self, counted: Any) -> None:
        super().__init__("not admitted")
        self.counted = counted


async def lock_count_insert(
    conn: asyncpg.Connection,
    keys: Iterable[LockKey],
    count: Callable[[asyncpg.Connection], Awaitable[C]],
    admit: Callable[[C], bool],
    insert: Callable[[asyncpg.Connection], Awaitable[R]],
) -> Counted[C, R]:
    """In one transaction on ``conn``: the locks of ``keys`` (``lock``), then ``count``, then
    ``insert`` if ``admit`` (pure: the caller's decision) accepts what was counted. A refusal
    rolls back whatever ``count`` wrote; an exception raised by ``count`` or ``insert`` too,
    and goes on to the caller."""
    try:
        async with conn.transaction():
            await lock(conn, keys)
            counted = await count(conn)
            if not admit(counted):
                raise _NotAdmitted(counted)
            inserted = await insert(conn)
    except _NotAdmitted as refused:
        not_admitted: C = refused.counted
        return Counted(not_admitted, False, None)
    return Counted(counted, True, inserted)
