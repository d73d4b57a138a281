-- 0020: one record per transition (docs/audit.md, *Transitions*).
--
-- Until now a transition wrote the same fact three times: its `operation_events` row, whose
-- AFTER INSERT trigger (0003) inserted the `audit_log` record, whose BEFORE INSERT trigger
-- upserted the stream's `audit_heads` row. Now the transition's UPDATE (or a creation's INSERT)
-- of the operation row names its event in the transient column `audit_event`, and one BEFORE
-- trigger on `operations` writes the one chained `audit_log` record and moves the stream's head,
-- which lives on the operation row itself (`audit_seq`, `audit_hash`): the row the transition
-- already holds locked, and writes anyway. So a transition is one row version of `operations`
-- and one `audit_log` row, in the same statement as before.
--
-- The record and its hash are exactly what 0003's triggers wrote (same fields, same
-- `event_id` numbering from the same sequence, the same `opgate_audit_hash` encoding): chains
-- written before this migration and after it are one chain per operation, and `opgate audit
-- verify` checks them alike (proxy/observe/auditlog/chain.py, unchanged).
--
-- `operation_events` becomes a view over the transition records. Each of its rows had its
-- audit twin (same event_id, operation, time, event, statuses, actor, detail); the rows that
-- have none (their records were pruned by `opgate audit prune`, or written around the trigger)
-- are kept as they were in `operation_events_unchained`, which the view includes.

-- ---------------------------------------------------------------- the head on the operation row
ALTER TABLE operations
    ADD COLUMN audit_seq bigint NOT NULL DEFAULT 0,  -- 0: no record yet (created before 0003)
    ADD COLUMN audit_hash bytea NOT NULL
        DEFAULT '\x0000000000000000000000000000000000000000000000000000000000000000',
    -- the transition this statement records: {"event", "actor", "detail"}; read and cleared
    -- by the trigger below, never stored (the constraint holds it to that)
    ADD COLUMN audit_event jsonb,
    ADD CONSTRAINT operations_audit_event_consumed CHECK (audit_event IS NULL);

UPDATE operations o SET audit_seq = h.seq, audit_hash = h.hash
  FROM audit_heads h WHERE h.stream = o.operation_id;

-- A head already signed by an HMAC checkpoint is no longer needed in audit_heads; one not yet
-- signed stays there until the next checkpoint signs it and removes it (queries.sql
-- audit_take_changed_heads).
DELETE FROM audit_heads h USING operations o
 WHERE h.stream = o.operation_id AND h.seq <= h.checkpointed_seq;

-- ------------------------------------------------------------------------- the one record
ALTER SEQUENCE operation_events_event_id_seq OWNED BY NONE;
ALTER SEQUENCE operation_events_event_id_seq RENAME TO audit_event_ids;

-- Writes the record of the transition NEW.audit_event names, chained onto the head on the row,
-- and moves the head. from/to status: the row's before and after (every transition query named
-- them so). A creation's record holds the whole approval (the row is mutable; the key only as
-- its SHA-256: whoever reads the audit log must not be able to re-send with it), as
-- create_operation's event did.
CREATE FUNCTION opgate_audit_operation() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    instance text := nullif(current_setting('opgate.instance_id', true), '');
    version  text;
    at_now   timestamptz := now();
    detail   jsonb := coalesce(NEW.audit_event -> 'detail', '{}'::jsonb);
    before   text;
    prev     bytea;
    record   jsonb;
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- a repeated id: the INSERT's ON CONFLICT DO NOTHING (or its unique violation) follows,
        -- and no record is written for a creation that does not happen
        IF EXISTS (SELECT 1 FROM operations o WHERE o.operation_id = NEW.operation_id) THEN
            NEW.audit_event := NULL;
            RETURN NEW;
        END IF;
        prev := '\x0000000000000000000000000000000000000000000000000000000000000000';
        NEW.audit_seq := 1;
        detail := jsonb_build_object(
            'approval_ref', NEW.approval_ref, 'supersedes', NEW.supersedes,
            'approved_by', NEW.approved_by, 'tenant', NEW.tenant, 'agent_id', NEW.agent_id,
            'provider', NEW.provider, 'action', NEW.action,
            'target', jsonb_build_object('method', NEW.method, 'path', NEW.path),
            'path_params', NEW.path_params, 'amount', NEW.amount, 'currency', NEW.currency,
            'params', NEW.params, 'expires_at', to_jsonb(NEW.expires_at),
            'idempotency_key_sha256',
            encode(sha256(convert_to(NEW.idempotency_key, 'UTF8')), 'hex')) || detail;
    ELSE
        prev := OLD.audit_hash;
        before := OLD.status;
        NEW.audit_seq := OLD.audit_seq + 1;
    END IF;
    SELECT policy_version INTO version FROM audit_instances WHERE instance_id = instance;
    record := jsonb_build_object(
        'schema_version', 1,
        'time', to_jsonb(at_now),
        'event', NEW.audit_event ->> 'event',
        'event_id', nextval('audit_event_ids'),
        'operation_id', NEW.operation_id,
        'status_before', before,
        'status_after', NEW.status,
        'actor', NEW.audit_event ->> 'actor',
        'detail', detail,
        'instance_id', instance,
        'policy_version', version);
    NEW.audit_hash := opgate_audit_hash(prev, NEW.operation_id, NEW.audit_seq, at_now,
                                        'transition', NEW.operation_id, record);
    NEW.audit_event := NULL;
    -- a seq of its own: audit_log's chaining trigger (0010) leaves the row as it is
    IF TG_OP = 'INSERT' THEN
        -- two creations of one id racing: the second waits for the first's commit here, and
        -- then writes nothing (its INSERT then conflicts in turn)
        INSERT INTO audit_log (stream, seq, at, kind, operation_id, record, prev_hash, hash)
        VALUES (NEW.operation_id, 1, at_now, 'transition', NEW.operation_id, record, prev,
                NEW.audit_hash)
        ON CONFLICT (stream, seq) DO NOTHING;
    ELSE
        INSERT INTO audit_log (stream, seq, at, kind, operation_id, record, prev_hash, hash)
        VALUES (NEW.operation_id, NEW.audit_seq, at_now, 'transition', NEW.operation_id, record,
                prev, NEW.audit_hash);
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER operations_audit BEFORE INSERT OR UPDATE ON operations
    FOR EACH ROW WHEN (NEW.audit_event IS NOT NULL) EXECUTE FUNCTION opgate_audit_operation();

-- ------------------------------------------------------------- operation_events as a view
ALTER TABLE operation_events RENAME TO operation_events_before_0020;

CREATE TABLE operation_events_unchained AS
SELECT e.event_id, e.operation_id, e.at, e.event, e.from_status, e.to_status, e.actor, e.detail
  FROM operation_events_before_0020 e
 WHERE NOT EXISTS (
        SELECT 1 FROM audit_log a
         WHERE a.stream = e.operation_id AND a.kind = 'transition'
           AND (a.record ->> 'event_id')::bigint = e.event_id);

DROP TABLE operation_events_before_0020;  -- its audit trigger with it
DROP FUNCTION opgate_audit_transition();

-- One operation's transitions (the readers: the operations API, the console, recovery).
CREATE VIEW operation_events AS
SELECT (a.record ->> 'event_id')::bigint AS event_id, a.stream AS operation_id, a.at,
       a.record ->> 'event' AS event, a.record ->> 'status_before' AS from_status,
       a.record ->> 'status_after' AS to_status, a.record ->> 'actor' AS actor,
       a.record -> 'detail' AS detail
  FROM audit_log a
 WHERE a.kind = 'transition'
UNION ALL
SELECT event_id, operation_id, at, event, from_status, to_status, actor, detail
  FROM operation_events_unchained;

-- ------------------------------------------------------------------------------ the heads
-- Every stream's head, wherever it lives: an operation's on its row, the others' in
-- audit_heads. A view, so that a read-only reviewer (queries.sql audit_reviewer_grants) reads
-- the heads without being granted the operations themselves.
CREATE VIEW audit_stream_heads AS
SELECT h.stream, h.seq, h.hash FROM audit_heads h
 WHERE NOT EXISTS (SELECT 1 FROM operations o WHERE o.operation_id = h.stream)
UNION ALL
SELECT o.operation_id, o.audit_seq, o.audit_hash FROM operations o WHERE o.audit_seq > 0;

-- Reviewers granted before this migration read the heads through the view now.
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN SELECT DISTINCT g.grantee FROM information_schema.role_table_grants g
                    WHERE g.table_name = 'audit_heads' AND g.privilege_type = 'SELECT'
                      AND g.table_schema = current_schema() AND g.grantee <> current_user
    LOOP
        EXECUTE format('GRANT SELECT ON audit_stream_heads TO %I', grantee);
    END LOOP;
END
$$;

-- The HMAC checkpointer's cursor over operation heads: the snapshot its last checkpoint read
-- them in. An operation whose stream has a record that snapshot did not see (by the inserting
-- transaction, audit_log.txid, 0018) moved since; so no per-transition mark is needed (the
-- audit_heads `checkpointed_seq` was one more write per transition).
CREATE TABLE audit_checkpoint_state (
    singleton boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    seen      pg_snapshot NOT NULL
);
INSERT INTO audit_checkpoint_state (seen) VALUES (pg_current_snapshot());
