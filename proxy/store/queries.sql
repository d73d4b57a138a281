-- Every query opgate runs, each named by a `-- name:` line and described by the comments after it.
-- Each state transition is ONE conditional statement that also writes its event row (a CTE), so
-- the transition and its audit record commit together, in one round trip. Zero rows back means
-- the row was not in the expected state: a conflict to be explained, never blindly retried.

-- name: load_operation
-- The authoritative row, with the database's clock (all decisions compare against it).
SELECT o.*, now() AS read_at FROM operations o WHERE o.operation_id = $1;

-- name: load_operation_by_key
-- The row an agent named only by its approved idempotency key.
SELECT o.*, now() AS read_at FROM operations o WHERE o.provider = $1 AND o.idempotency_key = $2;

-- name: create_operation
-- A new approved operation (status created). A repeated operation_id inserts nothing and returns
-- no row: the caller compares with the existing row.
WITH created AS (
    INSERT INTO operations (
        operation_id, tenant, agent_id, provider, action, method, path, path_params,
        amount, currency, params, idempotency_key, approval_ref, approved_by, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11::jsonb, $12, $13, $14, $15)
    ON CONFLICT (operation_id) DO NOTHING
    RETURNING *
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, 'created', NULL, 'created', $16, jsonb_build_object('approval_ref', approval_ref)
    FROM created
)
SELECT c.*, now() AS read_at FROM created c;

-- name: claim_operation
-- created -> dispatched, or a new attempt of a dispatched operation that has no live lease
-- ($4: the caller's policy allows a re-send). Takes the in-flight lease ($2 owner, $3 seconds)
-- so that a crashed replica's claim expires. Revoked or expired approvals never claim.
WITH claimed AS (
    UPDATE operations
       SET status = 'dispatched', attempts = attempts + 1, dispatched_at = now(),
           lease_owner = $2, lease_until = now() + make_interval(secs => $3),
           last_outcome = NULL, updated_at = now()
     WHERE operation_id = $1
       AND revoked_at IS NULL AND expires_at > now()
       AND (status = 'created'
            OR ($4 AND status = 'dispatched' AND (lease_until IS NULL OR lease_until <= now())))
    RETURNING *
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, 'claimed', CASE WHEN attempts = 1 THEN 'created' ELSE 'dispatched' END,
           'dispatched', $5, jsonb_build_object('attempt', attempts, 'lease_owner', $2)
    FROM claimed
)
SELECT c.*, now() AS read_at FROM claimed c;

-- name: settle_operation
-- dispatched -> confirmed | failed, from the provider's answer only. Any attempt's answer
-- settles: with a deduplicating provider every attempt reports the same effect.
WITH settled AS (
    UPDATE operations
       SET status = $2, last_outcome = $2, provider_status = $3, provider_object_id = $4,
           response_content_type = $5, response_body = $6, settled_at = now(),
           lease_owner = NULL, lease_until = NULL, updated_at = now()
     WHERE operation_id = $1 AND status = 'dispatched'
    RETURNING *
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, $2, 'dispatched', $2, $7,
           jsonb_build_object('attempt', attempts, 'provider_status', $3, 'object_id', $4)
    FROM settled
)
SELECT s.*, now() AS read_at FROM settled s;

-- name: release_unknown
-- The attempt ended without a conclusive answer: the row STAYS dispatched, the lease is
-- released and the reason kept. Only the attempt that holds the lease ($2) may release it.
WITH released AS (
    UPDATE operations
       SET lease_owner = NULL, lease_until = NULL, last_outcome = $3, provider_status = $4,
           updated_at = now()
     WHERE operation_id = $1 AND status = 'dispatched' AND attempts = $2
    RETURNING *
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, 'unknown', 'dispatched', 'dispatched', $5,
           jsonb_build_object('attempt', attempts, 'outcome', $3, 'provider_status', $4)
    FROM released
)
SELECT r.*, now() AS read_at FROM released r;

-- name: revoke_operation
-- Withdraw the approval. Never changes status: what was sent stays sent.
WITH revoked AS (
    UPDATE operations
       SET revoked_at = now(), revoked_reason = $2, updated_at = now()
     WHERE operation_id = $1 AND revoked_at IS NULL
    RETURNING *
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, 'revoked', status, status, $3, jsonb_build_object('reason', $2)
    FROM revoked
)
SELECT r.*, now() AS read_at FROM revoked r;

-- name: operation_events
-- One operation's transitions, oldest first.
SELECT event_id, at, event, from_status, to_status, actor, detail
  FROM operation_events WHERE operation_id = $1 ORDER BY event_id;

-- name: ping
-- Readiness: the database answers.
SELECT 1;
