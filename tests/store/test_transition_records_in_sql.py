"""Migration 0028 (an operation's records hashed in one SQL expression, a settle's two records in
one INSERT): the records are byte for byte those of the function before it, on any input, and
chains written before the migration go on and verify after it."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.observe.auditlog.chain import record_hash
from proxy.observe.auditlog.verify import verify
from proxy.store import queries
from proxy.store.migrate import migrate
from tests.support.auditlog import AUDIT_KEY, BEGINNING, END, run_cli
from tests.support.postgres import database_at_migration

BEFORE = "opgate_audit_operation"  # 0020's function as 0022 left it: kept, unused, by 0028
AFTER = "opgate_audit_operation_v2"
_RECORDS = (
    "SELECT seq, at, kind, operation_id, record::text AS record, prev_hash, hash"
    " FROM audit_log WHERE stream = $1 ORDER BY seq"
)
_HEAD = "SELECT status, audit_seq, audit_hash FROM operations WHERE operation_id = $1"

# Any text PostgreSQL's text and jsonb store (no NUL, no lone surrogate: opgate replaces those
# before they reach the database, proxy/observe/auditlog/storable.py).
texts = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=24)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(texts, json_values, max_size=6)


@dataclass(frozen=True)
class Transition:
    """One UPDATE of the operation row: the status it moves to and the event (and request
    record) the statement names."""

    status: str
    event: str
    actor: str | None
    detail: dict[str, Any] | None
    request: dict[str, Any] | None

    def audit_event(self) -> str:
        named: dict[str, Any] = {"event": self.event, "actor": self.actor}
        if self.detail is not None:
            named["detail"] = self.detail
        return json.dumps(named)


@dataclass(frozen=True)
class Case:
    operation_id: str
    instance_id: str | None
    policy_version: str | None
    approval: dict[str, Any]
    transitions: list[Transition]


transitions = st.builds(
    Transition,
    status=st.sampled_from(["created", "dispatched"]),  # a settle's status needs settled_at
    event=texts,
    actor=st.none() | texts,
    detail=st.none() | json_objects,
    request=st.none() | json_objects,
)
cases = st.builds(
    Case,
    operation_id=texts.filter(bool),
    instance_id=st.none() | texts,
    policy_version=st.none() | texts,
    approval=st.fixed_dictionaries(
        {
            "tenant": texts,
            "agent_id": texts,
            "provider": texts,
            "action": texts,
            "method": texts,
            "path": texts,
            "path_params": json_objects.map(json.dumps),
            "amount": st.none() | st.integers(-(2**63), 2**63 - 1),
            "currency": st.none() | texts,
            "params": json_objects.map(json.dumps),
            "idempotency_key": texts,
            "approval_ref": texts,
            "approved_by": texts,
            "expires_at": st.datetimes(
                min_value=datetime(1971, 1, 1),
                max_value=datetime(9000, 1, 1),
                timezones=st.just(UTC),
            ),
            "actor": texts,
            "supersedes": st.none(),
        }
    ),
    transitions=st.lists(transitions, min_size=1, max_size=3),
)


@pytest_asyncio.fixture(loop_scope="session")
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def _written_by(
    conn: asyncpg.Connection, function: str, case: Case, event_ids_from: int
) -> tuple[list[tuple[Any, ...]], tuple[Any, ...]]:
    """The case's creation and transitions written by the trigger ``function`` (in a savepoint
    the caller's transaction rolls back, event ids numbered from ``event_ids_from``): the
    stream's records and the head on the row."""
    savepoint = conn.transaction()
    await savepoint.start()
    try:
        await conn.execute(
            "CREATE OR REPLACE TRIGGER operations_audit BEFORE INSERT OR UPDATE ON operations"
            " FOR EACH ROW WHEN (NEW.audit_event IS NOT NULL)"
            f" EXECUTE FUNCTION {function}()"
        )
        await conn.execute("SELECT setval('audit_event_ids', $1)", event_ids_from)
        created = await queries.fetchrow(
            conn, "create_operation", operation_id=case.operation_id, **case.approval
        )
        assert created is not None
        for transition in case.transitions:
            await conn.execute(
                "UPDATE operations SET status = $2, audit_event = $3::jsonb,"
                " audit_request = $4::jsonb WHERE operation_id = $1",
                case.operation_id,
                transition.status,
                transition.audit_event(),
                None if transition.request is None else json.dumps(transition.request),
            )
        written = [tuple(r) for r in await conn.fetch(_RECORDS, case.operation_id)]
        head = tuple(await conn.fetchrow(_HEAD, case.operation_id))
    finally:
        await savepoint.rollback()
    return written, head


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=cases)
async def test_the_records_are_those_of_the_function_before(
    conn: asyncpg.Connection, case: Case
) -> None:
    """On any operation and any transitions (with and without a request record), 0028's
    trigger writes the records, hashes and head that 0022's wrote, byte for byte, and each
    hash is the one the verifier recomputes."""
    async with conn.transaction():  # one now() for both
        await conn.execute(
            "SELECT set_config('opgate.instance_id', $1, true)", case.instance_id or ""
        )
        if case.instance_id and case.policy_version is not None:
            await queries.execute(
                conn,
                "audit_set_instance_policy",
                instance_id=case.instance_id,
                policy_version=case.policy_version,
            )
        event_ids_from = await conn.fetchval("SELECT nextval('audit_event_ids')")
        before = await _written_by(conn, BEFORE, case, event_ids_from)
        after = await _written_by(conn, AFTER, case, event_ids_from)
    assert after == before
    records, (_, head_seq, head_hash) = after
    requests = sum(t.request is not None for t in case.transitions)
    assert [r[0] for r in records] == list(range(1, 2 + len(case.transitions) + requests))
    prev = bytes(32)
    for seq, at, kind, operation_id, record, prev_hash, hash_ in records:
        assert bytes(prev_hash) == prev
        assert bytes(hash_) == record_hash(
            prev, case.operation_id, seq, at, kind, operation_id, record
        )
        prev = bytes(hash_)
    assert (head_seq, bytes(head_hash)) == (len(records), prev)


async def test_the_trigger_is_the_new_function(conn: asyncpg.Connection) -> None:
    """After the migrations the operation row's trigger runs 0028's function."""
    function = await conn.fetchval(
        "SELECT tgfoid::regproc::text FROM pg_trigger WHERE tgname = 'operations_audit'"
    )
    assert function == AFTER


# ---------------------------------------------------------------- a database of today's schema
@pytest_asyncio.fixture(loop_scope="session")
async def at_0027(pg_server_dsn: str) -> AsyncIterator[tuple[str, asyncpg.Connection]]:
    """A database at migration 0027 (the last before the change), its DSN and a connection;
    dropped afterwards."""
    name = f"opgate_m0028_{uuid.uuid4().hex[:12]}"
    dsn = await database_at_migration(pg_server_dsn, name, 27)
    connection = await asyncpg.connect(dsn, server_settings={"opgate.instance_id": "gw-1"})
    try:
        yield dsn, connection
    finally:
        await connection.close()
        admin = await asyncpg.connect(pg_server_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


async def _create(conn: asyncpg.Connection, operation_id: str) -> None:
    created = await queries.fetchrow(
        conn, "create_operation",
        operation_id=operation_id, tenant="t", agent_id="agent", provider="fault",
        action="refund", method="POST", path="/v1/refunds", path_params="{}", amount=500,
        currency="usd", params='{"amount": 500}', idempotency_key=f"key-{operation_id}",
        approval_ref="ref", approved_by="human", expires_at=datetime.now(UTC) + timedelta(hours=1),
        actor="test", supersedes=None,
    )  # fmt: skip
    assert created is not None


async def _claim(conn: asyncpg.Connection, operation_id: str, expected_attempts: int) -> None:
    claimed = await queries.fetchrow(
        conn, "claim_operation",
        operation_id=operation_id, owner="gw-1", lease_seconds=30.0,
        expected_attempts=expected_attempts, actor=None, dedup_window_seconds=86400.0,
        after_lookup_by=None,
        read_version=None, decided_before=None,
    )  # fmt: skip
    assert claimed is not None


def _request(operation_id: str) -> str:
    return json.dumps(
        {"schema_version": 1, "event": "request", "operation_id": operation_id,
         "path": "/v1/réfunds", "decision": "allow", "response_status": 200,
         "instance_seq": None}
    )  # fmt: skip


async def _settle(conn: asyncpg.Connection, operation_id: str) -> None:
    status = await queries.fetchval(
        conn, "settle_operation",
        operation_id=operation_id, status="confirmed", provider_status=200, object_id="re_1",
        content_type="application/json", body=b"{}", actor="gw-1",
        request=_request(operation_id),
    )  # fmt: skip
    assert status == "confirmed"


async def _release(conn: asyncpg.Connection, operation_id: str, attempt: int) -> None:
    status = await queries.fetchval(
        conn, "release_unknown",
        operation_id=operation_id, attempt=attempt, outcome="timeout", provider_status=None,
        actor="gw-1", owner=None, request=_request(operation_id),
    )  # fmt: skip
    assert status == "dispatched"


async def test_chains_of_today_go_on_and_verify_after_migration_0028(
    at_0027: tuple[str, asyncpg.Connection],
) -> None:
    """Operations sent, settled and left unknown at 0027 (their request records chained by the
    settle), migrated: the next transitions continue the same chains with the same encoding,
    a new operation's chain is whole, and `opgate audit verify` passes on the whole log."""
    dsn, conn = at_0027
    await queries.execute(
        conn, "audit_set_instance_policy", instance_id="gw-1", policy_version="sha256:v1"
    )
    for operation_id in ("op_settled", "op_unknown", "op_later"):
        await _create(conn, operation_id)
        await _claim(conn, operation_id, 0)
    await _settle(conn, "op_settled")
    await _release(conn, "op_unknown", 1)
    before = await conn.fetchval("SELECT count(*) FROM audit_log")

    applied = await migrate(dsn)
    assert applied[0] == 28  # and the migrations after it

    await _settle(conn, "op_later")  # a chain begun at 0027, continued at 0028
    await _claim(conn, "op_unknown", 1)  # a re-send within the provider's dedup window
    await _settle(conn, "op_unknown")
    await _create(conn, "op_new")
    await _claim(conn, "op_new", 0)
    await _settle(conn, "op_new")
    later = await conn.fetch(
        "SELECT stream, seq, kind, record ->> 'policy_version' AS version FROM audit_log"
        " WHERE stream = 'op_later' ORDER BY seq"
    )
    assert [(r["seq"], r["kind"]) for r in later] == [
        (1, "transition"),
        (2, "transition"),
        (3, "transition"),
        (4, "request"),
    ]
    assert later[2]["version"] == "sha256:v1"
    assert await conn.fetchval("SELECT count(*) FROM audit_log") == before + 2 + 1 + 2 + 1 + 1 + 2

    report = await verify(conn, BEGINNING, END, key=None, whole_log=True)
    assert report.ok, [b.describe() for b in report.breaks]
    env = {"OPGATE_SECRET_AUDIT_KEY": AUDIT_KEY, "PATH": "/usr/bin:/bin"}
    code, out = await run_cli("audit", "verify", "--database-url", dsn, env=env)
    assert code == 0, out
