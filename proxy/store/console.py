"""The web console's statements (queries.sql ``console_*``): its sessions (migration 0006) and
what its pages read. Each runs on the store's connections (``Store.run``), so its errors are
translated as every other statement's: a store that cannot be reached or used is
``StoreUnavailable``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from proxy.store import audit, queries
from proxy.store.operation import Operation
from proxy.store.store import Store, operation_from_record


@dataclass(frozen=True)
class StoredSession:
    """A live session's row: the role (``console.sessions.Role``'s value), who signed in, and
    the session's CSRF token."""

    role: str
    identity: str
    csrf_token: str


@dataclass(frozen=True)
class AuditRow:
    """One audit record naming an operation, as the console's timeline shows it (``record``:
    the stored JSON text)."""

    stream: str
    seq: int
    at: datetime
    kind: str
    record: str


@dataclass(frozen=True)
class Waiting:
    """The console's dashboard line as the database has it."""

    escalations: int
    oldest_escalation_seconds: float | None
    pending_proposals: int
    last_checkpoint_at: datetime | None


class ConsoleStore:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def create_session(
        self, digest: str, role: str, identity: str, csrf_token: str, seconds: float
    ) -> None:
        """A new session under the SHA-256 of its cookie (``digest``), for ``seconds``;
        expired sessions are cleared in the same statement."""
        await self._store.run(
            lambda conn: queries.execute(
                conn,
                "console_session_create",
                digest=digest,
                role=role,
                identity=identity,
                csrf_token=csrf_token,
                seconds=seconds,
            )
        )

    async def session(self, digest: str) -> StoredSession | None:
        """The live session whose cookie hashes to ``digest`` (None once expired)."""
        row = await self._store.run(
            lambda conn: queries.fetchrow(conn, "console_session_load", digest=digest)
        )
        if row is None:
            return None
        return StoredSession(row["role"], row["identity"], row["csrf_token"])

    async def delete_session(self, digest: str) -> None:
        await self._store.run(
            lambda conn: queries.execute(conn, "console_session_delete", digest=digest)
        )

    async def operations(
        self,
        statuses: list[str],
        tenant: str | None,
        provider: str | None,
        older_than_seconds: float | None,
        limit: int,
    ) -> list[Operation]:
        """Operations in ``statuses``, of the tenant and provider (None: any), created at least
        ``older_than_seconds`` ago (None: any age), newest first."""
        records = await self._store.run(
            lambda conn: queries.fetch(
                conn,
                "console_operations",
                statuses=statuses,
                tenant=tenant,
                provider=provider,
                older_than_seconds=older_than_seconds,
                limit=limit,
            )
        )
        return [operation_from_record(r) for r in records]

    async def escalated(self, limit: int) -> list[Operation]:
        """The escalation queue: operations waiting on a human, oldest escalation first."""
        return await self._store.escalated(None, limit)

    async def audit_records(self, operation_id: str) -> list[AuditRow]:
        """Every audit record naming the operation, in order."""
        rows = await self._store.run(lambda conn: audit.operation_records(conn, operation_id))
        return [AuditRow(r["stream"], r["seq"], r["at"], r["kind"], r["record"]) for r in rows]

    async def notifications(self, operation_id: str) -> list[dict[str, Any]]:
        """One operation's escalation notices and their delivery."""
        rows = await self._store.run(
            lambda conn: queries.fetch(conn, "console_notifications", operation_id=operation_id)
        )
        return [dict(r) for r in rows]

    async def dashboard(self) -> Waiting:
        """What waits on the humans now: escalations (and the oldest's age), pending proposals,
        and when the newest checkpoint was signed."""
        row = await self._store.run(lambda conn: queries.fetchrow(conn, "console_dashboard"))
        assert row is not None  # one row, always
        return Waiting(
            row["escalations"],
            row["oldest_escalation_seconds"],
            row["pending_proposals"],
            row["last_checkpoint_at"],
        )

    async def last_checkpoint(self) -> dict[str, Any] | None:
        """The newest checkpoint: id, when, by whom, how many heads it signed, its mac."""
        row = await self._store.run(lambda conn: queries.fetchrow(conn, "console_last_checkpoint"))
        return None if row is None else dict(row)
