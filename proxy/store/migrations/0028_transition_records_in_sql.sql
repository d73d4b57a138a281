-- 0028: an operation's records hashed in one SQL expression each, and written by one INSERT.
--
-- Why: the transition trigger (0020, 0022) was 35-43% of PostgreSQL's CPU per approved
-- operation (issue 42): per record it called opgate_audit_hash, a PL/pgSQL function that
-- builds the hashed content field by field in a loop (an array, a concatenation per step),
-- and the settle's two records (its transition's and its request's) were two INSERTs, each
-- one more executor start and end in the trigger. Now each hash is one expression over the
-- record's encoded fields, evaluated in place, and a settle writes both its records with one
-- two-row INSERT. Measured in bench/transition-records-in-sql.md.
--
-- The records and their hashes are byte for byte what 0022's function writes (same fields,
-- same `event_id` numbering, the same encoding as opgate_audit_hash: the tag, the previous
-- hash, then each field as a 4-byte big-endian length and its UTF-8 bytes; no field of an
-- operation's record is ever NULL here, the stream and operation id being the row's key):
-- chains written before this migration go on, and `opgate audit verify` checks them alike
-- (proxy/observe/auditlog/chain.py, its code unchanged).
-- tests/store/test_transition_records_in_sql.py compares both functions' records on the same
-- inputs.
--
-- opgate_audit_operation (0022) stays, unused (the trigger is the table's, so every process
-- writes through the new function from this migration on): that test compares with it.
-- opgate_audit_hash stays for the other chains (request streams, proposals, policy loads) and
-- anyone who calls it by hand. The record's policy_version is still read from audit_instances
-- (one index lookup per record): passing it as a parameter of every transition statement
-- measured no difference (bench/transition-records-in-sql.md).

-- The encoded field of opgate_audit_hash: its length (4 bytes, big-endian), then its bytes.
-- SQL and IMMUTABLE: PostgreSQL inlines it, which repeats its argument; so a record's
-- encoding (the long one) is made once into a variable, and the variable passed.
CREATE FUNCTION opgate_audit_field_v2(encoded bytea) RETURNS bytea
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT int4send(octet_length($1)) || $1 $$;

CREATE FUNCTION opgate_audit_operation_v2() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    instance  text := nullif(current_setting('opgate.instance_id', true), '');
    version   text;
    at_now    timestamptz := now();
    -- the fields every record of this operation's stream shares, encoded once: the stream
    -- and the operation id (the same text), and the time in microseconds
    id_field  bytea := opgate_audit_field_v2(convert_to(NEW.operation_id, 'UTF8'));
    at_field  bytea := opgate_audit_field_v2(
                           convert_to(((extract(epoch FROM at_now) * 1000000)::bigint)::text,
                                      'UTF8'));
    detail    jsonb := coalesce(NEW.audit_event -> 'detail', '{}'::jsonb);
    before    text;
    prev      bytea;
    record    jsonb;
    encoded   bytea;
    request_seq  bigint;
    request_hash bytea;
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
    -- opgate_audit_hash(prev, id, seq, at, 'transition', id, record), in one expression
    encoded := convert_to(record::text, 'UTF8');
    NEW.audit_hash := sha256(
        '\x6f70676174652d61756469742d7631'::bytea  -- 'opgate-audit-v1'
        || prev || id_field
        || opgate_audit_field_v2(convert_to(NEW.audit_seq::text, 'UTF8')) || at_field
        || '\x0000000a7472616e736974696f6e'::bytea  -- the field 'transition'
        || id_field || opgate_audit_field_v2(encoded));
    NEW.audit_event := NULL;
    -- a seq of its own: audit_log's chaining trigger (0010) leaves the row as it is
    IF TG_OP = 'INSERT' THEN
        -- two creations of one id racing: the second waits for the first's commit here, and
        -- then writes nothing (its INSERT then conflicts in turn)
        INSERT INTO audit_log (stream, seq, at, kind, operation_id, record, prev_hash, hash)
        VALUES (NEW.operation_id, 1, at_now, 'transition', NEW.operation_id, record, prev,
                NEW.audit_hash)
        ON CONFLICT (stream, seq) DO NOTHING;
    ELSIF NEW.audit_request IS NULL THEN
        INSERT INTO audit_log (stream, seq, at, kind, operation_id, record, prev_hash, hash)
        VALUES (NEW.operation_id, NEW.audit_seq, at_now, 'transition', NEW.operation_id, record,
                prev, NEW.audit_hash);
    ELSE
        -- 0022: the request whose outcome this transition records, chained after it; both
        -- records in one INSERT
        request_seq := NEW.audit_seq + 1;
        encoded := convert_to(NEW.audit_request::text, 'UTF8');
        request_hash := sha256(
            '\x6f70676174652d61756469742d7631'::bytea
            || NEW.audit_hash || id_field
            || opgate_audit_field_v2(convert_to(request_seq::text, 'UTF8')) || at_field
            || '\x0000000772657175657374'::bytea  -- the field 'request'
            || id_field || opgate_audit_field_v2(encoded));
        INSERT INTO audit_log (stream, seq, at, kind, operation_id, record, prev_hash, hash)
        VALUES (NEW.operation_id, NEW.audit_seq, at_now, 'transition', NEW.operation_id, record,
                prev, NEW.audit_hash),
               (NEW.operation_id, request_seq, at_now, 'request', NEW.operation_id,
                NEW.audit_request, NEW.audit_hash, request_hash);
        NEW.audit_seq := request_seq;
        NEW.audit_hash := request_hash;
        NEW.audit_request := NULL;
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER operations_audit ON operations;
CREATE TRIGGER operations_audit BEFORE INSERT OR UPDATE ON operations
    FOR EACH ROW WHEN (NEW.audit_event IS NOT NULL) EXECUTE FUNCTION opgate_audit_operation_v2();
