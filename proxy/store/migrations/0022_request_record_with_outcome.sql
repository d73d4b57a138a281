-- 0022: the request record of a claimed operation, written by the statement that records the
-- operation's outcome (docs/audit.md, *Where a request's record is stored*).
--
-- A request that claimed its operation ends in one transition statement (settle_operation, or
-- release_unknown for an attempt whose outcome is unknown). That statement now also names the
-- request's record, fully built by opgate (the same fields as before, redacted, as JSON), in
-- the transient column `audit_request`; the row's trigger (0020) writes it into the
-- operation's own stream, kind 'request', chained right after the transition's record, and
-- moves the head on the row twice. The record commits with the outcome, before the agent's
-- answer is written; it no longer goes through the instance's batch writer, so it takes no
-- `instance_seq` there (the writer's numbering and its prefix accounting, 0012 and 0015, are
-- those of the records it still writes). A statement that fails, or finds the row changed,
-- writes neither, and opgate queues the record to the batch writer as before.
--
-- The hash is the one every record has (`opgate_audit_hash`, kind 'request'): `opgate audit
-- verify` follows an operation's stream whatever kinds it holds.

ALTER TABLE operations
    -- the request record this statement writes after its transition's (a JSON object); read
    -- and cleared by the trigger, never stored (the constraint holds it to that)
    ADD COLUMN audit_request jsonb,
    ADD CONSTRAINT operations_audit_request_consumed CHECK (audit_request IS NULL);

-- 0020's function, with the request record after the transition's (an UPDATE only: a creation
-- records no request).
CREATE OR REPLACE FUNCTION opgate_audit_operation() RETURNS trigger
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
        -- 0022: the request whose outcome this transition records, chained after it
        IF NEW.audit_request IS NOT NULL THEN
            prev := NEW.audit_hash;
            NEW.audit_seq := NEW.audit_seq + 1;
            NEW.audit_hash := opgate_audit_hash(prev, NEW.operation_id, NEW.audit_seq, at_now,
                                                'request', NEW.operation_id, NEW.audit_request);
            INSERT INTO audit_log (stream, seq, at, kind, operation_id, record, prev_hash, hash)
            VALUES (NEW.operation_id, NEW.audit_seq, at_now, 'request', NEW.operation_id,
                    NEW.audit_request, prev, NEW.audit_hash);
            NEW.audit_request := NULL;
        END IF;
    END IF;
    RETURN NEW;
END
$$;
