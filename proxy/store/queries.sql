-- Every query opgate runs, each named by a `-- name:` line and described by the comments after it.
-- Each state transition is ONE conditional statement that also names its event (the operation
-- row's `audit_event`: {"event", "actor", "detail"}), which the row's trigger writes as the one
-- chained audit record (migration 0020), so the transition and its record commit together, in
-- one round trip. Zero rows back means the row was not in the expected state: a conflict to be
-- explained, never blindly retried.
-- Parameters are named, %(name)s, and bound by keyword (proxy/store/queries.py translates each
-- query once into PostgreSQL's numbered ones). A condition several statements share is one SQL
-- function of migration 0016 or 0024 (opgate_lease_free_v2, opgate_unsettled,
-- opgate_nothing_left_yet, opgate_nothing_sent, opgate_spends), which PostgreSQL inlines where it
-- is called.
-- Time: a statement that moves an operation (claims, settles, releases, revokes, reconciles)
-- compares with and records clock_timestamp(), the time as the row is decided; a budget's sum
-- bounds its window by statement_timestamp(). now() is the transaction's start, which a claim
-- under a budget's lock took before it waited.

-- name: load_operation
-- The authoritative row, with the database's clock (all decisions compare against it).
SELECT o.*, now() AS read_at FROM operations o WHERE o.operation_id = %(operation_id)s;

-- name: load_operation_by_key
-- The row an agent named only by its approved idempotency key.
SELECT o.*, now() AS read_at FROM operations o
 WHERE o.provider = %(provider)s AND o.idempotency_key = %(idempotency_key)s;

-- name: create_operation
-- A new approved operation (status created). A repeated operation_id inserts nothing and returns
-- no row: the caller compares with the existing row.
WITH created AS (
    INSERT INTO operations (
        operation_id, tenant, agent_id, provider, action, method, path, path_params,
        amount, currency, params, idempotency_key, approval_ref, approved_by, expires_at,
        supersedes, audit_event)
    VALUES (%(operation_id)s, %(tenant)s, %(agent_id)s, %(provider)s, %(action)s, %(method)s,
            %(path)s, %(path_params)s::jsonb, %(amount)s, %(currency)s, %(params)s::jsonb,
            %(idempotency_key)s, %(approval_ref)s, %(approved_by)s, %(expires_at)s,
            %(supersedes)s,
            -- the record holds the whole approval, which the trigger takes from the row
            jsonb_build_object('event', 'created', 'actor', %(actor)s::text))
    ON CONFLICT (operation_id) DO NOTHING
    RETURNING *
)
SELECT c.*, now() AS read_at FROM created c;

-- name: create_operation_keyed
-- create_operation under the application's Idempotency-Key (migration 0027_failover): the
-- operation and its key row are inserted by one statement, so a key exists exactly when its
-- operation does.
-- Nothing is inserted while the key is taken; a twin racing for the same key waits for the
-- first's commit and then fails on the key's primary key (approval_keys_pkey), its operation
-- rolled back with it. No row back: the key or the operation_id is taken; the caller reads
-- approval_key to tell which.
WITH created AS (
    INSERT INTO operations (
        operation_id, tenant, agent_id, provider, action, method, path, path_params,
        amount, currency, params, idempotency_key, approval_ref, approved_by, expires_at,
        supersedes, audit_event)
    SELECT %(operation_id)s, %(tenant)s, %(agent_id)s, %(provider)s, %(action)s, %(method)s,
           %(path)s, %(path_params)s::jsonb, %(amount)s, %(currency)s, %(params)s::jsonb,
           %(idempotency_key)s, %(approval_ref)s, %(approved_by)s, %(expires_at)s,
           %(supersedes)s, jsonb_build_object('event', 'created', 'actor', %(actor)s::text)
     WHERE NOT EXISTS (SELECT 1 FROM approval_keys k
                        WHERE k.tenant = %(tenant)s AND k.caller = %(caller)s
                          AND k.request_key = %(request_key)s)
    ON CONFLICT (operation_id) DO NOTHING
    RETURNING *
), keyed AS (
    INSERT INTO approval_keys (tenant, caller, request_key, fingerprint, operation_id)
    SELECT c.tenant, %(caller)s, %(request_key)s, %(fingerprint)s, c.operation_id FROM created c
)
SELECT c.*, now() AS read_at FROM created c;

-- name: approval_key
-- The operation an application's Idempotency-Key made, and the fingerprint of its approval.
SELECT k.operation_id, k.fingerprint FROM approval_keys k
 WHERE k.tenant = %(tenant)s AND k.caller = %(caller)s AND k.request_key = %(request_key)s;

-- name: timeline_seen
-- Run on every new store connection, before it is used (proxy/store/store.py Store.open): the
-- timeline this primary writes on, recorded the first time it is greater than every one
-- recorded before, and then, in the same statement, every operation still created or dispatched
-- marked `lookup_before_send` (migration 0014): it may have been claimed and sent on the timeline
-- that a failover lost, so it is looked up at the provider before its next send; unless
-- unmarked_because is given: the proof (proxy/store/promotion.py, from timeline_facts) that
-- this switch lost no acknowledged claim, recorded with the timeline instead. Only on a
-- primary: a standby refuses any statement that writes, even one that writes nothing, so the
-- caller asks `ping` first.
-- The first timeline ever recorded marks nothing (no switch was seen). Safe when several
-- processes see the switch at once: the second insert of the same timeline waits for the
-- first's commit and inserts nothing, so it marks nothing either; a row created on the new
-- timeline meanwhile is not in this statement's snapshot, and it is not in doubt.
-- Returns the current timeline (NULL on a standby), the last one recorded before, and how
-- many operations were marked now (NULL: no new timeline was recorded by this statement).
WITH current_timeline AS (
    SELECT opgate_current_timeline() AS timeline_id
), last_seen AS (
    SELECT max(timeline_id) AS timeline_id FROM timelines
), doubted AS (
    SELECT o.operation_id, o.status FROM operations o, current_timeline c, last_seen l
     WHERE l.timeline_id IS NOT NULL AND c.timeline_id > l.timeline_id
       AND %(unmarked_because)s::text IS NULL
       AND opgate_unsettled(o.status) AND o.lookup_before_send IS NULL
), recorded AS (
    INSERT INTO timelines (timeline_id, marked, unmarked_because)
    SELECT c.timeline_id, (SELECT count(*) FROM doubted),
           CASE WHEN l.timeline_id IS NOT NULL THEN %(unmarked_because)s::text END
      FROM current_timeline c, last_seen l
     WHERE c.timeline_id IS NOT NULL AND (l.timeline_id IS NULL OR c.timeline_id > l.timeline_id)
    ON CONFLICT (timeline_id) DO NOTHING
    RETURNING timeline_id, seen_at, marked
), marked AS (
    -- next_reconcile_at cleared: a lookup is due now (a row whose attempts never left was
    -- left to its agent until expiry; it is not any more)
    UPDATE operations o SET lookup_before_send = r.seen_at, next_reconcile_at = NULL,
           updated_at = now(),
           audit_event = jsonb_build_object(
               'event', 'timeline_switched',
               'actor', coalesce(nullif(current_setting('opgate.instance_id', true), ''),
                                 'opgate'),
               'detail', jsonb_build_object('timeline', r.timeline_id,
                                            'previous_timeline',
                                            (SELECT timeline_id FROM last_seen)))
      FROM recorded r, doubted d
     WHERE o.operation_id = d.operation_id
    RETURNING o.operation_id, o.status
)
SELECT c.timeline_id AS current_timeline, l.timeline_id AS previous_timeline,
       (SELECT marked FROM recorded) AS marked
  FROM current_timeline c, last_seen l;

-- name: timeline_facts
-- What a new connection reads before timeline_seen, for the proof that a switch lost no
-- acknowledged claim (proxy/store/promotion.py): the timeline this server writes on (NULL on
-- a standby), the greatest one recorded before, the last synchronous witness of that one this
-- server has (record_sync_witness), whether it received its WAL by streaming
-- (pg_last_wal_receive_lsn() keeps its value after a promotion), and its primary_conninfo
-- (pg_settings shows no row for it to a role without pg_read_all_settings: NULL, not an
-- error).
WITH current_timeline AS (
    SELECT opgate_current_timeline() AS timeline_id
), last_seen AS (
    SELECT max(timeline_id) AS timeline_id FROM timelines
)
SELECT c.timeline_id AS current_timeline, l.timeline_id AS previous_timeline,
       pg_last_wal_receive_lsn() IS NOT NULL AS streamed,
       (SELECT nullif(setting, '') FROM pg_settings WHERE name = 'primary_conninfo')
           AS primary_conninfo,
       w.standby_names, w.wal_senders, w.statement_timeout, w.recorded_at AS witnessed_at
  FROM current_timeline c CROSS JOIN last_seen l
  LEFT JOIN sync_witness w ON w.timeline_id = l.timeline_id;

-- name: record_sync_witness
-- At every replication judgement on a primary: its synchronous_standby_names, the
-- application_name of each WAL sender connected now, and the statement_timeout opgate's
-- connections get from the server (its role's, its database's), for the timeline it writes on
-- (migration 0030). A promoted standby reads the last one it received to prove that it confirmed every
-- commit (timeline_facts). Committed without waiting for a standby (local): the proof needs
-- only the last witness the standby has, and a standby missing must not hang the judgement.
INSERT INTO sync_witness (timeline_id, standby_names, wal_senders, statement_timeout,
                          recorded_at, instance_id)
SELECT opgate_current_timeline(), current_setting('synchronous_standby_names'),
       coalesce((SELECT array_agg(application_name ORDER BY application_name)
                   FROM pg_stat_replication), '{}'),
       current_setting('statement_timeout'), now(),
       nullif(current_setting('opgate.instance_id', true), '')
 WHERE set_config('synchronous_commit', 'local', true) <> ''
ON CONFLICT (timeline_id) DO UPDATE
   SET standby_names = EXCLUDED.standby_names, wal_senders = EXCLUDED.wal_senders,
       statement_timeout = EXCLUDED.statement_timeout, recorded_at = EXCLUDED.recorded_at, instance_id = EXCLUDED.instance_id;

-- name: claim_operation
-- created -> dispatched, or a new attempt of a dispatched operation. Takes the in-flight lease
-- (owner, for lease_seconds) so that a crashed replica's claim expires. Revoked or expired
-- approvals never claim, nor does an escalated operation, whatever its status: a human decides.
-- proxy/gate/transitions.py decides the same transitions on the row as read (the gate's and
-- recovery's answers); tests/gate/test_transitions_agree.py checks that both agree.
-- A re-send is decided here, on the row as it is now, not on the caller's earlier read: the
-- attempt it follows (expected_attempts) must still be the last, no attempt or reconciliation may
-- be live, and the last attempt must be known to have had no effect at the provider:
--   it never left (not_sent), or
--   the provider still deduplicates its key (dedup_window_seconds: the retention, NULL if it does
--   not deduplicate; counted from creation, before which the key was never sent), or
--   the caller (after_lookup_by) holds a live reconciliation lease under which the provider's
--   complete list showed no effect (the lease is consumed: no other attempt could start meanwhile).
-- The decision it commits was made on a read of the row (proxy/gate/transitions.py), and it
-- commits only that decision: read_version, the row's updated_at as the decision read it (every
-- statement that writes the row moves it), must still be the row's, and decided_before, the
-- decision's deadline (the approval's expiry counted in), must not have passed. Zero rows is a
-- conflict, explained from a fresh read (proxy/gate/pipeline.py), never retried blindly. NULL:
-- no read to compare with (tests and tools that claim a row they did not decide on).
-- The claim's transaction waits for a synchronous standby whatever synchronous_commit the
-- server, database or role says (local or off would acknowledge a claim a failover can lose,
-- and its request would leave twice): set_config(..., true) lasts to the end of this
-- transaction, so it holds through PgBouncer's transaction pooling; remote_apply is kept.
-- It is in `named`'s WHERE, which every claim evaluates, so the planner cannot drop it.
-- `named` also locks the row before the UPDATE reads it: a claim that waited for the row (another
-- transaction locked it, or changed it and rolled back) then compares its conditions with the
-- time after the wait. Without it, PostgreSQL rechecks a waiting UPDATE's conditions only when
-- the row was changed and committed, and a decision could commit past its deadline.
-- A row marked lookup_before_send (a timeline switch put it in doubt: timeline_seen) is claimed
-- only by the holder (after_lookup_by) of a live reconciliation lease, under which the provider
-- showed no effect (proxy/gate/resend.py), whatever its status. The claim clears it.
-- Every time it compares with or records is clock_timestamp(): the time as the row is decided,
-- after any wait (for a budget's lock earlier in this transaction: claim_within_budgets; for the
-- row), never now(), the transaction's start: an approval that expired during the wait is not
-- claimed, and the lease and dispatched_at run from the claim itself.
WITH named AS (
    SELECT operation_id AS id FROM operations
     WHERE operation_id = %(operation_id)s
       AND set_config('synchronous_commit',
                      CASE current_setting('synchronous_commit')
                           WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true) <> ''
       FOR NO KEY UPDATE
), claimed AS (
    UPDATE operations
       SET status = 'dispatched', attempts = attempts + 1, dispatched_at = clock_timestamp(),
           lease_owner = %(owner)s,
           lease_until = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
           last_outcome = NULL, attempt_ended_at = NULL, reconcile_owner = NULL,
           reconcile_lease_until = NULL, next_reconcile_at = NULL, lookup_before_send = NULL,
           updated_at = clock_timestamp(),
           -- the row as it was: attempts + 1 is this attempt
           audit_event = jsonb_build_object(
               'event', 'claimed', 'actor', coalesce(%(actor)s::text, %(owner)s),
               'detail', jsonb_build_object('attempt', attempts + 1, 'lease_owner', %(owner)s)
                         || CASE WHEN %(after_lookup_by)s::text IS NULL THEN '{}'::jsonb
                                 ELSE jsonb_build_object('after_lookup',
                                                         %(after_lookup_by)s::text) END)
     WHERE operation_id = (SELECT id FROM named)
       AND revoked_at IS NULL AND expires_at > clock_timestamp() AND escalated_at IS NULL
       AND (lookup_before_send IS NULL
            OR (reconcile_owner = %(after_lookup_by)s AND reconcile_lease_until > clock_timestamp()))
       AND (status = 'created'
            OR (status = 'dispatched' AND attempts = %(expected_attempts)s
                AND opgate_lease_free_v2(lease_until)
                AND ((opgate_lease_free_v2(reconcile_lease_until)
                      AND (last_outcome = 'not_sent'
                           OR (%(dedup_window_seconds)s::float8 IS NOT NULL
                               AND clock_timestamp() < created_at
                                           + make_interval(secs => %(dedup_window_seconds)s))))
                     OR (reconcile_owner = %(after_lookup_by)s
                         AND reconcile_lease_until > clock_timestamp()))))
       AND (%(read_version)s::timestamptz IS NULL OR updated_at = %(read_version)s)
       AND (%(decided_before)s::timestamptz IS NULL OR clock_timestamp() < %(decided_before)s)
    RETURNING *
)
SELECT c.*, clock_timestamp() AS read_at FROM claimed c;

-- name: advisory_lock
-- Waits for one advisory lock, held until the transaction ends: the key of proxy/store/locks.py,
-- kind (what the lock serialises: LockKind) and key (its name's hash). Claims on one budget take
-- turns so (the lock taken in the claim's transaction before the sum below: the sum then sees
-- every claim that went before, and no claim can commit between this one's sum and its UPDATE),
-- as do an open mandate's uses and a tenant's proposals. Released at commit or rollback.
SELECT pg_advisory_xact_lock(%(kind)s::int4, %(key)s::int4);

-- name: previous_release_lock
-- The lock the release before the two-int key space took for the same budget, open mandate or
-- tenant's proposals (proxy/store/locks.py): held with the new one while processes of both
-- releases may run, so that a rolling deploy never lets one claim of each pass a limit.
SELECT pg_advisory_xact_lock(hashtextextended(%(lock_name)s, 0));

-- name: advisory_try_lock
-- The advisory lock of advisory_lock if no other transaction holds it (then true), held until
-- the transaction ends; false at once if one does.
SELECT pg_try_advisory_xact_lock(%(kind)s::int4, %(key)s::int4) AS locked;

-- name: budget_spent
-- What counts against one budget: the amounts of the provider's operations in the currency
-- (tenant and agent_id, NULL: any) that were claimed (dispatched: in flight or unknown, the money
-- may have moved; or confirmed), whose last attempt was claimed in the last window_seconds
-- seconds, and that spend (opgate_spends, migration 0024: a revocation after something may have
-- been sent leaves nothing out). The window ends at this statement's start, which is after the
-- budget's lock was taken (statement_timestamp(), not now(): the claim's transaction began
-- before it waited; a stable bound, so the index's range still applies).
-- excluding is left out (the operation being claimed: a re-send must not count its own amount
-- twice).
SELECT coalesce(sum(amount), 0)::bigint AS spent FROM operations
 WHERE provider = %(provider)s AND currency = %(currency)s AND status IN ('dispatched', 'confirmed')
   AND opgate_spends(status, attempts, unsent_attempts, revoked_at, lookup_before_send)
   AND dispatched_at > statement_timestamp() - make_interval(secs => %(window_seconds)s)
   AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
   AND (%(agent_id)s::text IS NULL OR agent_id = %(agent_id)s)
   AND (%(excluding)s::text IS NULL OR operation_id <> %(excluding)s)
   AND amount IS NOT NULL;

-- name: budget_spent_by_key
-- The same sums for every tenant (by_tenant true) and agent (by_agent true) that has spent anything
-- in the window, for reads of the remaining budgets (the API, /metrics); never for a decision.
SELECT CASE WHEN %(by_tenant)s::bool THEN tenant END AS tenant,
       CASE WHEN %(by_agent)s::bool THEN agent_id END AS agent_id,
       sum(amount)::bigint AS spent
  FROM operations
 WHERE provider = %(provider)s AND currency = %(currency)s AND status IN ('dispatched', 'confirmed')
   AND opgate_spends(status, attempts, unsent_attempts, revoked_at, lookup_before_send)
   AND dispatched_at > statement_timestamp() - make_interval(secs => %(window_seconds)s)
   AND amount IS NOT NULL
   AND (NOT %(by_agent)s::bool OR agent_id IS NOT NULL)
 GROUP BY 1, 2
 ORDER BY 1, 2;
-- name: record_precondition_failed
-- The rule's preconditions did not hold before a send that nothing had gone before (the first,
-- or a re-send after attempts that all ended not_sent): nothing was sent and the row keeps its
-- status (no transition); the lookup's evidence (evidence) is kept as its event, which the recovery
-- read answers from (new_approval_required). Only while nothing of the operation has left and
-- no attempt is in flight.
-- The row is updated only to write the record (its updated_at, which a claim's read_version
-- compares, stays). Returns the record's seq in the operation's stream.
UPDATE operations
   SET audit_event = jsonb_build_object('event', 'precondition_failed', 'actor', %(actor)s::text,
                                        'detail', %(evidence)s::jsonb)
 WHERE operation_id = %(operation_id)s
   AND opgate_nothing_left_yet(status, attempts, unsent_attempts)
   AND opgate_lease_free_v2(lease_until)
RETURNING audit_seq;

-- name: precondition_failures
-- The latest precondition_failed evidence of each of the operations operation_ids of which nothing
-- has left (what their recovery read shows): still created, or dispatched with every attempt ended
-- not_sent and the failure after the last claim (a later lookup that held let that claim go).
SELECT DISTINCT ON (e.operation_id) e.operation_id, e.detail
  FROM operation_events e JOIN operations o USING (operation_id)
 WHERE e.operation_id = ANY(%(operation_ids)s::text[]) AND e.event = 'precondition_failed'
   AND opgate_nothing_left_yet(o.status, o.attempts, o.unsent_attempts)
   AND (o.status = 'created' OR e.at > o.dispatched_at)
 ORDER BY e.operation_id, e.event_id DESC;

-- name: settle_operation
-- dispatched -> confirmed | failed, from the provider's answer only. Any attempt's answer
-- settles: with a deduplicating provider every attempt reports the same effect. Returns only
-- the status settled: the row's other columns (the answer just written among them) are
-- known to the caller, and would cross the connection again for nothing.
-- request: the record of the agent request this answer came to (a JSON object, or NULL), which
-- the row's trigger writes after the transition's, in the operation's stream (migration 0022).
WITH settled AS (
    UPDATE operations
       SET status = %(status)s, last_outcome = %(status)s, provider_status = %(provider_status)s,
           provider_object_id = %(object_id)s, response_content_type = %(content_type)s,
           response_body = %(body)s, settled_at = clock_timestamp(),
           settled_reason = 'provider_answer', attempt_ended_at = clock_timestamp(),
           lease_owner = NULL, lease_until = NULL, updated_at = clock_timestamp(),
           audit_event = jsonb_build_object(
               'event', %(status)s::text, 'actor', %(actor)s::text,
               'detail', jsonb_build_object('attempt', attempts,
                                            'provider_status', %(provider_status)s::integer,
                                            'object_id', %(object_id)s::text)),
           audit_request = %(request)s::jsonb
     WHERE operation_id = %(operation_id)s AND status = 'dispatched'
    RETURNING status
)
SELECT s.status FROM settled s;

-- name: release_unknown
-- The attempt ended without a conclusive answer: the row STAYS dispatched, the lease is
-- released and the reason kept. Only the attempt that holds the lease (attempt) may release it.
-- An attempt that ended before a byte left (outcome not_sent) is counted in unsent_attempts.
-- owner, when given: the claim's own lease owner, for a claim whose statement was cut off
-- (proxy/gate/cutoff.py): only that claim, if it committed at all, and only while its attempt
-- has no recorded end.
-- Returns only the status (dispatched), as settle_operation does; request: as settle_operation's.
WITH released AS (
    UPDATE operations
       SET lease_owner = NULL, lease_until = NULL, last_outcome = %(outcome)s,
           provider_status = %(provider_status)s,
           attempt_ended_at = clock_timestamp(), updated_at = clock_timestamp(),
           unsent_attempts = unsent_attempts
                             + (CASE WHEN %(outcome)s = 'not_sent' THEN 1 ELSE 0 END),
           audit_event = jsonb_build_object(
               'event', 'unknown', 'actor', %(actor)s::text,
               'detail', jsonb_build_object('attempt', attempts, 'outcome', %(outcome)s::text,
                                            'provider_status', %(provider_status)s::integer)),
           audit_request = %(request)s::jsonb
     WHERE operation_id = %(operation_id)s AND status = 'dispatched' AND attempts = %(attempt)s
       AND (%(owner)s::text IS NULL OR (lease_owner = %(owner)s AND attempt_ended_at IS NULL))
    RETURNING status
)
SELECT r.status FROM released r;

-- name: revoke_operation
-- Withdraw the approval of an unsettled operation (created or dispatched): no attempt of it is
-- claimed any more. It never changes status and un-sends nothing: the event says whether
-- nothing of it was sent (nothing_sent, opgate_nothing_sent); if anything may have been, it
-- still counts against its budgets (opgate_spends). A settled operation (confirmed or failed)
-- is not revoked: nothing is left to stop, and a revocation would read as an un-send. Zero rows:
-- unknown, settled, or revoked already (the caller reads which).
WITH revoked AS (
    UPDATE operations
       SET revoked_at = clock_timestamp(), revoked_reason = %(reason)s,
           updated_at = clock_timestamp(),
           audit_event = jsonb_build_object(
               'event', 'revoked', 'actor', %(actor)s::text,
               'detail', jsonb_build_object(
                   'reason', %(reason)s::text,
                   'nothing_sent',
                   opgate_nothing_sent(status, attempts, unsent_attempts, lookup_before_send)))
     WHERE operation_id = %(operation_id)s AND revoked_at IS NULL AND opgate_unsettled(status)
    RETURNING *
)
SELECT r.*, clock_timestamp() AS read_at FROM revoked r;

-- name: revoke_unsent_operation
-- Withdraw the approval of an operation nothing was sent of (still created: never claimed here,
-- and not in doubt after a failover: opgate_nothing_sent), for an agent's tasks/cancel; zero
-- rows: it was claimed (or revoked) first, or may have been sent on a lost timeline.
WITH revoked AS (
    UPDATE operations
       SET revoked_at = clock_timestamp(), revoked_reason = %(reason)s,
           updated_at = clock_timestamp(),
           audit_event = jsonb_build_object(
               'event', 'revoked', 'actor', %(actor)s::text,
               'detail', jsonb_build_object('reason', %(reason)s::text, 'nothing_sent', true))
     WHERE operation_id = %(operation_id)s AND revoked_at IS NULL AND status = 'created'
       AND opgate_nothing_sent(status, attempts, unsent_attempts, lookup_before_send)
    RETURNING *
)
SELECT r.*, clock_timestamp() AS read_at FROM revoked r;

-- name: escalated_operations
-- The escalation queue (the operations API's and the console's): operations of a tenant (NULL:
-- all) waiting on a human (dispatched, or created and in doubt after a timeline switch),
-- oldest escalation first.
SELECT o.*, now() AS read_at FROM operations o
 WHERE opgate_unsettled(o.status) AND o.escalated_at IS NOT NULL
   AND (%(tenant)s::text IS NULL OR o.tenant = %(tenant)s)
 ORDER BY o.escalated_at, o.operation_id
 LIMIT %(limit)s;

-- name: list_operations
-- Operations of a tenant (NULL for all) in the given statuses, oldest first.
SELECT o.*, now() AS read_at FROM operations o
 WHERE (%(tenant)s::text IS NULL OR o.tenant = %(tenant)s) AND o.status = ANY(%(statuses)s::text[])
   AND (%(agent_id)s::text IS NULL OR o.agent_id IS NULL OR o.agent_id = %(agent_id)s)
 ORDER BY o.created_at, o.operation_id
 LIMIT %(limit)s;

-- name: claim_reconcile_one
-- Take the reconciliation lease of one dispatched operation whose attempt is over, so that no
-- two replicas (or a replica and a re-send) act on it at once. Paced: not before
-- next_reconcile_at, whoever asks (an agent polling, a re-send, an admin), so no caller can
-- multiply lookups made with opgate's provider credential. With in_doubt true, also a created row
-- that a timeline switch put in doubt (lookup_before_send): the lookup before its first send here
-- (proxy/gate/resend.py). Reconciliation (in_doubt false) never takes a created row: absence there
-- means "send it", not "failed". unchanged_since, when given: the row's updated_at as a
-- decision that asks read it (claim_operation's read_version); the lease is taken only on the
-- row unchanged since, and the claim then needs it unchanged since the lease.
WITH taken AS (
    UPDATE operations
       SET reconcile_owner = %(owner)s,
           reconcile_lease_until = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
           updated_at = clock_timestamp()
     WHERE operation_id = %(operation_id)s AND escalated_at IS NULL
       AND (status = 'dispatched'
            OR (%(in_doubt)s::bool AND status = 'created' AND lookup_before_send IS NOT NULL))
       AND (%(unchanged_since)s::timestamptz IS NULL OR updated_at = %(unchanged_since)s)
       AND opgate_lease_free_v2(lease_until) AND opgate_lease_free_v2(reconcile_lease_until)
       AND (next_reconcile_at IS NULL OR next_reconcile_at <= clock_timestamp())
    RETURNING *
)
SELECT t.*, clock_timestamp() AS read_at FROM taken t;

-- name: claim_reconcile_batch
-- The background loop's pick: due, unleased, dispatched operations, escalated ones included
-- (they are looked up at their own, lower rate: an effect the provider shows settles them);
-- SKIP LOCKED keeps replicas from waiting on (or picking) each other's rows.
WITH due AS (
    SELECT operation_id FROM operations
     WHERE status = 'dispatched'
       AND opgate_lease_free_v2(lease_until) AND opgate_lease_free_v2(reconcile_lease_until)
       AND (next_reconcile_at IS NULL OR next_reconcile_at <= clock_timestamp())
     ORDER BY dispatched_at
     LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE operations o
       SET reconcile_owner = %(owner)s,
           reconcile_lease_until = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
           updated_at = clock_timestamp()
      FROM due WHERE o.operation_id = due.operation_id
    RETURNING o.*
)
SELECT t.*, clock_timestamp() AS read_at FROM taken t;

-- name: settle_reconciled
-- dispatched -> confirmed | failed from the provider's own record, by the holder (owner) of a
-- reconciliation lease that is still live, while no attempt is in flight and none has started
-- since the lookup began (expected_attempts: the attempts it saw). A lapsed lease or a newer
-- attempt makes the lookup's answer stale: zero rows. Settling an escalated operation tells the
-- humans.
-- A created row in doubt after a timeline switch (lookup_before_send) is settled the same way
-- when the lookup finds its effect (claim_reconcile_one in_doubt): it was sent on the lost
-- timeline.
-- unchanged_since, when given: the row's updated_at as the lease was taken (the version the
-- lookup judged). A settle on absence ("no effect") needs it: a cut-off claim released as
-- never sent meanwhile (release_unknown, proxy/gate/cutoff.py) moved it, and the stale
-- absence would burn an approval that nothing used (measured: 14 of 42 cut-off claims).
WITH settled AS (
    UPDATE operations
       SET status = %(status)s, last_outcome = %(status)s, settled_reason = %(reason)s,
           provider_object_id = %(object_id)s, provider_status = %(provider_status)s,
           response_content_type = %(content_type)s, response_body = %(body)s,
           settled_at = clock_timestamp(), reconcile_owner = NULL, reconcile_lease_until = NULL,
           lookup_before_send = NULL, updated_at = clock_timestamp(),
           audit_event = jsonb_build_object('event', 'reconciled', 'actor', %(owner)s::text,
                                            'detail', %(evidence)s::jsonb)
     WHERE operation_id = %(operation_id)s AND reconcile_owner = %(owner)s
       AND (status = 'dispatched' OR (status = 'created' AND lookup_before_send IS NOT NULL))
       AND reconcile_lease_until > clock_timestamp() AND attempts = %(expected_attempts)s
       AND opgate_lease_free_v2(lease_until)
       AND (%(unchanged_since)s::timestamptz IS NULL OR updated_at = %(unchanged_since)s)
    RETURNING *
), notification AS (
    INSERT INTO escalation_notifications (operation_id, kind)
    SELECT operation_id, 'settled_by_provider' FROM settled WHERE escalated_at IS NOT NULL
)
SELECT s.*, clock_timestamp() AS read_at FROM settled s;

-- name: reconcile_inconclusive
-- The lookup settled nothing: count the try, release the lease, say when to look again. Only
-- by the lease's holder (owner), and only for the attempt it looked up (expected_attempts); a
-- created row only in doubt after a timeline switch (its lookup before the send).
WITH noted AS (
    UPDATE operations
       SET reconcile_attempts = reconcile_attempts + 1, reconcile_owner = NULL,
           reconcile_lease_until = NULL,
           next_reconcile_at = clock_timestamp() + make_interval(secs => %(retry_in_seconds)s),
           updated_at = clock_timestamp(),
           audit_event = jsonb_build_object('event', 'reconcile_inconclusive',
                                            'actor', %(owner)s::text,
                                            'detail', %(evidence)s::jsonb)
     WHERE operation_id = %(operation_id)s AND reconcile_owner = %(owner)s
       AND (status = 'dispatched' OR (status = 'created' AND lookup_before_send IS NOT NULL))
       AND attempts = %(expected_attempts)s
    RETURNING *
)
SELECT n.*, clock_timestamp() AS read_at FROM noted n;

-- name: escalate_operation
-- A human must decide. Stays dispatched; the notification is queued in the same statement.
-- By the holder (owner) of a live reconciliation lease for the attempt it looked up
-- (expected_attempts), or without one (owner NULL) by actor (NULL: an admin). The provider is still
-- looked up, every look_again_seconds seconds: an effect it shows later settles the operation
-- (absence never does; that stays with the human). A created row in doubt after a timeline switch
-- (lookup_before_send) whose rule declares no lookup is escalated too, without a lease: it may have
-- been sent on the lost timeline, and nothing can ask; it stays created, and no claim takes it any
-- more.
WITH escalated AS (
    UPDATE operations
       SET escalated_at = clock_timestamp(), escalation_reason = %(reason)s, reconcile_owner = NULL,
           reconcile_lease_until = NULL,
           next_reconcile_at = clock_timestamp() + make_interval(secs => %(look_again_seconds)s),
           updated_at = clock_timestamp(),
           audit_event = jsonb_build_object(
               'event', 'escalated', 'actor', coalesce(%(owner)s::text, %(actor)s::text, 'admin'),
               'detail', %(evidence)s::jsonb || jsonb_build_object('reason', %(reason)s::text))
     WHERE operation_id = %(operation_id)s AND escalated_at IS NULL
       AND (status = 'dispatched' OR (status = 'created' AND lookup_before_send IS NOT NULL))
       AND (%(owner)s::text IS NULL
            OR (reconcile_owner = %(owner)s AND reconcile_lease_until > clock_timestamp()
                AND attempts = %(expected_attempts)s))
    RETURNING *
), notification AS (
    INSERT INTO escalation_notifications (operation_id) SELECT operation_id FROM escalated
)
SELECT e.*, clock_timestamp() AS read_at FROM escalated e;

-- name: resolve_operation
-- A human verdict settles a dispatched operation: confirmed (with the provider's object id)
-- or failed (no effect). Never while an attempt is in flight. Also a created row escalated
-- after a timeline switch (escalate_operation): the human says whether the lost timeline sent it.
WITH resolved AS (
    UPDATE operations
       SET status = %(status)s, last_outcome = %(status)s, settled_reason = 'human_verdict',
           provider_object_id = coalesce(%(object_id)s, provider_object_id),
           resolution_note = %(note)s,
           settled_at = clock_timestamp(), reconcile_owner = NULL, reconcile_lease_until = NULL,
           lookup_before_send = NULL, updated_at = clock_timestamp(),
           audit_event = jsonb_build_object(
               'event', 'resolved', 'actor', %(actor)s::text,
               'detail', jsonb_build_object('verdict', %(status)s::text,
                                            'object_id', %(object_id)s::text,
                                            'note', %(note)s::text))
     WHERE operation_id = %(operation_id)s
       AND (status = 'dispatched' OR (status = 'created' AND escalated_at IS NOT NULL))
       AND opgate_lease_free_v2(lease_until)
    RETURNING *
)
SELECT r.*, clock_timestamp() AS read_at FROM resolved r;

-- name: release_reconcile
-- Give back a reconciliation lease that was taken but not used (a re-send that, after its
-- lookup, could not claim): the next caller need not wait for it to lapse.
UPDATE operations
   SET reconcile_owner = NULL, reconcile_lease_until = NULL, updated_at = clock_timestamp()
 WHERE operation_id = %(operation_id)s AND reconcile_owner = %(owner)s;

-- name: claim_notifications
-- Notifications (of an operation's escalation or of a pending proposal) due for delivery, leased so
-- one replica sends each at a time.
WITH due AS (
    SELECT notification_id FROM escalation_notifications
     WHERE delivered_at IS NULL AND next_attempt_at <= now() AND opgate_lease_free_v2(lease_until)
     ORDER BY notification_id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE escalation_notifications n
   SET lease_until = now() + make_interval(secs => %(lease_seconds)s), attempts = attempts + 1
  FROM due WHERE n.notification_id = due.notification_id
RETURNING n.notification_id, n.operation_id, n.proposal_id, n.attempts, n.kind;

-- name: notification_delivered
UPDATE escalation_notifications SET delivered_at = now(), lease_until = NULL, last_error = NULL
 WHERE notification_id = %(notification_id)s;

-- name: notification_failed
-- Retry later with backoff (retry_in_seconds seconds); never blocks a request.
UPDATE escalation_notifications
   SET lease_until = NULL, next_attempt_at = now() + make_interval(secs => %(retry_in_seconds)s),
       last_error = %(error)s
 WHERE notification_id = %(notification_id)s;

-- name: operation_events
-- One operation's transitions, oldest first.
SELECT event_id, at, event, from_status, to_status, actor, detail
  FROM operation_events WHERE operation_id = %(operation_id)s ORDER BY event_id;

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
-- The tamper-evident audit log (migration 0003, docs/audit.md, proxy/observe/auditlog/). Chaining
-- is done in the database (the audit_log trigger, and opgate_audit_append_batch for a larger
-- batch: migration 0010); these queries only append, checkpoint and read.

-- name: audit_append_batch
-- Records of one stream (and kind), in order: a JSON array of record objects (records). One
-- statement per batch; the trigger chains each row (a few records: see the next query).
INSERT INTO audit_log (stream, seq, kind, operation_id, record, prev_hash, hash)
SELECT %(stream)s, 0, %(kind)s, r.value ->> 'operation_id', r.value, '\x', '\x'
  FROM jsonb_array_elements(%(records)s::jsonb) WITH ORDINALITY AS r (value, position)
 ORDER BY r.position;

-- name: audit_append_many
-- The same for a larger batch: chained by one function (migration 0010) that locks and moves
-- the stream's head once, instead of the trigger moving it once per row.
SELECT opgate_audit_append_batch(%(stream)s, %(kind)s, %(records)s::jsonb);

-- name: audit_append_requests
-- A batch of one instance's request records (stream, kind, records: a JSON array)
-- and its run's trace (run, migration 0012) in one statement; many: chained by one function (a
-- batch of records.MANY_RECORDS or more) rather than by the trigger row by row. Records an
-- earlier attempt of the batch stored (its commit's answer lost) are skipped, exactly, under
-- the run's row lock; returns how many were (migration 0015).
SELECT opgate_audit_append_requests(%(stream)s, %(kind)s, %(records)s::jsonb, %(run)s::jsonb,
                                    %(many)s);

-- name: audit_run_seen
-- A run's trace while it has nothing to store, and at its clean stop (run with "stopped": true).
SELECT opgate_audit_run_seen(%(run)s::jsonb);

-- name: audit_runs_unaccounted
-- Runs whose tail the stored records cannot vouch for: not stopped cleanly, or stopped with
-- numbers never stored. `running`: no stop, and a trace within heartbeats heartbeats of now (a
-- running run leaves one at least every heartbeat); otherwise it ended without a clean stop.
SELECT run_id, instance_id, stream, started_at, numbered_seq, stored_seq, last_seen_at,
       stopped_at, stopped_at IS NULL
           AND last_seen_at >= now() - make_interval(secs => %(heartbeats)s * heartbeat_seconds)
           AS running,
       extract(epoch FROM now() - last_seen_at)::double precision AS seconds_since_seen
  FROM audit_instance_runs
 WHERE stopped_at IS NULL OR numbered_seq > stored_seq
 ORDER BY started_at, run_id;

-- name: audit_set_instance_policy
-- The policy set (policy_version) this instance (instance_id) now decides with: transition records
-- name it.
INSERT INTO audit_instances (instance_id, policy_version)
VALUES (%(instance_id)s, %(policy_version)s)
ON CONFLICT (instance_id) DO UPDATE SET policy_version = %(policy_version)s, loaded_at = now();

-- name: audit_take_changed_heads
-- The heads that moved since the last checkpoint, marked as taken in the same statement (the
-- caller holds the checkpoint writers' lock, LockKind.AUDIT_CHECKPOINT: one writer per replica,
-- rarely; request traffic never takes it). An operation's head is on its row (migration 0020): it
-- moved if its stream has a record that the last checkpoint's snapshot did not see (by the
-- inserting transaction, audit_log.txid; the floor is that snapshot's xmin, for the BRIN
-- index); this statement's snapshot is kept for the next. Every other stream's head is in
-- audit_heads, marked by checkpointed_seq. An operation head left in audit_heads by 0020
-- (moved before it and not signed yet) is signed once and removed, unless its row's head moved.
WITH state AS (
    SELECT seen FROM audit_checkpoint_state FOR UPDATE
), moved AS (
    SELECT DISTINCT a.stream
      FROM audit_log a, state s
     WHERE COALESCE(a.txid, 0) >= pg_snapshot_xmin(s.seen)::text::bigint
       AND a.kind = 'transition'
       AND NOT pg_visible_in_snapshot(a.txid::text::xid8, s.seen)
), kept AS (
    UPDATE audit_checkpoint_state SET seen = pg_current_snapshot()
), left_by_0020 AS (
    -- (0020 removed those already signed; the partial index finds the others)
    DELETE FROM audit_heads h USING operations o
     WHERE h.seq > h.checkpointed_seq AND h.stream = o.operation_id
    RETURNING h.stream, h.seq, h.hash
), changed AS (
    UPDATE audit_heads h SET checkpointed_seq = h.seq
     WHERE h.seq > h.checkpointed_seq
       AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.operation_id = h.stream)
    RETURNING h.stream, h.seq, h.hash
)
SELECT stream, seq, hash FROM changed
UNION ALL
SELECT o.operation_id, o.audit_seq, o.audit_hash
  FROM operations o JOIN moved m ON o.operation_id = m.stream
UNION ALL
SELECT l.stream, l.seq, l.hash FROM left_by_0020 l
 WHERE l.stream NOT IN (SELECT stream FROM moved)
 ORDER BY stream;

-- name: audit_last_checkpoint
SELECT checkpoint_id, mac FROM audit_checkpoints ORDER BY checkpoint_id DESC LIMIT 1;

-- name: audit_insert_checkpoint
INSERT INTO audit_checkpoints (at, writer, heads, prev_mac, mac)
VALUES (%(at)s, %(writer)s, %(heads)s::jsonb, %(prev_mac)s, %(mac)s)
RETURNING checkpoint_id;

-- name: audit_checkpoints
-- Every checkpoint, oldest first (the verifier re-derives the MAC chain).
SELECT checkpoint_id, at, writer, heads::text AS heads, prev_mac, mac
  FROM audit_checkpoints ORDER BY checkpoint_id;

-- name: audit_records_between
-- Records recorded in [since, until), with the stored hash of each one's predecessor in its stream
-- (NULL when the predecessor is missing), earliest first.
SELECT a.stream, a.seq, a.at, a.kind, a.operation_id, a.record::text AS record, a.prev_hash,
       a.hash, p.hash AS predecessor_hash
  FROM audit_log a
  LEFT JOIN audit_log p ON p.stream = a.stream AND p.seq = a.seq - 1
 WHERE a.at >= %(since)s AND a.at < %(until)s
 ORDER BY a.at, a.stream, a.seq;

-- name: audit_records_at
-- The records named by checkpoint claims: [[stream, seq], ...] (positions).
SELECT c.value ->> 0 AS stream, (c.value ->> 1)::bigint AS seq, a.hash
  FROM jsonb_array_elements(%(positions)s::jsonb) AS c (value)
  LEFT JOIN audit_log a ON a.stream = c.value ->> 0 AND a.seq = (c.value ->> 1)::bigint;

-- name: audit_heads_mismatched
-- Streams whose head (an operation's on its row, the others' in audit_heads: the view of
-- migration 0020) does not match their last record (a tail deleted or appended around the
-- chain).
SELECT h.stream, h.seq AS head_seq, h.hash AS head_hash, l.seq AS last_seq
  FROM audit_stream_heads h
  LEFT JOIN LATERAL (SELECT max(seq) AS seq FROM audit_log a WHERE a.stream = h.stream) l ON true
  LEFT JOIN audit_log last ON last.stream = h.stream AND last.seq = l.seq
 WHERE l.seq IS DISTINCT FROM h.seq OR last.hash IS DISTINCT FROM h.hash;

-- name: audit_request_numbering
-- The numbering of each instance's request records (`instance_seq`, docs/audit.md), per
-- request stream and per run of its writer (a `started` record begins a run; records before
-- the first one are run 0, what is left of a run whose beginning was pruned): the numbers no
-- stored record carries (missing), those carried twice (duplicate), and those a `dropped`
-- record declares lost before storage (dropped). In run 0, numbers up to the stream's
-- retention floor (floors: {"stream": floor, ...}) were pruned and are not expected. A run's
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
           CASE WHEN n.run = 0 THEN coalesce((%(floors)s::jsonb ->> n.stream)::bigint, 0) ELSE 0 END
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
-- (cuts: [[stream, seq], ...], the heads signed by the checkpoints it goes through).
SELECT a.stream, a.seq, a.at, a.kind, a.operation_id, a.record::text AS record, a.prev_hash,
       a.hash
  FROM jsonb_array_elements(%(cuts)s::jsonb) AS c (value)
  JOIN audit_log a ON a.stream = c.value ->> 0 AND a.seq <= (c.value ->> 1)::bigint
 ORDER BY a.stream, a.seq;

-- name: audit_prune
-- Removes them, in the transaction that appends the prune's own record; returns how many.
WITH gone AS (
    DELETE FROM audit_log a
     USING jsonb_array_elements(%(cuts)s::jsonb) AS c (value)
     WHERE a.stream = c.value ->> 0 AND a.seq <= (c.value ->> 1)::bigint
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: audit_operation_records
-- One operation's audit records (its transitions and the agent requests that named it).
SELECT stream, seq, at, kind, operation_id, record::text AS record, prev_hash, hash
  FROM audit_log WHERE operation_id = %(operation_id)s ORDER BY at, stream, seq;

-- name: metrics_operations
-- Scrape-time gauges: unsettled operations by status (the partial index), those dispatched
-- longer than dispatched_after_seconds seconds, open escalations, and proposals waiting for a human
-- (unexpired).
SELECT
    count(*) FILTER (WHERE status = 'created') AS created,
    count(*) FILTER (WHERE status = 'dispatched') AS dispatched,
    count(*) FILTER (WHERE status = 'dispatched'
                       AND dispatched_at < now()
                                           - make_interval(secs => %(dispatched_after_seconds)s))
        AS dispatched_old,
    count(*) FILTER (WHERE escalated_at IS NOT NULL) AS escalated,
    (SELECT count(*) FROM proposals
      WHERE status = 'pending' AND expires_at > now()) AS proposals_pending
  FROM operations WHERE opgate_unsettled(status);

-- name: audit_records_after
-- Export with a cursor: the records of each stream after the seq the cursor holds for it
-- (cursor: {"stream": seq, ...}; a stream it does not name starts at 0), at most limit of them. A
-- stream's seq is given by its head, under the head's row lock, at insert: within a stream,
-- seq order is commit order, and a record that commits late still gets a seq after every
-- record already visible in its stream. So a per-stream cursor never skips a record (a window
-- by `at`, the transaction's start, can). Ordered by stream then seq so a page ends on a
-- consistent cursor.
SELECT a.stream, a.seq, a.at, a.kind, a.operation_id, a.record::text AS record, a.prev_hash,
       a.hash
  FROM audit_log a
 WHERE a.seq > coalesce((%(cursor)s::jsonb ->> a.stream)::bigint, 0)
 ORDER BY a.stream, a.seq
 LIMIT %(limit)s;

-- name: audit_reviewer_grants
-- The statements that make the role a read-only audit reviewer: it may read the audit tables
-- (what `opgate audit verify|show|export|verify-tree|prove|bundle` read) and nothing else: not
-- the operations (their idempotency keys and parameters), and it can write nothing. PostgreSQL quotes the name.
SELECT format(statement, current_schema(), %(role)s::text) AS statement
  FROM (VALUES
    (1, 'GRANT USAGE ON SCHEMA %I TO %I'),
    (2, 'GRANT SELECT ON %1$I.audit_log, %1$I.audit_heads, %1$I.audit_stream_heads,'
        ' %1$I.audit_checkpoints,'
        ' %1$I.audit_instances, %1$I.audit_instance_runs, %1$I.transparency_leaves,'
        ' %1$I.transparency_nodes, %1$I.transparency_checkpoints,'
        ' %1$I.transparency_cosignatures, %1$I.transparency_heads,'
        ' %1$I.transparency_head_buckets TO %2$I')
  ) AS g (position, statement)
 ORDER BY position;
-- =============================================================================== end audit

-- ================================================================================== console
-- The web console (proxy/console/): its sessions (migration 0006) and its reads.

-- name: console_session_create
-- A new session (digest: SHA-256 of the cookie value, role, identity, csrf_token, for seconds
-- lifetime in seconds); expired sessions are cleared in the same statement.
WITH expired AS (
    DELETE FROM console_sessions WHERE expires_at <= now()
)
INSERT INTO console_sessions (session_digest, role, identity, csrf_token, expires_at)
VALUES (%(digest)s, %(role)s, %(identity)s, %(csrf_token)s,
        now() + make_interval(secs => %(seconds)s));

-- name: console_session_load
-- The live session whose cookie hashes to digest (none once expired).
SELECT role, identity, csrf_token FROM console_sessions
 WHERE session_digest = %(digest)s AND expires_at > now();

-- name: console_session_delete
DELETE FROM console_sessions WHERE session_digest = %(digest)s;

-- name: console_operations
-- Operations in the statuses, of the tenant and provider (NULL: any), created at least
-- older_than_seconds seconds ago (NULL: any age), newest first, at most limit.
SELECT o.*, now() AS read_at FROM operations o
 WHERE o.status = ANY(%(statuses)s::text[])
   AND (%(tenant)s::text IS NULL OR o.tenant = %(tenant)s)
   AND (%(provider)s::text IS NULL OR o.provider = %(provider)s)
   AND (%(older_than_seconds)s::float8 IS NULL
        OR o.created_at <= now() - make_interval(secs => %(older_than_seconds)s))
 ORDER BY o.created_at DESC, o.operation_id
 LIMIT %(limit)s;

-- name: console_notifications
-- One operation's escalation notices and their delivery.
SELECT notification_id, kind, created_at, attempts, delivered_at, last_error
  FROM escalation_notifications WHERE operation_id = %(operation_id)s ORDER BY notification_id;

-- name: console_last_checkpoint
-- The newest checkpoint: when, by whom, and how many chain heads it signed.
SELECT checkpoint_id, at, writer, jsonb_array_length(heads) AS heads, mac
  FROM audit_checkpoints ORDER BY checkpoint_id DESC LIMIT 1;
-- name: console_dashboard
-- The line atop every console page: how many operations wait on a human (the escalation
-- queue's condition, as escalated_operations) and how long the oldest has, how many proposals
-- wait for a decision (pending and not expired), and when the newest checkpoint was signed.
WITH waiting AS (
    SELECT count(*) AS escalations, now() - min(escalated_at) AS oldest
      FROM operations
     WHERE status IN ('created', 'dispatched') AND escalated_at IS NOT NULL
)
SELECT w.escalations,
       extract(epoch FROM w.oldest)::float8 AS oldest_escalation_seconds,
       (SELECT count(*) FROM proposals
         WHERE status = 'pending' AND expires_at > now()) AS pending_proposals,
       (SELECT max(at) FROM audit_checkpoints) AS last_checkpoint_at
  FROM waiting w;
-- ============================================================================== end console

-- ================================================================================ proposals
-- Proposals (migration 0009, proxy/proposals/rules.py): an agent asks for the approval of
-- the exact request it intends; a human approves or declines it. Each transition is one
-- conditional statement that writes its proposal_events row (chained into the audit log by
-- the trigger) in the same round trip. A pending proposal past expires_at is expired: no
-- transition takes it out of pending any more.

-- name: proposals_pending_count
-- The pending, unexpired proposals of a tenant and of its agent_id, and the seconds until
-- the first of each expires (NULL: none pending): the caps on what waits for a human.
SELECT count(*) FILTER (WHERE agent_id = %(agent_id)s) AS agent_pending,
       count(*) AS tenant_pending,
       extract(epoch FROM min(expires_at) FILTER (WHERE agent_id = %(agent_id)s) - now())::float8
           AS agent_first_expiry_seconds,
       extract(epoch FROM min(expires_at) - now())::float8 AS tenant_first_expiry_seconds
  FROM proposals
 WHERE tenant = %(tenant)s AND status = 'pending' AND expires_at > now();

-- name: proposal_create
-- A new pending proposal, validated as an approval (proposal_id; operation_id to idempotency_key:
-- the operation it would create, proposed by its agent_id; reason, the agent's; approval_seconds,
-- how long the approved operation stands; pending_seconds, seconds the proposal waits for a human).
-- Its `proposed` event keeps the whole request (the key only as its SHA-256), and approvers' notice
-- is queued in the same statement. The same agent's newest proposal of the same request (the
-- reason aside) declined within declined_twin_seconds is its `declined_twin` (migration 0017),
-- shown to the agent and the approvers.
WITH twin AS (
    SELECT proposal_id FROM proposals
     WHERE tenant = %(tenant)s AND agent_id = %(agent_id)s AND provider = %(provider)s
       AND action = %(action)s AND status = 'declined'
       AND decided_at > now() - make_interval(secs => %(declined_twin_seconds)s)
       AND path_params = %(path_params)s::jsonb AND amount IS NOT DISTINCT FROM %(amount)s
       AND currency IS NOT DISTINCT FROM %(currency)s AND params = %(params)s::jsonb
     ORDER BY decided_at DESC, proposal_id
     LIMIT 1
), proposed AS (
    INSERT INTO proposals (
        proposal_id, operation_id, tenant, agent_id, provider, action, method, path,
        path_params, amount, currency, params, idempotency_key, reason, approval_seconds,
        expires_at, declined_twin)
    VALUES (%(proposal_id)s, %(operation_id)s, %(tenant)s, %(agent_id)s, %(provider)s,
            %(action)s, %(method)s, %(path)s, %(path_params)s::jsonb, %(amount)s, %(currency)s,
            %(params)s::jsonb, %(idempotency_key)s, %(reason)s, %(approval_seconds)s,
            now() + make_interval(secs => %(pending_seconds)s), (SELECT proposal_id FROM twin))
    RETURNING *
), event AS (
    INSERT INTO proposal_events (proposal_id, event, from_status, to_status, actor, detail)
    SELECT proposal_id, 'proposed', NULL, 'pending', %(agent_id)s,  -- the agent proposes
           jsonb_build_object(
               'operation_id', operation_id, 'tenant', tenant, 'agent_id', agent_id,
               'provider', provider, 'action', action,
               'target', jsonb_build_object('method', method, 'path', path),
               'path_params', path_params, 'amount', amount, 'currency', currency,
               'params', params, 'reason', reason, 'expires_at', to_jsonb(expires_at),
               'approval_seconds', approval_seconds, 'declined_twin', declined_twin,
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
SELECT p.*, now() AS read_at FROM proposals p WHERE p.proposal_id = %(proposal_id)s;

-- name: proposal_list
-- Proposals of a tenant (NULL for all) in the states (pending, expired, approved,
-- declined: expired is a pending one past its expiry), oldest first, at most limit.
SELECT p.*, now() AS read_at FROM proposals p
 WHERE (%(tenant)s::text IS NULL OR p.tenant = %(tenant)s)
   AND (CASE WHEN p.status = 'pending' AND p.expires_at <= now() THEN 'expired'
             ELSE p.status END) = ANY(%(states)s::text[])
 ORDER BY p.created_at, p.proposal_id
 LIMIT %(limit)s;

-- name: proposals_withdrawn_lately
-- Proposals their agents withdrew within the last day, newest first, at most limit: the
-- console shows them apart from the pending ones, so an approver who opened one sees why it
-- left the queue.
SELECT p.*, now() AS read_at FROM proposals p
 WHERE p.status = 'withdrawn' AND p.decided_at > now() - interval '1 day'
 ORDER BY p.decided_at DESC, p.proposal_id
 LIMIT %(limit)s;

-- name: proposal_approve
-- pending and unexpired -> approved, and the operation row created from the proposal as it
-- was proposed (approval_ref: the proposal id; approved_by: the approver's identity;
-- standing approval_seconds from now), with both events, in one statement: two approvals
-- racing serialise on the proposal's row lock and the second finds it approved (zero rows), so
-- one proposal creates at most one operation. note: the approver's.
WITH approved AS (
    UPDATE proposals
       SET status = 'approved', decided_at = now(), decided_by = %(approved_by)s,
           decision_note = %(note)s
     WHERE proposal_id = %(proposal_id)s AND status = 'pending' AND expires_at > now()
    RETURNING *
), created AS (
    INSERT INTO operations (
        operation_id, tenant, agent_id, provider, action, method, path, path_params,
        amount, currency, params, idempotency_key, approval_ref, approved_by, expires_at,
        audit_event)
    SELECT operation_id, tenant, agent_id, provider, action, method, path, path_params,
           amount, currency, params, idempotency_key, proposal_id, %(approved_by)s,
           now() + make_interval(secs => approval_seconds),
           -- as create_operation's record, and the proposal it came from
           jsonb_build_object('event', 'created', 'actor', %(actor)s::text,
                              'detail', jsonb_build_object('proposal_id', proposal_id))
      FROM approved
    RETURNING *
), decided AS (
    INSERT INTO proposal_events (proposal_id, event, from_status, to_status, actor, detail)
    SELECT proposal_id, 'approved', 'pending', 'approved', %(actor)s,
           jsonb_build_object('approved_by', %(approved_by)s::text, 'operation_id', operation_id,
                              'note', %(note)s::text)
    FROM approved
)
SELECT c.*, now() AS read_at FROM created c;

-- name: proposal_decline
-- pending and unexpired -> declined (by declined_by, the event's actor, a note). No operation is
-- ever created for it: nothing the agent sends can be let through.
WITH declined AS (
    UPDATE proposals
       SET status = 'declined', decided_at = now(), decided_by = %(declined_by)s,
           decision_note = %(note)s
     WHERE proposal_id = %(proposal_id)s AND status = 'pending' AND expires_at > now()
    RETURNING *
), decided AS (
    INSERT INTO proposal_events (proposal_id, event, from_status, to_status, actor, detail)
    SELECT proposal_id, 'declined', 'pending', 'declined', %(actor)s,
           jsonb_build_object('declined_by', %(declined_by)s::text, 'note', %(note)s::text)
    FROM declined
)
SELECT d.*, now() AS read_at FROM declined d;

-- name: proposal_withdraw
-- pending and unexpired -> withdrawn, by the agent that made it (tenant, agent_id: any other
-- agent's proposal is not found by it), with its event in the same statement. Nothing can have
-- left for a pending proposal: no operation exists before an approval. Zero rows: it is not
-- this agent's, or no longer pending (decided, withdrawn or expired).
WITH withdrawn AS (
    UPDATE proposals
       SET status = 'withdrawn', decided_at = now(), decided_by = %(agent_id)s
     WHERE proposal_id = %(proposal_id)s AND tenant = %(tenant)s AND agent_id = %(agent_id)s
       AND status = 'pending' AND expires_at > now()
    RETURNING *
), event AS (
    INSERT INTO proposal_events (proposal_id, event, from_status, to_status, actor, detail)
    SELECT proposal_id, 'withdrawn', 'pending', 'withdrawn', %(agent_id)s,  -- the agent
           jsonb_build_object('via', %(via)s::text)
    FROM withdrawn
)
SELECT w.*, now() AS read_at FROM withdrawn w;

-- name: proposal_refusal
-- An approval refused before any transition (four eyes, no longer sendable, a limit): on the
-- proposal's audit stream too, its status unchanged (the event's actor, code and detail).
INSERT INTO proposal_events (proposal_id, event, from_status, to_status, actor, detail)
SELECT proposal_id, 'approval_refused', status, status, %(actor)s,
       jsonb_build_object('code', %(code)s::text, 'detail', %(detail)s::text)
  FROM proposals WHERE proposal_id = %(proposal_id)s;

-- name: proposal_events
-- One proposal's decisions, oldest first.
SELECT event_id, at, event, from_status, to_status, actor, detail::text AS detail
  FROM proposal_events WHERE proposal_id = %(proposal_id)s ORDER BY event_id;
-- ============================================================================ end proposals

-- ====================================================================================== mcp
-- name: watched_versions
-- What an MCP subscriptions/listen stream watches (proxy/mcp/subscriptions.py, which admitted
-- the ids in scope first): a digest of each named operation's and proposal's row, which changes
-- with any change of the row; a proposal's also when it expires by the clock.
SELECT o.operation_id AS id, md5(o::text) AS version
  FROM operations o WHERE o.operation_id = ANY(%(operation_ids)s::text[])
UNION ALL
SELECT p.proposal_id, md5(p::text) || (p.expires_at <= now())::text
  FROM proposals p WHERE p.proposal_id = ANY(%(proposal_ids)s::text[]);
-- ================================================================================== end mcp

-- ============================================================================= transparency
-- The audit log as an RFC 6962 Merkle tree (migration 0018; proxy/store/transparency.py):
-- the integrator's rounds, the proofs' nodes, checkpoints and cosignatures.

-- name: transparency_state
-- The tree's size, the integrator's floor, and the size the stream heads describe (the row
-- locked: one writer per round; one integrator at a time across replicas holds
-- LockKind.TRANSPARENCY first, the others skip).
SELECT tree_size, floor_txid, heads_size FROM transparency_state FOR UPDATE;

-- name: transparency_pending
-- Up to limit visible records at or above the floor floor_txid without a leaf, in index order, with the
-- oldest transaction still running when this statement's snapshot was taken (xmin: no row
-- below it can appear any more). Always one row at least (record columns NULL: none).
WITH snapshot AS (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin)
SELECT snapshot.xmin, p.txid, p.stream, p.seq, p.hash
  FROM snapshot LEFT JOIN LATERAL (
        SELECT COALESCE(a.txid, 0) AS txid, a.stream, a.seq, a.hash
          FROM audit_log a
         WHERE COALESCE(a.txid, 0) >= %(floor_txid)s::bigint
           AND NOT EXISTS (SELECT 1 FROM transparency_leaves l
                            WHERE l.stream = a.stream AND l.seq = a.seq)
         ORDER BY COALESCE(a.txid, 0), a.stream, a.seq
         LIMIT %(limit)s
       ) p ON true
 ORDER BY p.txid, p.stream, p.seq;

-- name: transparency_nodes_at
-- The stored nodes at the positions positions (JSON [[level, index], ...]).
SELECT n.level, n.node_index, n.hash
  FROM jsonb_to_recordset(
         (SELECT jsonb_agg(jsonb_build_object('l', p -> 0, 'i', p -> 1))
            FROM jsonb_array_elements(%(positions)s::jsonb) AS p)
       ) AS want (l smallint, i bigint)
  JOIN transparency_nodes n ON n.level = want.l AND n.node_index = want.i;

-- name: transparency_append
-- One round's new leaves (first_index first index; streams streams, seqs seqs, record_hashes record hashes), its new
-- nodes (node_levels levels, node_indexes indexes, node_hashes hashes) and the new state (size size, floor_txid floor txid), in one
-- statement.
WITH leaves AS (
    INSERT INTO transparency_leaves (leaf_index, stream, seq, record_hash)
    SELECT %(first_index)s::bigint + ord - 1, stream, seq, record_hash
      FROM unnest(%(streams)s::text[], %(seqs)s::bigint[], %(record_hashes)s::bytea[])
           WITH ORDINALITY AS l (stream, seq, record_hash, ord)
), nodes AS (
    INSERT INTO transparency_nodes (level, node_index, hash)
    SELECT * FROM unnest(%(node_levels)s::smallint[], %(node_indexes)s::bigint[], %(node_hashes)s::bytea[])
)
UPDATE transparency_state
   SET tree_size = %(size)s, floor_txid = %(floor_txid)s;

-- name: transparency_insert_checkpoint
-- A signed checkpoint of the tree at size size (root root, the signed note note).
INSERT INTO transparency_checkpoints (tree_size, root, note) VALUES (%(size)s, %(root)s, %(note)s)
ON CONFLICT (tree_size) DO NOTHING;

-- name: transparency_latest_checkpoint
-- The newest checkpoint.
SELECT tree_size, root, note, at FROM transparency_checkpoints
 ORDER BY tree_size DESC LIMIT 1;

-- name: transparency_checkpoint_at
-- The checkpoint of size size, with its cosignature lines.
SELECT c.tree_size, c.root, c.note, c.at,
       COALESCE(array_agg(s.line ORDER BY s.witness) FILTER (WHERE s.line IS NOT NULL),
                '{}') AS cosignatures
  FROM transparency_checkpoints c
  LEFT JOIN transparency_cosignatures s USING (tree_size)
 WHERE c.tree_size = %(size)s
 GROUP BY c.tree_size;

-- name: transparency_insert_cosignature
-- A witness's (witness) cosignature line (line) of the checkpoint of size size.
INSERT INTO transparency_cosignatures (tree_size, witness, line) VALUES (%(size)s, %(witness)s, %(line)s)
ON CONFLICT (tree_size, witness) DO NOTHING;

-- name: transparency_witness_size
-- The largest checkpoint the witness witness cosigned for us (0: none).
SELECT COALESCE(max(tree_size), 0) AS tree_size FROM transparency_cosignatures
 WHERE witness = %(witness)s;

-- name: transparency_leaf
-- The leaf of record (stream stream, seq seq), if integrated.
SELECT leaf_index, record_hash FROM transparency_leaves WHERE stream = %(stream)s AND seq = %(seq)s;

-- name: transparency_operation_records
-- Every record of operation operation_id (its stream, and the requests that named it) with its leaf
-- (NULL: not integrated yet), and every leaf of its stream whose record is gone, in order.
SELECT a.stream, a.seq, a.at, a.kind, a.operation_id, a.record::text AS record, a.prev_hash,
       a.hash, l.leaf_index, l.record_hash
  FROM audit_log a LEFT JOIN transparency_leaves l USING (stream, seq)
 WHERE a.operation_id = %(operation_id)s OR a.stream = %(operation_id)s
UNION ALL
SELECT l.stream, l.seq, NULL, NULL, NULL, NULL, NULL, NULL, l.leaf_index, l.record_hash
  FROM transparency_leaves l
 WHERE l.stream = %(operation_id)s
   AND NOT EXISTS (SELECT 1 FROM audit_log a WHERE a.stream = l.stream AND a.seq = l.seq)
 ORDER BY 1, 2;

-- name: transparency_records_between
-- Every record written in [since, until) (by `at`), optionally only those of operation operation_id (its
-- stream, and the requests naming it), with its leaf (NULL: not integrated yet).
SELECT a.stream, a.seq, a.at, a.kind, a.operation_id, a.record::text AS record, a.prev_hash,
       a.hash, l.leaf_index, l.record_hash
  FROM audit_log a LEFT JOIN transparency_leaves l USING (stream, seq)
 WHERE a.at >= %(since)s AND a.at < %(until)s
   AND (%(operation_id)s::text IS NULL OR a.operation_id = %(operation_id)s OR a.stream = %(operation_id)s)
 ORDER BY a.stream, a.seq;

-- name: transparency_leaves_with_records
-- Every leaf in index order, with its record as stored now (record columns NULL: gone), for
-- `opgate audit verify-tree` (a cursor, in a repeatable-read transaction).
SELECT l.leaf_index, l.stream, l.seq, l.record_hash, a.at, a.kind, a.operation_id,
       a.record::text AS record, a.prev_hash, a.hash
  FROM transparency_leaves l LEFT JOIN audit_log a USING (stream, seq)
 ORDER BY l.leaf_index;

-- name: transparency_nodes_in_order
-- Every stored node, in the order appending writes them (by the last leaf it covers, lower
-- levels first), for `opgate audit verify` to compare each with the node its leaves make (a
-- cursor, in the same repeatable-read transaction as transparency_leaves_with_records).
SELECT level, node_index, hash FROM transparency_nodes
 ORDER BY ((node_index + 1) << level) - 1, level;

-- name: transparency_checkpoints_in_order
-- Every signed checkpoint, smallest tree first (a cursor, beside the two above).
SELECT tree_size, root, note FROM transparency_checkpoints ORDER BY tree_size;

-- name: transparency_leafless_integrated
-- Up to limit records below the integrator's floor (every one of them was made a leaf) that
-- have no leaf now: their leaf was deleted.
SELECT a.stream, a.seq
  FROM audit_log a CROSS JOIN transparency_state s
 WHERE COALESCE(a.txid, 0) < s.floor_txid
   AND NOT EXISTS (SELECT 1 FROM transparency_leaves l WHERE l.stream = a.stream AND l.seq = a.seq)
 ORDER BY a.stream, a.seq
 LIMIT %(limit)s;

-- name: transparency_unintegrated
-- How many records have no leaf yet, and when the oldest of them was written.
SELECT count(*) AS records, min(a.at) AS oldest
  FROM audit_log a
 WHERE NOT EXISTS (SELECT 1 FROM transparency_leaves l WHERE l.stream = a.stream AND l.seq = a.seq);
-- name: transparency_operation_answers
-- What opgate stored of the provider's answer for each of the operations operation_ids (their
-- rows: status, how they were settled, the provider's status, object id, content type and
-- body), for an offline bundle: the records hold only digests of it.
SELECT operation_id, status, settled_reason, provider_status, provider_object_id,
       response_content_type, response_body
  FROM operations WHERE operation_id = ANY(%(operation_ids)s::text[])
 ORDER BY operation_id;

-- name: transparency_mandate_records
-- The request records that presented a mandate approving one of the operations operation_ids
-- (their `mandate` field holds the presentation and the issuer's keys), with their leaves:
-- what a window's bundle adds when the presentation was written outside the window.
SELECT a.stream, a.seq, a.at, a.kind, a.operation_id, a.record::text AS record, a.prev_hash,
       a.hash, l.leaf_index, l.record_hash
  FROM audit_log a LEFT JOIN transparency_leaves l USING (stream, seq)
 WHERE a.operation_id = ANY(%(operation_ids)s::text[]) AND a.kind = 'request'
   AND jsonb_typeof(a.record -> 'mandate') = 'object'
 ORDER BY a.stream, a.seq;

-- name: transparency_heads_rebuild
-- Every stream's head from the leaves (its highest integrated seq), its bucket (the first 12
-- bits of SHA-256 of the stream's name, as proxy/transparency/heads.py computes it), the
-- buckets' hashes cleared for the integrator to recompute, and the heads marked as describing
-- the tree of size size (migration 0025: the first round after it, or after any mismatch).
WITH cleared AS (  -- streams the leaves do not hold (disjoint from those built below)
    DELETE FROM transparency_heads h
     WHERE NOT EXISTS (SELECT 1 FROM transparency_leaves l
                        WHERE l.stream = h.stream AND l.leaf_index < %(size)s::bigint)
), buckets_cleared AS (
    DELETE FROM transparency_head_buckets
), built AS (
    INSERT INTO transparency_heads (stream, bucket, seq, record_hash)
    SELECT DISTINCT ON (l.stream) l.stream,
           (get_byte(sha256(convert_to(l.stream, 'UTF8')), 0) << 4)
           | (get_byte(sha256(convert_to(l.stream, 'UTF8')), 1) >> 4),
           l.seq, l.record_hash
      FROM transparency_leaves l
     WHERE l.leaf_index < %(size)s::bigint
     ORDER BY l.stream, l.seq DESC
    ON CONFLICT (stream) DO UPDATE SET bucket = EXCLUDED.bucket, seq = EXCLUDED.seq,
                                       record_hash = EXCLUDED.record_hash
)
UPDATE transparency_state SET heads_size = %(size)s::bigint;

-- name: transparency_heads_advance
-- A round's new heads (streams streams, buckets buckets, seqs seqs, record_hashes record
-- hashes: each stream's last record in the round; a head only moves forward) and the size
-- size they now describe, in one statement.
WITH moved AS (
    INSERT INTO transparency_heads (stream, bucket, seq, record_hash)
    SELECT * FROM unnest(%(streams)s::text[], %(buckets)s::integer[], %(seqs)s::bigint[],
                         %(record_hashes)s::bytea[])
    ON CONFLICT (stream) DO UPDATE SET seq = EXCLUDED.seq, record_hash = EXCLUDED.record_hash
     WHERE EXCLUDED.seq > transparency_heads.seq
)
UPDATE transparency_state SET heads_size = %(size)s::bigint;

-- name: transparency_heads_in_buckets
-- Every head in the buckets buckets (for their hashes, and a bundle's proof of a stream's end).
SELECT bucket, stream, seq, record_hash FROM transparency_heads
 WHERE bucket = ANY(%(buckets)s::integer[]);

-- name: transparency_head_buckets_set
-- The hashes hashes of the buckets buckets, as recomputed from their heads.
INSERT INTO transparency_head_buckets (bucket, hash)
SELECT * FROM unnest(%(buckets)s::integer[], %(hashes)s::bytea[])
ON CONFLICT (bucket) DO UPDATE SET hash = EXCLUDED.hash;

-- name: transparency_head_buckets_all
-- Every non-empty bucket's hash (the map's root is made of them).
SELECT bucket, hash FROM transparency_head_buckets;

-- name: transparency_heads_from_leaves
-- Every stream's head in the tree of size size, from the leaves alone (its highest seq), with
-- its bucket, by bucket: what `opgate audit verify` recomputes the signed heads' root from (a
-- cursor, in its repeatable-read transaction).
SELECT bucket, stream, seq, record_hash FROM (
    SELECT DISTINCT ON (l.stream) l.stream, l.seq, l.record_hash,
           (get_byte(sha256(convert_to(l.stream, 'UTF8')), 0) << 4)
           | (get_byte(sha256(convert_to(l.stream, 'UTF8')), 1) >> 4) AS bucket
      FROM transparency_leaves l
     WHERE l.leaf_index < %(size)s::bigint
     ORDER BY l.stream, l.seq DESC
) h
 ORDER BY bucket;

-- name: transparency_stream_records
-- The records of stream stream from seq first to seq last (a window's bundle fills the
-- positions its window left out between two records of one stream), with their leaves.
SELECT a.stream, a.seq, a.at, a.kind, a.operation_id, a.record::text AS record, a.prev_hash,
       a.hash, l.leaf_index, l.record_hash
  FROM audit_log a LEFT JOIN transparency_leaves l USING (stream, seq)
 WHERE a.stream = %(stream)s AND a.seq BETWEEN %(first)s::bigint AND %(last)s::bigint
 ORDER BY a.seq;
-- ========================================================================= end transparency

-- name: mandate_open_use
-- How many operations one open mandate approved, under any of its digests (open_digests: its
-- identity, and the digest of its other signature text, under which an earlier release
-- counted it: MandateIdentity, proxy/mandates/identity.py), and their amounts' sum,
-- counting every one that spends (opgate_spends, migration 0024): all but those that failed, or
-- were revoked before anything of them was sent; one revoked after it may have been sent still
-- counts. AP2's occurrences and budget. Run under the open mandate's lock
-- (LockKind.OPEN_MANDATE, proxy/store/locks.py), in the same transaction.
SELECT count(*) AS occurrences, coalesce(sum(amount), 0)::bigint AS spent
FROM operations
WHERE approval_ref LIKE 'ap2:%;open:%'
  AND split_part(approval_ref, ';open:', 2) = ANY(%(open_digests)s::text[])
  AND opgate_spends(status, attempts, unsent_attempts, revoked_at, lookup_before_send);

-- name: record_open_mandate_cap
-- An open mandate's budget (budget_max, minor units of currency; NULL: it has no
-- payment.budget) under one spelling of its digest (open_digest), with its identity and every
-- spelling (migration 0032). Written in the transaction that creates a closed mandate's
-- operation under it, after its lock; the first one written stays.
INSERT INTO open_mandate_caps (open_digest, identity, spellings, budget_max, currency)
VALUES (%(open_digest)s, %(identity)s, %(spellings)s::text[], %(budget_max)s::numeric,
        %(currency)s)
ON CONFLICT (open_digest) DO NOTHING;

-- name: open_mandate_cap
-- The budget recorded for the open mandate an operation's approval_ref names (any spelling),
-- its identity (its lock's name) and every spelling of its digest; no row: none recorded.
SELECT identity, spellings, budget_max::text AS budget_max, currency
  FROM open_mandate_caps WHERE open_digest = %(open_digest)s;

-- name: open_mandate_paid
-- What the payments kept for the operations made under one open mandate (under any of its
-- digests: open_digests) have paid, per network and asset, whatever the payee and whoever
-- signed: every payment kept and not released (released: proven unpaid), whatever became of its
-- operation (a payment kept may have settled, even for an operation that then failed). Run
-- under the open mandate's lock (LockKind.OPEN_MANDATE), in the transaction that keeps a
-- payment (store_payment), so that payments under one open mandate take turns.
SELECT p.network, lower(p.asset) AS asset, sum(p.amount)::text AS paid
  FROM x402_payments p JOIN operations o ON o.operation_id = p.operation_id
 WHERE p.released_at IS NULL
   AND o.approval_ref LIKE 'ap2:%;open:%'
   AND split_part(o.approval_ref, ';open:', 2) = ANY(%(open_digests)s::text[])
 GROUP BY 1, 2
 ORDER BY 1, 2;

-- name: mandates_revoked
-- Which of the mandate digests are revoked.
SELECT digest FROM revoked_mandates WHERE digest = ANY(%(digests)s::text[]);

-- name: mandate_revoke
-- Revoke a mandate by its digest, by whom (revoked_by), why. Revoking twice keeps the first.
INSERT INTO revoked_mandates (digest, revoked_by, reason)
VALUES (%(digest)s, %(revoked_by)s, %(reason)s)
ON CONFLICT (digest) DO NOTHING;

-- name: mandate_operations
-- The operations a mandate (its digest) approved, closed or open.
SELECT operation_id FROM operations
WHERE approval_ref LIKE 'ap2:%'
  AND (split_part(split_part(approval_ref, ';', 1), ':', 2) = %(digest)s
       OR split_part(approval_ref, ';open:', 2) = %(digest)s)
ORDER BY created_at;

-- name: mandate_nonce_issue
-- A new nonce for one agent of one tenant, valid ttl_seconds; expired ones a while past their
-- expiry (a key binding answering them is refused by its age already) are pruned in the same
-- round trip, a bounded batch at a time.
WITH pruned AS (
    DELETE FROM mandate_nonces
     WHERE nonce IN (SELECT nonce FROM mandate_nonces
                      WHERE expires_at < now() - interval '1 hour' LIMIT 100)
)
INSERT INTO mandate_nonces (nonce, tenant, agent_id, expires_at)
VALUES (%(nonce)s, %(tenant)s, %(agent_id)s, now() + make_interval(secs => %(ttl_seconds)s))
RETURNING expires_at;

-- name: mandate_nonce_use
-- Consume a nonce for the operation operation_id: only the agent it was issued to, before its
-- expiry, once. A nonce already used for this very operation (the same presentation again)
-- is its own; the row lock makes presentations racing on one nonce take turns, on any replica.
-- Zero rows: unknown (never issued, another agent's, pruned), expired or used for another;
-- mandate_nonce_state says which.
UPDATE mandate_nonces
   SET used_at = coalesce(used_at, now()), used_for = %(operation_id)s
 WHERE nonce = %(nonce)s AND tenant = %(tenant)s AND agent_id = %(agent_id)s
   AND expires_at > now()
   AND (used_for IS NULL OR used_for = %(operation_id)s)
RETURNING nonce;

-- name: mandate_nonce_state
-- Why mandate_nonce_use consumed nothing: the agent's nonce as it stands (no row: unknown).
SELECT expires_at <= now() AS expired, used_for
  FROM mandate_nonces
 WHERE nonce = %(nonce)s AND tenant = %(tenant)s AND agent_id = %(agent_id)s;

-- name: store_payment
-- Keep the payment for a dispatched operation, before it leaves (proxy/gate/x402_pay.py): the
-- one opgate signed (payer_kind opgate), or the agent's own, bound by its nonce (agent). The
-- first one kept wins: if a live (unreleased) payment is stored already (another attempt,
-- another replica), nothing is written and no row is returned; the caller then sends the stored
-- one (stored_payment), never its own.
INSERT INTO x402_payments (operation_id, header, payload_sha256, nonce, payer, pay_to, amount,
                           asset, network, valid_before, payer_kind)
SELECT operation_id, %(header)s, %(payload_sha256)s, %(nonce)s, %(payer)s, %(pay_to)s,
       %(amount)s::numeric, %(asset)s, %(network)s, %(valid_before)s, %(payer_kind)s
  FROM operations
 WHERE operation_id = %(operation_id)s
   AND status = 'dispatched'
ON CONFLICT (operation_id) WHERE released_at IS NULL DO NOTHING
RETURNING header;

-- name: payment_limit_spent
-- What one x402 payment limit's key has paid in its window (proxy/policy/payments.py): the sum
-- of the amounts, and the number, of the payments kept for the tenant's operations (agent_id,
-- NULL: any agent's) on network in asset (NULL, NULL: any: a rate limit), whatever the payee
-- and the provider, kept in the last window_seconds and not released (released: proven unpaid,
-- release_unpaid_payment). Run after the key's advisory lock (proxy/store/locks.py), in the
-- transaction that keeps the payment (store_payment): a payment kept on another replica is seen once committed,
-- and none can commit between this sum and the insert. The window ends at this statement's
-- start (after the lock was taken).
SELECT coalesce(sum(p.amount), 0)::text AS spent, count(*) AS payments
  FROM x402_payments p JOIN operations o ON o.operation_id = p.operation_id
 WHERE p.released_at IS NULL
   AND p.signed_at > statement_timestamp() - make_interval(secs => %(window_seconds)s)
   AND o.tenant = %(tenant)s
   AND (%(agent_id)s::text IS NULL OR o.agent_id = %(agent_id)s)
   AND (%(network)s::text IS NULL OR p.network = %(network)s)
   AND (%(asset)s::text IS NULL OR lower(p.asset) = %(asset)s);

-- name: payment_limit_spent_by_key
-- payment_limit_spent for every tenant (per_agent: every tenant and agent) that paid anything
-- in the window: what GET /v1/budgets shows of an x402 limit (advisory, read without the lock).
-- An operation approved for no agent is no agent's (agent_id NULL, left out per agent).
SELECT o.tenant, CASE WHEN %(per_agent)s THEN o.agent_id END AS agent_id,
       sum(p.amount)::text AS spent, count(*) AS payments
  FROM x402_payments p JOIN operations o ON o.operation_id = p.operation_id
 WHERE p.released_at IS NULL
   AND p.signed_at > statement_timestamp() - make_interval(secs => %(window_seconds)s)
   AND (%(network)s::text IS NULL OR p.network = %(network)s)
   AND (%(asset)s::text IS NULL OR lower(p.asset) = %(asset)s)
   AND (NOT %(per_agent)s OR o.agent_id IS NOT NULL)
 GROUP BY 1, 2
 ORDER BY 1, 2;

-- name: stored_payment
-- The live payment stored for an operation, if any: its header and terms, and its settlement
-- once read. A released payment (proven unpaid: release_unpaid_payment) is not sent again.
SELECT header, payload_sha256, nonce, payer, pay_to, amount::text AS amount, asset, network,
       valid_before, payer_kind, settlement
  FROM x402_payments
 WHERE operation_id = %(operation_id)s AND released_at IS NULL;

-- name: record_payment_settlement
-- The upstream's PAYMENT-RESPONSE for the stored payment, kept once: a later answer (a replay
-- of the same settlement) does not overwrite the first. Returns the operation id if written.
UPDATE x402_payments
   SET settlement = %(settlement)s::jsonb, settled_at = now()
 WHERE operation_id = %(operation_id)s AND released_at IS NULL
   AND settled_at IS NULL
RETURNING operation_id;

-- name: release_unpaid_payment
-- Reconciliation proved the operation's live payment unpaid (its nonce unused after its
-- validBefore: proxy/recovery/x402_state.py): the payment is released, and the attempt that
-- sent it ends as never sent, so that the operation may be claimed once more and pay with a
-- new authorization. Only by the holder (owner) of a live reconciliation lease, for the attempt
-- it looked at (expected_attempts), and for the payment it judged (nonce). Returns the
-- operation id, or nothing if any of that no longer holds.
WITH released AS (
    UPDATE operations
       SET last_outcome = 'not_sent', reconcile_owner = NULL, reconcile_lease_until = NULL,
           reconcile_attempts = reconcile_attempts + 1, updated_at = clock_timestamp(),
           audit_event = jsonb_build_object('event', 'reconcile_inconclusive',
                                            'actor', %(owner)s::text,
                                            'detail', %(evidence)s::jsonb)
     WHERE operation_id = %(operation_id)s AND reconcile_owner = %(owner)s
       AND status = 'dispatched' AND reconcile_lease_until > clock_timestamp()
       AND attempts = %(expected_attempts)s AND opgate_lease_free_v2(lease_until)
       AND EXISTS (SELECT 1 FROM x402_payments p
                    WHERE p.operation_id = %(operation_id)s AND p.released_at IS NULL
                      AND p.nonce = %(nonce)s)
    RETURNING operation_id
)
UPDATE x402_payments p
   SET released_at = clock_timestamp(), released_evidence = %(evidence)s::jsonb
  FROM released r
 WHERE p.operation_id = r.operation_id AND p.released_at IS NULL
RETURNING p.operation_id;
