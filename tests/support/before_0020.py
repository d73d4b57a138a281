"""What releases before migration 0020 wrote: transitions (the operation row changed and an
``operation_events`` row inserted, which 0003's triggers chained into ``audit_log`` through
``audit_heads``) and HMAC checkpoints of the heads in ``audit_heads``. For migration tests that
build a database at an older migration, write its chains the old way, migrate, and go on with
today's queries (proxy/store/queries.sql)."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg

from proxy.observe.auditlog.chain import GENESIS, Head, checkpoint_mac, heads_json

# The created event, as queries.sql create_operation wrote it up to 0019 (the whole approval in
# the detail); works on the schema of migration 0002 onwards.
_CREATE = """
WITH created AS (
    INSERT INTO operations (
        operation_id, tenant, agent_id, provider, action, method, path, amount, currency,
        idempotency_key, approval_ref, approved_by, expires_at)
    VALUES ($1, 't', 'agent', 'fault', 'refund', 'POST', '/v1/refunds', 500, 'usd',
            'key-' || $1, 'ref', 'human', now() + interval '1 hour')
    RETURNING *
)
INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
SELECT operation_id, 'created', NULL, 'created', 'test',
       jsonb_build_object(
           'approval_ref', approval_ref, 'supersedes', supersedes,
           'approved_by', approved_by, 'tenant', tenant, 'agent_id', agent_id,
           'provider', provider, 'action', action,
           'target', jsonb_build_object('method', method, 'path', path),
           'path_params', path_params, 'amount', amount, 'currency', currency,
           'params', params, 'expires_at', to_jsonb(expires_at),
           'idempotency_key_sha256', encode(sha256(convert_to(idempotency_key, 'UTF8')), 'hex'))
  FROM created
RETURNING event_id
"""

# A first claim, in the columns of migration 0009's schema (later ones add columns it does not
# name).
_CLAIM = """
WITH claimed AS (
    UPDATE operations SET status = 'dispatched', attempts = 1, dispatched_at = now(),
           lease_owner = 'me', lease_until = now() + interval '30 seconds', updated_at = now()
     WHERE operation_id = $1 AND status = 'created'
    RETURNING operation_id
)
INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
SELECT operation_id, 'claimed', 'created', 'dispatched', 'me', '{"attempt": 1}'::jsonb
  FROM claimed
RETURNING event_id
"""

# An attempt that ended without an answer (the row stays dispatched).
_RELEASE = """
WITH released AS (
    UPDATE operations SET lease_owner = NULL, lease_until = NULL, last_outcome = 'unknown:timeout',
           updated_at = now()
     WHERE operation_id = $1 AND status = 'dispatched'
    RETURNING operation_id, attempts
)
INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
SELECT operation_id, 'unknown', 'dispatched', 'dispatched', 'me',
       jsonb_build_object('attempt', attempts, 'outcome', 'unknown:timeout')
  FROM released
RETURNING event_id
"""


async def create(conn: asyncpg.Connection, operation_id: str) -> None:
    """A created operation: its stream's first record."""
    assert await conn.fetchval(_CREATE, operation_id) is not None


async def claim(conn: asyncpg.Connection, operation_id: str) -> None:
    """Its first claim: created -> dispatched."""
    assert await conn.fetchval(_CLAIM, operation_id) is not None


async def release(conn: asyncpg.Connection, operation_id: str) -> None:
    """Its attempt's outcome unknown: dispatched, lease released."""
    assert await conn.fetchval(_RELEASE, operation_id) is not None


# queries.sql audit_take_changed_heads up to 0019: every head lived in audit_heads.
_TAKE_HEADS = """
WITH changed AS (
    UPDATE audit_heads SET checkpointed_seq = seq WHERE seq > checkpointed_seq
    RETURNING stream, seq, hash
)
SELECT stream, seq, hash FROM changed ORDER BY stream
"""


async def checkpoint(conn: asyncpg.Connection, key: bytes, writer: str) -> None:
    """An HMAC checkpoint of the heads that moved, as proxy/observe/auditlog/records.py wrote
    it up to 0019."""
    async with conn.transaction():
        rows = await conn.fetch(_TAKE_HEADS)
        heads = heads_json(Head(r["stream"], r["seq"], bytes(r["hash"])) for r in rows)
        last = await conn.fetchval(
            "SELECT mac FROM audit_checkpoints ORDER BY checkpoint_id DESC LIMIT 1"
        )
        prev_mac = bytes(last) if last is not None else GENESIS
        at = datetime.now(UTC)
        mac = checkpoint_mac(key, prev_mac, at, writer, heads)
        await conn.execute(
            "INSERT INTO audit_checkpoints (at, writer, heads, prev_mac, mac)"
            " VALUES ($1, $2, $3::jsonb, $4, $5)",
            at,
            writer,
            heads,
            prev_mac,
            mac,
        )
