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
        amount, currency, params, idempotency_key, approval_ref, approved_by, expires_at,
        supersedes)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11::jsonb, $12, $13, $14, $15, $17)
    ON CONFLICT (operation_id) DO NOTHING
    RETURNING *
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, 'created', NULL, 'created', $16,
           -- the whole approval, so the chained record alone says what was approved (the
           -- row is mutable); the key only as its SHA-256: whoever reads the audit log must
           -- not be able to re-send with it
           jsonb_build_object(
               'approval_ref', approval_ref, 'supersedes', supersedes,
               'approved_by', approved_by, 'tenant', tenant, 'agent_id', agent_id,
               'provider', provider, 'action', action,
               'target', jsonb_build_object('method', method, 'path', path),
               'path_params', path_params, 'amount', amount, 'currency', currency,
               'params', params, 'expires_at', to_jsonb(expires_at),
               'idempotency_key_sha256',
               encode(sha256(convert_to(idempotency_key, 'UTF8')), 'hex'))
    FROM created
)
SELECT c.*, now() AS read_at FROM created c;

-- name: timeline_seen
-- Run on every new store connection, before it is used (proxy/store/store.py Store.open): the
-- timeline this primary writes on, recorded the first time it is greater than every one
-- recorded before, and then, in the same statement, every operation still created or dispatched
-- marked `lookup_before_send` (migration 0014): it may have been claimed and sent on the timeline
-- that a failover lost, so it is looked up at the provider before its next send. The current
-- timeline is the first 8 hex digits of the current WAL file's name: pg_control_checkpoint()
-- shows the new one only after the next checkpoint. Only on a primary: a standby refuses any
-- statement that writes, even one that writes nothing, so the caller asks `ping` first.
-- The first timeline ever recorded marks nothing (no switch was seen). Safe when several
-- processes see the switch at once: the second insert of the same timeline waits for the
-- first's commit and inserts nothing, so it marks nothing either; a row created on the new
-- timeline meanwhile is not in this statement's snapshot, and it is not in doubt.
-- Returns the current timeline (NULL on a standby), the last one recorded before, and how
-- many operations were marked now (NULL: no new timeline was recorded by this statement).
WITH current_timeline AS (
    SELECT CASE WHEN pg_is_in_recovery() THEN NULL
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
           END AS timeline_id
), last_seen AS (
    SELECT max(timeline_id) AS timeline_id FROM timelines
), doubted AS (
    SELECT o.operation_id, o.status FROM operations o, current_timeline c, last_seen l
     WHERE l.timeline_id IS NOT NULL AND c.timeline_id > l.timeline_id
       AND o.status IN ('created', 'dispatched') AND o.lookup_before_send IS NULL
), recorded AS (
    INSERT INTO timelines (timeline_id, marked)
    SELECT c.timeline_id, (SELECT count(*) FROM doubted)
      FROM current_timeline c, last_seen l
     WHERE c.timeline_id IS NOT NULL AND (l.timeline_id IS NULL OR c.timeline_id > l.timeline_id)
    ON CONFLICT (timeline_id) DO NOTHING
    RETURNING timeline_id, seen_at, marked
), marked AS (
    -- next_reconcile_at cleared: a lookup is due now (a row whose attempts never left was
    -- left to its agent until expiry; it is not any more)
    UPDATE operations o SET lookup_before_send = r.seen_at, next_reconcile_at = NULL,
           updated_at = now()
      FROM recorded r, doubted d
     WHERE o.operation_id = d.operation_id
    RETURNING o.operation_id, o.status
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT m.operation_id, 'timeline_switched', m.status, m.status,
           coalesce(nullif(current_setting('opgate.instance_id', true), ''), 'opgate'),
           jsonb_build_object('timeline', r.timeline_id,
                              'previous_timeline', (SELECT timeline_id FROM last_seen))
      FROM marked m, recorded r
)
SELECT c.timeline_id AS current_timeline, l.timeline_id AS previous_timeline,
       (SELECT marked FROM recorded) AS marked
  FROM current_timeline c, last_seen l;

-- name: claim_operation
-- created -> dispatched, or a new attempt of a dispatched operation. Takes the in-flight lease
-- ($2 owner, $3 seconds) so that a crashed replica's claim expires. Revoked or expired
-- approvals never claim.
-- A re-send is decided here, on the row as it is now, not on the caller's earlier read: the
-- attempt it follows ($4) must still be the last, no attempt or reconciliation may be live,
-- and the last attempt must be known to have had no effect at the provider:
--   it never left (not_sent), or
--   the provider still deduplicates its key ($6: the retention in seconds, NULL if it does
--   not deduplicate; counted from creation, before which the key was never sent), or
--   the caller ($7) holds a live reconciliation lease under which the provider's complete
--   list showed no effect (the lease is consumed: no other attempt could start meanwhile).
-- $8, when given: the row's updated_at when it was read for the rule's precondition lookup
-- (proxy/gate/preconditions.py); the claim then requires the row unchanged since.
-- $9, when given: the request itself (proxy/gate/exact.py), for a first send claimed by the
-- statement that reads the row. It claims only a created row approved for exactly that
-- request: scope, target and key as column equalities, the amount in minor units, the
-- currency in one of two ASCII spellings, and the approved parameters as jsonb texts, which
-- keep 1 and 1.0 apart. Every one of these is stricter than the checks (proxy/gate/checks.py),
-- which then run on the claimed row all the same. Otherwise nothing is claimed and the row
-- comes back as it is (`claimed` false), for the checks to decide on and explain. A request
-- that names its operation only by the provider's key gives no $1: the key in $9 names the row.
-- For a rule with preconditions, $9's no_recheck states that no recheck is due
-- (proxy/gate/preconditions.py): nothing superseded, no proposal's approval, and a row younger
-- than the recheck age less a margin; an older row is left for its lookup.
-- The claim's transaction waits for a synchronous standby whatever synchronous_commit the
-- server, database or role says (local or off would acknowledge a claim a failover can lose,
-- and its request would leave twice): set_config(..., true) lasts to the end of this
-- transaction, so it holds through PgBouncer's transaction pooling; remote_apply is kept.
-- It is in `named`'s WHERE, which every claim evaluates, so the planner cannot drop it.
-- A row marked lookup_before_send (a timeline switch put it in doubt: timeline_seen) is claimed
-- only by the holder ($7) of a live reconciliation lease, under which the provider showed no
-- effect (proxy/gate/resend.py), whatever its status; never as sent ($9). The claim clears it.
WITH named AS (
    SELECT coalesce($1::text, (SELECT k.operation_id FROM operations k
                          WHERE k.provider = $9::jsonb->>'provider'
                            AND k.idempotency_key = $9::jsonb->>'idempotency_key')) AS id
     WHERE set_config('synchronous_commit',
                      CASE current_setting('synchronous_commit')
                           WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true) <> ''
), claimed AS (
    UPDATE operations
       SET status = 'dispatched', attempts = attempts + 1, dispatched_at = now(),
           lease_owner = $2, lease_until = now() + make_interval(secs => $3),
           last_outcome = NULL, attempt_ended_at = NULL, reconcile_owner = NULL,
           reconcile_lease_until = NULL, next_reconcile_at = NULL, lookup_before_send = NULL,
           updated_at = now()
     WHERE operation_id = (SELECT id FROM named)
       AND revoked_at IS NULL AND expires_at > now()
       AND (lookup_before_send IS NULL
            OR ($9::jsonb IS NULL AND reconcile_owner = $7 AND reconcile_lease_until > now()
                AND escalated_at IS NULL))
       AND (status = 'created'
            OR (status = 'dispatched' AND attempts = $4 AND escalated_at IS NULL
                AND (lease_until IS NULL OR lease_until <= now())
                AND (((reconcile_lease_until IS NULL OR reconcile_lease_until <= now())
                      AND (last_outcome = 'not_sent'
                           OR ($6::float8 IS NOT NULL
                               AND now() < created_at + make_interval(secs => $6))))
                     OR (reconcile_owner = $7 AND reconcile_lease_until > now()))))
       AND ($8::timestamptz IS NULL OR updated_at = $8)
       AND ($9::jsonb IS NULL
            OR (status = 'created'
                AND tenant = $9->>'tenant' AND (agent_id IS NULL OR agent_id = $9->>'agent_id')
                AND provider = $9->>'provider' AND action = $9->>'action'
                AND method = $9->>'method' AND path = $9->>'path'
                AND ($9->>'idempotency_key' IS NULL OR idempotency_key = $9->>'idempotency_key')
                AND (NOT $9 ? 'amount' OR amount IS NOT DISTINCT FROM ($9->>'amount')::bigint)
                AND (NOT $9 ? 'currency' OR currency IS NOT DISTINCT FROM $9->'currency'->>0
                     OR currency = $9->'currency'->>1)
                AND params::text = ($9->'params')::text
                AND (NOT $9 ? 'no_recheck'
                     OR (supersedes IS NULL
                         AND NOT starts_with(approval_ref, $9->'no_recheck'->>'proposal_prefix')
                         AND created_at > now() - make_interval(
                                 secs => ($9->'no_recheck'->>'younger_than')::float8)))))
    RETURNING *
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, 'claimed', CASE WHEN attempts = 1 THEN 'created' ELSE 'dispatched' END,
           'dispatched', $5,
           jsonb_build_object('attempt', attempts, 'lease_owner', $2)
             || CASE WHEN $7::text IS NULL THEN '{}'::jsonb
                     ELSE jsonb_build_object('after_lookup', $7::text) END
    FROM claimed
)
SELECT c.*, now() AS read_at, true AS claimed FROM claimed c
UNION ALL
SELECT o.*, now() AS read_at, false AS claimed FROM operations o
 WHERE $9::jsonb IS NOT NULL AND o.operation_id = (SELECT id FROM named)
   AND NOT EXISTS (SELECT FROM claimed);

-- name: budget_lock
-- Claims on one budget take turns ($1: its lock name, proxy/policy/budgets.py), in the claim's
-- transaction and before the sum below: the sum then sees every claim that went before, and
-- no claim can commit between this one's sum and its UPDATE. Released at commit or rollback.
SELECT pg_advisory_xact_lock(hashtextextended($1, 0));

-- name: budget_spent
-- What counts against one budget: the amounts of provider $1's operations in currency $2
-- (tenant $3 and agent $4, NULL: any) that are dispatched (in flight or unknown: the money
-- may have moved) or confirmed, whose last attempt was claimed in the last $5 seconds. $6 is
-- left out (the operation being claimed: a re-send must not count its own amount twice).
SELECT coalesce(sum(amount), 0)::bigint AS spent FROM operations
 WHERE provider = $1 AND currency = $2 AND status IN ('dispatched', 'confirmed')
   AND dispatched_at > now() - make_interval(secs => $5)
   AND ($3::text IS NULL OR tenant = $3) AND ($4::text IS NULL OR agent_id = $4)
   AND ($6::text IS NULL OR operation_id <> $6)
   AND amount IS NOT NULL;

-- name: budget_spent_by_key
-- The same sums for every tenant ($3 true) and agent ($4 true) that has spent anything in the
-- window, for reads of the remaining budgets (the API, /metrics); never for a decision.
SELECT CASE WHEN $3::bool THEN tenant END AS tenant,
       CASE WHEN $4::bool THEN agent_id END AS agent_id,
       sum(amount)::bigint AS spent
  FROM operations
 WHERE provider = $1 AND currency = $2 AND status IN ('dispatched', 'confirmed')
   AND dispatched_at > now() - make_interval(secs => $5) AND amount IS NOT NULL
   AND (NOT $4::bool OR agent_id IS NOT NULL)
 GROUP BY 1, 2
 ORDER BY 1, 2;
-- name: record_precondition_failed
-- The rule's preconditions did not hold before a send that nothing had gone before (the first,
-- or a re-send after attempts that all ended not_sent): nothing was sent and the row keeps its
-- status (no transition); the lookup's evidence ($3) is kept as its event, which the recovery
-- read answers from (new_approval_required). Only while nothing of the operation has left and
-- no attempt is in flight.
INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
SELECT operation_id, 'precondition_failed', status, status, $2, $3::jsonb
  FROM operations
 WHERE operation_id = $1
   AND (status = 'created'
        OR (status = 'dispatched' AND attempts = unsent_attempts
            AND (lease_until IS NULL OR lease_until <= now())))
RETURNING event_id;

-- name: precondition_failures
-- The latest precondition_failed evidence of each of the operations $1 of which nothing has
-- left (what their recovery read shows): still created, or dispatched with every attempt ended
-- not_sent and the failure after the last claim (a later lookup that held let that claim go).
SELECT DISTINCT ON (e.operation_id) e.operation_id, e.detail
  FROM operation_events e JOIN operations o USING (operation_id)
 WHERE e.operation_id = ANY($1::text[]) AND e.event = 'precondition_failed'
   AND (o.status = 'created'
        OR (o.status = 'dispatched' AND o.attempts = o.unsent_attempts
            AND e.at > o.dispatched_at))
 ORDER BY e.operation_id, e.event_id DESC;

-- name: settle_operation
-- dispatched -> confirmed | failed, from the provider's answer only. Any attempt's answer
-- settles: with a deduplicating provider every attempt reports the same effect. Returns only
-- the status settled: the row's other columns (the answer just written among them) are
-- known to the caller, and would cross the connection again for nothing.
WITH settled AS (
    UPDATE operations
       SET status = $2, last_outcome = $2, provider_status = $3, provider_object_id = $4,
           response_content_type = $5, response_body = $6, settled_at = now(),
           settled_reason = 'provider_answer', attempt_ended_at = now(),
           lease_owner = NULL, lease_until = NULL, updated_at = now()
     WHERE operation_id = $1 AND status = 'dispatched'
    RETURNING operation_id, attempts, status
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, $2, 'dispatched', $2, $7,
           jsonb_build_object('attempt', attempts, 'provider_status', $3, 'object_id', $4)
    FROM settled
)
SELECT s.status FROM settled s;

-- name: release_unknown
-- The attempt ended without a conclusive answer: the row STAYS dispatched, the lease is
-- released and the reason kept. Only the attempt that holds the lease ($2) may release it.
-- An attempt that ended before a byte left ($3 not_sent) is counted in unsent_attempts.
-- $6, when given: the claim's own lease owner, for a claim whose statement was cut off
-- (proxy/gate/cutoff.py): only that claim, if it committed at all, and only while its attempt
-- has no recorded end.
-- Returns only the status (dispatched), as settle_operation does.
WITH released AS (
    UPDATE operations
       SET lease_owner = NULL, lease_until = NULL, last_outcome = $3, provider_status = $4,
           attempt_ended_at = now(), updated_at = now(),
           unsent_attempts = unsent_attempts + (CASE WHEN $3 = 'not_sent' THEN 1 ELSE 0 END)
     WHERE operation_id = $1 AND status = 'dispatched' AND attempts = $2
       AND ($6::text IS NULL OR (lease_owner = $6 AND attempt_ended_at IS NULL))
    RETURNING operation_id, attempts, status
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, 'unknown', 'dispatched', 'dispatched', $5,
           jsonb_build_object('attempt', attempts, 'outcome', $3, 'provider_status', $4)
    FROM released
)
SELECT r.status FROM released r;

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

-- name: list_operations
-- Operations of a tenant ($1, NULL for all) in the given statuses, oldest first.
SELECT o.*, now() AS read_at FROM operations o
 WHERE ($1::text IS NULL OR o.tenant = $1) AND o.status = ANY($2::text[])
   AND ($3::text IS NULL OR o.agent_id IS NULL OR o.agent_id = $3)
 ORDER BY o.created_at, o.operation_id
 LIMIT $4;

-- name: claim_reconcile_one
-- Take the reconciliation lease of one dispatched operation whose attempt is over, so that no
-- two replicas (or a replica and a re-send) act on it at once. Paced: not before
-- next_reconcile_at, whoever asks (an agent polling, a re-send, an admin), so no caller can
-- multiply lookups made with opgate's provider credential. With $4 true, also a created row that
-- a timeline switch put in doubt (lookup_before_send): the lookup before its first send here
-- (proxy/gate/resend.py). Reconciliation ($4 false) never takes a created row: absence there
-- means "send it", not "failed". $5, when given: the row's updated_at as a precondition lookup
-- saw it (claim_operation's $8); the lease is taken only on the row unchanged since, and the
-- claim then needs it unchanged since the lease.
WITH taken AS (
    UPDATE operations
       SET reconcile_owner = $2, reconcile_lease_until = now() + make_interval(secs => $3),
           updated_at = now()
     WHERE operation_id = $1 AND escalated_at IS NULL
       AND (status = 'dispatched'
            OR ($4::bool AND status = 'created' AND lookup_before_send IS NOT NULL))
       AND ($5::timestamptz IS NULL OR updated_at = $5)
       AND (lease_until IS NULL OR lease_until <= now())
       AND (reconcile_lease_until IS NULL OR reconcile_lease_until <= now())
       AND (next_reconcile_at IS NULL OR next_reconcile_at <= now())
    RETURNING *
)
SELECT t.*, now() AS read_at FROM taken t;

-- name: claim_reconcile_batch
-- The background loop's pick: due, unleased, dispatched operations, escalated ones included
-- (they are looked up at their own, lower rate: an effect the provider shows settles them);
-- SKIP LOCKED keeps replicas from waiting on (or picking) each other's rows.
WITH due AS (
    SELECT operation_id FROM operations
     WHERE status = 'dispatched'
       AND (lease_until IS NULL OR lease_until <= now())
       AND (reconcile_lease_until IS NULL OR reconcile_lease_until <= now())
       AND (next_reconcile_at IS NULL OR next_reconcile_at <= now())
     ORDER BY dispatched_at
     LIMIT $3
     FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE operations o
       SET reconcile_owner = $1, reconcile_lease_until = now() + make_interval(secs => $2),
           updated_at = now()
      FROM due WHERE o.operation_id = due.operation_id
    RETURNING o.*
)
SELECT t.*, now() AS read_at FROM taken t;

-- name: settle_reconciled
-- dispatched -> confirmed | failed from the provider's own record, by the holder ($2) of a
-- reconciliation lease that is still live, while no attempt is in flight and none has started
-- since the lookup began ($10: the attempts it saw). A lapsed lease or a newer attempt makes
-- the lookup's answer stale: zero rows. Settling an escalated operation tells the humans.
-- A created row in doubt after a timeline switch (lookup_before_send) is settled the same way
-- when the lookup finds its effect (claim_reconcile_one with $4): it was sent on the lost
-- timeline.
WITH settled AS (
    UPDATE operations
       SET status = $3, last_outcome = $3, settled_reason = $4, provider_object_id = $5,
           provider_status = $6, response_content_type = $7, response_body = $8,
           settled_at = now(), reconcile_owner = NULL, reconcile_lease_until = NULL,
           lookup_before_send = NULL, updated_at = now()
     WHERE operation_id = $1 AND reconcile_owner = $2
       AND (status = 'dispatched' OR (status = 'created' AND lookup_before_send IS NOT NULL))
       AND reconcile_lease_until > now() AND attempts = $10
       AND (lease_until IS NULL OR lease_until <= now())
    RETURNING *
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, 'reconciled', CASE WHEN attempts = 0 THEN 'created' ELSE 'dispatched' END,
           $3, $2, $9::jsonb FROM settled
), notification AS (
    INSERT INTO escalation_notifications (operation_id, kind)
    SELECT operation_id, 'settled_by_provider' FROM settled WHERE escalated_at IS NOT NULL
)
SELECT s.*, now() AS read_at FROM settled s;

-- name: reconcile_inconclusive
-- The lookup settled nothing: count the try, release the lease, say when to look again. Only
-- by the lease's holder ($2), and only for the attempt it looked up ($5); a created row only
-- in doubt after a timeline switch (its lookup before the send).
WITH noted AS (
    UPDATE operations
       SET reconcile_attempts = reconcile_attempts + 1, reconcile_owner = NULL,
           reconcile_lease_until = NULL, next_reconcile_at = now() + make_interval(secs => $3),
           updated_at = now()
     WHERE operation_id = $1 AND reconcile_owner = $2
       AND (status = 'dispatched' OR (status = 'created' AND lookup_before_send IS NOT NULL))
       AND attempts = $5
    RETURNING *
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, 'reconcile_inconclusive', status, status, $2, $4::jsonb
    FROM noted
)
SELECT n.*, now() AS read_at FROM noted n;

-- name: escalate_operation
-- A human must decide. Stays dispatched; the notification is queued in the same statement.
-- By the holder ($2) of a live reconciliation lease for the attempt it looked up ($6), or
-- without one ($2 NULL) by $7 (NULL: an admin). The provider is still looked up, every $5
-- seconds: an effect it shows later settles the operation (absence never does; that stays
-- with the human). A created row in doubt after a timeline switch (lookup_before_send) whose
-- rule declares no lookup is escalated too, without a lease: it may have been sent on the lost
-- timeline, and nothing can ask; it stays created, and no claim takes it any more.
WITH escalated AS (
    UPDATE operations
       SET escalated_at = now(), escalation_reason = $3, reconcile_owner = NULL,
           reconcile_lease_until = NULL, next_reconcile_at = now() + make_interval(secs => $5),
           updated_at = now()
     WHERE operation_id = $1 AND escalated_at IS NULL
       AND (status = 'dispatched' OR (status = 'created' AND lookup_before_send IS NOT NULL))
       AND ($2::text IS NULL
            OR (reconcile_owner = $2 AND reconcile_lease_until > now() AND attempts = $6))
    RETURNING *
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, 'escalated', status, status, coalesce($2, $7, 'admin'),
           $4::jsonb || jsonb_build_object('reason', $3)
    FROM escalated
), notification AS (
    INSERT INTO escalation_notifications (operation_id) SELECT operation_id FROM escalated
)
SELECT e.*, now() AS read_at FROM escalated e;

-- name: resolve_operation
-- A human verdict settles a dispatched operation: confirmed (with the provider's object id)
-- or failed (no effect). Never while an attempt is in flight. Also a created row escalated
-- after a timeline switch (escalate_operation): the human says whether the lost timeline sent it.
WITH resolved AS (
    UPDATE operations
       SET status = $2, last_outcome = $2, settled_reason = 'human_verdict',
           provider_object_id = coalesce($3, provider_object_id), resolution_note = $4,
           settled_at = now(), reconcile_owner = NULL, reconcile_lease_until = NULL,
           lookup_before_send = NULL, updated_at = now()
     WHERE operation_id = $1
       AND (status = 'dispatched' OR (status = 'created' AND escalated_at IS NOT NULL))
       AND (lease_until IS NULL OR lease_until <= now())
    RETURNING *
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, 'resolved', CASE WHEN attempts = 0 THEN 'created' ELSE 'dispatched' END,
           $2, $5,
           jsonb_build_object('verdict', $2, 'object_id', $3, 'note', $4)
    FROM resolved
)
SELECT r.*, now() AS read_at FROM resolved r;

-- name: release_reconcile
-- Give back a reconciliation lease that was taken but not used (a re-send that, after its
-- lookup, could not claim): the next caller need not wait for it to lapse.
UPDATE operations SET reconcile_owner = NULL, reconcile_lease_until = NULL, updated_at = now()
 WHERE operation_id = $1 AND reconcile_owner = $2;

-- name: claim_notifications
-- Notifications (of an operation's escalation or of a pending proposal) due for delivery, leased so one replica sends each at a time.
WITH due AS (
    SELECT notification_id FROM escalation_notifications
     WHERE delivered_at IS NULL AND next_attempt_at <= now()
       AND (lease_until IS NULL OR lease_until <= now())
     ORDER BY notification_id LIMIT $1 FOR UPDATE SKIP LOCKED
)
UPDATE escalation_notifications n
   SET lease_until = now() + make_interval(secs => $2), attempts = attempts + 1
  FROM due WHERE n.notification_id = due.notification_id
RETURNING n.notification_id, n.operation_id, n.proposal_id, n.attempts, n.kind;

-- name: notification_delivered
UPDATE escalation_notifications SET delivered_at = now(), lease_until = NULL, last_error = NULL
 WHERE notification_id = $1;

-- name: notification_failed
-- Retry later with backoff ($2 seconds); never blocks a request.
UPDATE escalation_notifications
   SET lease_until = NULL, next_attempt_at = now() + make_interval(secs => $2), last_error = $3
 WHERE notification_id = $1;

-- name: operation_events
-- One operation's transitions, oldest first.
SELECT event_id, at, event, from_status, to_status, actor, detail
  FROM operation_events WHERE operation_id = $1 ORDER BY event_id;

-- name: ping
-- Readiness: the database answers, and it is a writable primary (a standby, e.g. a demoted
-- primary still behind the configured address, must never be read for decisions; a session
-- that is read-only by default refuses every claim).
SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::boolean AS in_recovery;

-- name: replication_state
-- What proxy/store/replication.py judges durability by: whether this is a primary, the
-- synchronous replication settings, and each standby streaming from it. Other roles' rows of
-- pg_stat_replication show state and sync_state as NULL unless this role has pg_monitor.
SELECT pg_is_in_recovery() AS in_recovery,
       current_setting('synchronous_standby_names') AS standby_names,
       current_setting('synchronous_commit') AS synchronous_commit,
       coalesce((SELECT jsonb_agg(jsonb_build_object('application_name', application_name,
                                                     'state', state, 'sync_state', sync_state))
                   FROM pg_stat_replication), '[]'::jsonb)::text AS standbys;

-- name: commit_heartbeat
-- Readiness proves a commit, not a read (migration 0013): the heartbeat row is written at the
-- claim's own synchronous_commit (claim_operation), so its commit waits for a synchronous
-- standby exactly as a claim's does. With synchronous_standby_names set and none connected it
-- hangs, and /readyz's short timeout turns that into 503.
UPDATE opgate_heartbeat
   SET beat_at = now(), instance_id = current_setting('opgate.instance_id', true)
 WHERE set_config('synchronous_commit',
                  CASE current_setting('synchronous_commit')
                       WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true) <> ''
RETURNING beat_at;

-- ===================================================================================== audit
-- The tamper-evident audit log (migration 0003, docs/audit.md, proxy/observe/auditlog/). Chaining is
-- done in the database (the audit_log trigger, and opgate_audit_append_batch for a larger
-- batch: migration 0010); these queries only append, checkpoint and read.

-- name: audit_append_batch
-- Records of one stream ($1, kind $2), in order: a JSON array of record objects ($3). One
-- statement per batch; the trigger chains each row (a few records: see the next query).
INSERT INTO audit_log (stream, seq, kind, operation_id, record, prev_hash, hash)
SELECT $1, 0, $2, r.value ->> 'operation_id', r.value, '\x', '\x'
  FROM jsonb_array_elements($3::jsonb) WITH ORDINALITY AS r (value, position)
 ORDER BY r.position;

-- name: audit_append_many
-- The same for a larger batch: chained by one function (migration 0010) that locks and moves
-- the stream's head once, instead of the trigger moving it once per row.
SELECT opgate_audit_append_batch($1, $2, $3::jsonb);

-- name: audit_append_requests
-- A batch of one instance's request records ($1 stream, $2 kind, $3 a JSON array of records)
-- and its run's trace ($4, migration 0012) in one statement; $5: chained by one function (a
-- batch of records.MANY_RECORDS or more) rather than by the trigger row by row. Records an
-- earlier attempt of the batch stored (its commit's answer lost) are skipped, exactly, under
-- the run's row lock; returns how many were (migration 0015).
SELECT opgate_audit_append_requests($1, $2, $3::jsonb, $4::jsonb, $5);

-- name: audit_run_seen
-- A run's trace while it has nothing to store, and at its clean stop ($1 with "stopped": true).
SELECT opgate_audit_run_seen($1::jsonb);

-- name: audit_runs_unaccounted
-- Runs whose tail the stored records cannot vouch for: not stopped cleanly, or stopped with
-- numbers never stored. `running`: no stop, and a trace within $1 heartbeats of now (a running
-- run leaves one at least every heartbeat); otherwise it ended without a clean stop.
SELECT run_id, instance_id, stream, started_at, numbered_seq, stored_seq, last_seen_at,
       stopped_at, stopped_at IS NULL
           AND last_seen_at >= now() - make_interval(secs => $1 * heartbeat_seconds) AS running,
       extract(epoch FROM now() - last_seen_at)::double precision AS seconds_since_seen
  FROM audit_instance_runs
 WHERE stopped_at IS NULL OR numbered_seq > stored_seq
 ORDER BY started_at, run_id;

-- name: audit_set_instance_policy
-- The policy set this instance ($1) now decides with ($2): transition records name it.
INSERT INTO audit_instances (instance_id, policy_version) VALUES ($1, $2)
ON CONFLICT (instance_id) DO UPDATE SET policy_version = $2, loaded_at = now();

-- name: audit_checkpoint_lock
-- Checkpoint writers (one per replica, rarely) take turns; request traffic never takes it.
SELECT pg_advisory_xact_lock(7308604897068083316);

-- name: audit_take_changed_heads
-- The heads that moved since the last checkpoint, marked as checkpointed in the same statement.
WITH changed AS (
    UPDATE audit_heads SET checkpointed_seq = seq
     WHERE seq > checkpointed_seq
    RETURNING stream, seq, hash
)
SELECT stream, seq, hash FROM changed ORDER BY stream;

-- name: audit_last_checkpoint
SELECT checkpoint_id, mac FROM audit_checkpoints ORDER BY checkpoint_id DESC LIMIT 1;

-- name: audit_insert_checkpoint
INSERT INTO audit_checkpoints (at, writer, heads, prev_mac, mac)
VALUES ($1, $2, $3::jsonb, $4, $5)
RETURNING checkpoint_id;

-- name: audit_checkpoints
-- Every checkpoint, oldest first (the verifier re-derives the MAC chain).
SELECT checkpoint_id, at, writer, heads::text AS heads, prev_mac, mac
  FROM audit_checkpoints ORDER BY checkpoint_id;

-- name: audit_records_between
-- Records recorded in [$1, $2), with the stored hash of each one's predecessor in its stream
-- (NULL when the predecessor is missing), earliest first.
SELECT a.stream, a.seq, a.at, a.kind, a.operation_id, a.record::text AS record, a.prev_hash,
       a.hash, p.hash AS predecessor_hash
  FROM audit_log a
  LEFT JOIN audit_log p ON p.stream = a.stream AND p.seq = a.seq - 1
 WHERE a.at >= $1 AND a.at < $2
 ORDER BY a.at, a.stream, a.seq;

-- name: audit_records_at
-- The records named by checkpoint claims: [[stream, seq], ...] ($1).
SELECT c.value ->> 0 AS stream, (c.value ->> 1)::bigint AS seq, a.hash
  FROM jsonb_array_elements($1::jsonb) AS c (value)
  LEFT JOIN audit_log a ON a.stream = c.value ->> 0 AND a.seq = (c.value ->> 1)::bigint;

-- name: audit_heads_mismatched
-- Streams whose head does not match their last record (a tail deleted or appended around the
-- trigger).
SELECT h.stream, h.seq AS head_seq, h.hash AS head_hash, l.seq AS last_seq
  FROM audit_heads h
  LEFT JOIN LATERAL (SELECT max(seq) AS seq FROM audit_log a WHERE a.stream = h.stream) l ON true
  LEFT JOIN audit_log last ON last.stream = h.stream AND last.seq = l.seq
 WHERE l.seq IS DISTINCT FROM h.seq OR last.hash IS DISTINCT FROM h.hash;

-- name: audit_request_numbering
-- The numbering of each instance's request records (`instance_seq`, docs/audit.md), per
-- request stream and per run of its writer (a `started` record begins a run; records before
-- the first one are run 0, what is left of a run whose beginning was pruned): the numbers no
-- stored record carries (missing), those carried twice (duplicate), and those a `dropped`
-- record declares lost before storage (dropped). In run 0, numbers up to the stream's
-- retention floor ($1: {"stream": floor, ...}) were pruned and are not expected. A run's
-- numbers after its last stored one cannot be checked here (only the log stream has them).
WITH entries AS (
    SELECT stream, record,
           count(*) FILTER (WHERE record ->> 'record_type' = 'started')
               OVER (PARTITION BY stream ORDER BY seq) AS run
      FROM audit_log
     WHERE kind = 'request' AND stream LIKE 'requests/%'
), numbers AS (
    SELECT stream, run, (record ->> 'instance_seq')::bigint AS lo,
           (record ->> 'instance_seq')::bigint AS hi, false AS dropped
      FROM entries WHERE jsonb_typeof(record -> 'instance_seq') = 'number'
    UNION ALL
    SELECT e.stream, e.run, (d.value ->> 0)::bigint, (d.value ->> 1)::bigint, true
      FROM entries e, jsonb_array_elements(e.record -> 'dropped') AS d (value)
     WHERE e.record ->> 'record_type' = 'dropped'
), floored AS (
    SELECT n.stream, n.run, n.lo, n.hi, n.dropped,
           CASE WHEN n.run = 0 THEN coalesce(($1::jsonb ->> n.stream)::bigint, 0) ELSE 0 END
               AS floor
      FROM numbers n
), ordered AS (
    SELECT stream, run, greatest(lo, floor + 1) AS lo, hi, dropped,
           coalesce(max(hi) OVER (PARTITION BY stream, run ORDER BY lo, hi
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                    floor) AS reach
      FROM floored WHERE hi > floor
)
SELECT stream, run, 'missing' AS problem, reach + 1 AS first, lo - 1 AS last
  FROM ordered WHERE lo > reach + 1
UNION ALL
SELECT stream, run, 'duplicate', lo, least(hi, reach) FROM ordered WHERE lo <= reach
UNION ALL
SELECT stream, run, 'dropped', lo, hi FROM ordered WHERE dropped
 ORDER BY stream, run, first, problem;

-- name: audit_retention_records
-- Every prune, oldest first (retention.py: what was cut, through which checkpoint).
SELECT record::text AS record FROM audit_log WHERE stream = 'retention' ORDER BY seq;

-- name: audit_prunable
-- What a prune removes, in chain order: the records at or before each stream's cut
-- ($1: [[stream, seq], ...], the heads signed by the checkpoints it goes through).
SELECT a.stream, a.seq, a.at, a.kind, a.operation_id, a.record::text AS record, a.prev_hash,
       a.hash
  FROM jsonb_array_elements($1::jsonb) AS c (value)
  JOIN audit_log a ON a.stream = c.value ->> 0 AND a.seq <= (c.value ->> 1)::bigint
 ORDER BY a.stream, a.seq;

-- name: audit_prune
-- Removes them, in the transaction that appends the prune's own record; returns how many.
WITH gone AS (
    DELETE FROM audit_log a
     USING jsonb_array_elements($1::jsonb) AS c (value)
     WHERE a.stream = c.value ->> 0 AND a.seq <= (c.value ->> 1)::bigint
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: audit_operation_records
-- One operation's audit records (its transitions and the agent requests that named it).
SELECT stream, seq, at, kind, operation_id, record::text AS record, prev_hash, hash
  FROM audit_log WHERE operation_id = $1 ORDER BY at, stream, seq;

-- name: metrics_operations
-- Scrape-time gauges: unsettled operations by status (the partial index), those dispatched
-- longer than $1 seconds, open escalations, and proposals waiting for a human (unexpired).
SELECT
    count(*) FILTER (WHERE status = 'created') AS created,
    count(*) FILTER (WHERE status = 'dispatched') AS dispatched,
    count(*) FILTER (WHERE status = 'dispatched'
                       AND dispatched_at < now() - make_interval(secs => $1)) AS dispatched_old,
    count(*) FILTER (WHERE escalated_at IS NOT NULL) AS escalated,
    (SELECT count(*) FROM proposals
      WHERE status = 'pending' AND expires_at > now()) AS proposals_pending
  FROM operations WHERE status IN ('created', 'dispatched');

-- name: audit_records_after
-- Export with a cursor: the records of each stream after the seq the cursor holds for it
-- ($1: {"stream": seq, ...}; a stream it does not name starts at 0), at most $2 of them. A
-- stream's seq is given by its head, under the head's row lock, at insert: within a stream,
-- seq order is commit order, and a record that commits late still gets a seq after every
-- record already visible in its stream. So a per-stream cursor never skips a record (a window
-- by `at`, the transaction's start, can). Ordered by stream then seq so a page ends on a
-- consistent cursor.
SELECT a.stream, a.seq, a.at, a.kind, a.operation_id, a.record::text AS record, a.prev_hash,
       a.hash
  FROM audit_log a
 WHERE a.seq > coalesce(($1::jsonb ->> a.stream)::bigint, 0)
 ORDER BY a.stream, a.seq
 LIMIT $2;

-- name: audit_reviewer_grants
-- The statements that make role $1 a read-only audit reviewer: it may read the audit tables
-- (what `opgate audit verify|show|export` read) and nothing else: not the operations (their
-- idempotency keys and parameters), and it can write nothing. PostgreSQL quotes the name.
SELECT format(statement, current_schema(), $1::text) AS statement
  FROM (VALUES
    (1, 'GRANT USAGE ON SCHEMA %I TO %I'),
    (2, 'GRANT SELECT ON %1$I.audit_log, %1$I.audit_heads, %1$I.audit_checkpoints,'
        ' %1$I.audit_instances, %1$I.audit_instance_runs TO %2$I')
  ) AS g (position, statement)
 ORDER BY position;
-- =============================================================================== end audit

-- ================================================================================== console
-- The web console (proxy/console/): its sessions (migration 0006) and its reads.

-- name: console_session_create
-- A new session ($1: SHA-256 of the cookie value, $2 role, $3 identity, $4 CSRF token, $5
-- lifetime in seconds); expired sessions are cleared in the same statement.
WITH expired AS (
    DELETE FROM console_sessions WHERE expires_at <= now()
)
INSERT INTO console_sessions (session_digest, role, identity, csrf_token, expires_at)
VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5));

-- name: console_session_load
-- The live session whose cookie hashes to $1 (none once expired).
SELECT role, identity, csrf_token FROM console_sessions
 WHERE session_digest = $1 AND expires_at > now();

-- name: console_session_delete
DELETE FROM console_sessions WHERE session_digest = $1;

-- name: console_operations
-- Operations in the statuses $1, of tenant $2 and provider $3 (NULL: any), created at least
-- $4 seconds ago (NULL: any age), newest first, at most $5.
SELECT o.*, now() AS read_at FROM operations o
 WHERE o.status = ANY($1::text[])
   AND ($2::text IS NULL OR o.tenant = $2)
   AND ($3::text IS NULL OR o.provider = $3)
   AND ($4::float8 IS NULL OR o.created_at <= now() - make_interval(secs => $4))
 ORDER BY o.created_at DESC, o.operation_id
 LIMIT $5;

-- name: console_escalated
-- The escalation queue: operations waiting on a human (dispatched, or created and in doubt
-- after a timeline switch), oldest escalation first.
SELECT o.*, now() AS read_at FROM operations o
 WHERE o.status IN ('created', 'dispatched') AND o.escalated_at IS NOT NULL
 ORDER BY o.escalated_at, o.operation_id
 LIMIT $1;

-- name: console_notifications
-- One operation's escalation notices and their delivery.
SELECT notification_id, kind, created_at, attempts, delivered_at, last_error
  FROM escalation_notifications WHERE operation_id = $1 ORDER BY notification_id;

-- name: console_last_checkpoint
-- The newest checkpoint: when, by whom, and how many chain heads it signed.
SELECT checkpoint_id, at, writer, jsonb_array_length(heads) AS heads, mac
  FROM audit_checkpoints ORDER BY checkpoint_id DESC LIMIT 1;
-- ============================================================================== end console

-- ================================================================================ proposals
-- Proposals (migration 0009, proxy/operations/proposals.py): an agent asks for the approval of
-- the exact request it intends; a human approves or declines it. Each transition is one
-- conditional statement that writes its proposal_events row (chained into the audit log by
-- the trigger) in the same round trip. A pending proposal past expires_at is expired: no
-- transition takes it out of pending any more.

-- name: proposal_create
-- A new pending proposal, validated as an approval ($1 proposal id, $2..$14 the operation it
-- would create, $15 the agent's reason, $16 seconds the approved operation stands, $17
-- seconds the proposal waits for a human). Its `proposed` event keeps the whole request (the
-- key only as its SHA-256), and approvers' notice is queued in the same statement.
WITH proposed AS (
    INSERT INTO proposals (
        proposal_id, operation_id, tenant, agent_id, provider, action, method, path,
        path_params, amount, currency, params, idempotency_key, reason, approval_seconds,
        expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12::jsonb, $13, $15, $16,
            now() + make_interval(secs => $17))
    RETURNING *
), event AS (
    INSERT INTO proposal_events (proposal_id, event, from_status, to_status, actor, detail)
    SELECT proposal_id, 'proposed', NULL, 'pending', $14,
           jsonb_build_object(
               'operation_id', operation_id, 'tenant', tenant, 'agent_id', agent_id,
               'provider', provider, 'action', action,
               'target', jsonb_build_object('method', method, 'path', path),
               'path_params', path_params, 'amount', amount, 'currency', currency,
               'params', params, 'reason', reason, 'expires_at', to_jsonb(expires_at),
               'approval_seconds', approval_seconds,
               'idempotency_key_sha256',
               encode(sha256(convert_to(idempotency_key, 'UTF8')), 'hex'))
    FROM proposed
), notification AS (
    INSERT INTO escalation_notifications (proposal_id, kind)
    SELECT proposal_id, 'proposal_pending' FROM proposed
)
SELECT p.*, now() AS read_at FROM proposed p;

-- name: proposal_load
-- One proposal, with the database's clock (expiry is decided against it).
SELECT p.*, now() AS read_at FROM proposals p WHERE p.proposal_id = $1;

-- name: proposal_list
-- Proposals of a tenant ($1, NULL for all) in the states $2 (pending, expired, approved,
-- declined: expired is a pending one past its expiry), oldest first, at most $3.
SELECT p.*, now() AS read_at FROM proposals p
 WHERE ($1::text IS NULL OR p.tenant = $1)
   AND (CASE WHEN p.status = 'pending' AND p.expires_at <= now() THEN 'expired'
             ELSE p.status END) = ANY($2::text[])
 ORDER BY p.created_at, p.proposal_id
 LIMIT $3;

-- name: proposal_approve
-- pending and unexpired -> approved, and the operation row created from the proposal as it
-- was proposed (approval_ref: the proposal id; approved_by: $2, the approver's identity;
-- standing approval_seconds from now), with both events, in one statement: two approvals
-- racing serialise on the proposal's row lock and the second finds it approved (zero rows), so
-- one proposal creates at most one operation. $3 is the actor, $4 the approver's note.
WITH approved AS (
    UPDATE proposals
       SET status = 'approved', decided_at = now(), decided_by = $2, decision_note = $4
     WHERE proposal_id = $1 AND status = 'pending' AND expires_at > now()
    RETURNING *
), created AS (
    INSERT INTO operations (
        operation_id, tenant, agent_id, provider, action, method, path, path_params,
        amount, currency, params, idempotency_key, approval_ref, approved_by, expires_at)
    SELECT operation_id, tenant, agent_id, provider, action, method, path, path_params,
           amount, currency, params, idempotency_key, proposal_id, $2,
           now() + make_interval(secs => approval_seconds)
      FROM approved
    RETURNING *
), event AS (
    INSERT INTO operation_events (operation_id, event, from_status, to_status, actor, detail)
    SELECT operation_id, 'created', NULL, 'created', $3,
           -- as create_operation's, and the proposal it came from
           jsonb_build_object(
               'approval_ref', approval_ref, 'proposal_id', approval_ref,
               'supersedes', supersedes,
               'approved_by', approved_by, 'tenant', tenant, 'agent_id', agent_id,
               'provider', provider, 'action', action,
               'target', jsonb_build_object('method', method, 'path', path),
               'path_params', path_params, 'amount', amount, 'currency', currency,
               'params', params, 'expires_at', to_jsonb(expires_at),
               'idempotency_key_sha256',
               encode(sha256(convert_to(idempotency_key, 'UTF8')), 'hex'))
    FROM created
), decided AS (
    INSERT INTO proposal_events (proposal_id, event, from_status, to_status, actor, detail)
    SELECT proposal_id, 'approved', 'pending', 'approved', $3,
           jsonb_build_object('approved_by', $2::text, 'operation_id', operation_id,
                              'note', $4::text)
    FROM approved
)
SELECT c.*, now() AS read_at FROM created c;

-- name: proposal_decline
-- pending and unexpired -> declined ($2 who, $3 the actor, $4 the note). No operation is ever
-- created for it: nothing the agent sends can be let through.
WITH declined AS (
    UPDATE proposals
       SET status = 'declined', decided_at = now(), decided_by = $2, decision_note = $4
     WHERE proposal_id = $1 AND status = 'pending' AND expires_at > now()
    RETURNING *
), decided AS (
    INSERT INTO proposal_events (proposal_id, event, from_status, to_status, actor, detail)
    SELECT proposal_id, 'declined', 'pending', 'declined', $3,
           jsonb_build_object('declined_by', $2::text, 'note', $4::text)
    FROM declined
)
SELECT d.*, now() AS read_at FROM declined d;

-- name: proposal_refusal
-- An approval refused before any transition (four eyes, no longer sendable, a limit): on the
-- proposal's audit stream too, its status unchanged ($2 actor, $3 code, $4 detail).
INSERT INTO proposal_events (proposal_id, event, from_status, to_status, actor, detail)
SELECT proposal_id, 'approval_refused', status, status, $2,
       jsonb_build_object('code', $3::text, 'detail', $4::text)
  FROM proposals WHERE proposal_id = $1;

-- name: proposal_events
-- One proposal's decisions, oldest first.
SELECT event_id, at, event, from_status, to_status, actor, detail::text AS detail
  FROM proposal_events WHERE proposal_id = $1 ORDER BY event_id;
-- ============================================================================ end proposals

-- name: mandate_open_use
-- How many operations one open mandate ($1: its digest) approved, and their amounts' sum, not
-- counting those that failed or were revoked before anything left: AP2's occurrences and
-- budget. Run after mandate_lock in the same transaction.
SELECT count(*) AS occurrences, coalesce(sum(amount), 0)::bigint AS spent
FROM operations
WHERE approval_ref LIKE 'ap2:%;open:%' AND split_part(approval_ref, ';open:', 2) = $1
  AND status <> 'failed' AND revoked_at IS NULL;

-- name: mandates_revoked
-- Which of the mandate digests ($1) are revoked.
SELECT digest FROM revoked_mandates WHERE digest = ANY($1::text[]);

-- name: mandate_revoke
-- Revoke a mandate by its digest ($1), by whom ($2), why ($3). Revoking twice keeps the first.
INSERT INTO revoked_mandates (digest, revoked_by, reason) VALUES ($1, $2, $3)
ON CONFLICT (digest) DO NOTHING;

-- name: mandate_operations
-- The operations a mandate ($1: its digest) approved, closed or open.
SELECT operation_id FROM operations
WHERE approval_ref LIKE 'ap2:%'
  AND (split_part(split_part(approval_ref, ';', 1), ':', 2) = $1
       OR split_part(approval_ref, ';open:', 2) = $1)
ORDER BY created_at;
