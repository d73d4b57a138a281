-- 0003: the tamper-evident audit log (docs/audit.md).
--
-- Every audit record is one row of `audit_log`, chained to the previous record of its STREAM by
-- a SHA-256 over its content. A stream is one operation (its transitions: created, claimed,
-- confirmed, reconciled, escalated, resolved, revoked...), one opgate instance's agent requests,
-- or the policy loads. Chains are per stream so that no statement waits on a lock other than
-- the one its stream already serializes on (a transition already holds its operation's row).
-- `audit_heads` holds each stream's last (seq, hash): the append cursor, locked per stream.
-- `audit_checkpoints` are HMAC-signed snapshots of the heads that changed, written by opgate
-- with a key the database never sees: they are what makes a rewritten chain detectable.

CREATE TABLE audit_log (
    stream       text        NOT NULL,  -- operation id | requests/<instance> | policy
    seq          bigint      NOT NULL,  -- 1, 2, 3... within the stream, no gaps
    at           timestamptz NOT NULL DEFAULT now(),
    kind         text        NOT NULL,  -- request | transition | policy_load
    operation_id text,
    record       jsonb       NOT NULL,  -- the record's fields, named as in the JSON log line
    prev_hash    bytea       NOT NULL,  -- the previous record's hash (32 zero bytes for seq 1)
    hash         bytea       NOT NULL,
    PRIMARY KEY (stream, seq)
);

CREATE INDEX audit_log_by_time ON audit_log (at);
CREATE INDEX audit_log_by_operation ON audit_log (operation_id, at) WHERE operation_id IS NOT NULL;

CREATE TABLE audit_heads (
    stream           text   PRIMARY KEY,
    seq              bigint NOT NULL,
    prev_hash        bytea  NOT NULL,  -- the head's predecessor (kept so one upsert can chain)
    hash             bytea  NOT NULL,
    checkpointed_seq bigint NOT NULL DEFAULT 0
);

CREATE INDEX audit_heads_unchecked ON audit_heads (stream) WHERE seq > checkpointed_seq;

-- The policy set each opgate instance currently decides with (upserted at start-up and on every
-- reload, with the policy_load record). Transition records name it: the trigger finds the
-- writing instance by the connection's `opgate.instance_id` setting, set when its pool opens.
CREATE TABLE audit_instances (
    instance_id    text        PRIMARY KEY,
    policy_version text        NOT NULL,
    loaded_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE audit_checkpoints (
    checkpoint_id bigserial   PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT now(),
    writer        text        NOT NULL,
    heads         jsonb       NOT NULL,  -- [[stream, seq, hash hex], ...] changed since the last
    prev_mac      bytea       NOT NULL,  -- the previous checkpoint's mac (32 zero bytes: first)
    mac           bytea       NOT NULL   -- HMAC-SHA256(audit key, prev_mac || canonical content)
);

-- One field of the hashed content: a 4-byte big-endian length and the UTF-8 bytes, or
-- ffffffff for NULL, so that no two different field lists encode alike.
CREATE FUNCTION opgate_audit_field(value text) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN value IS NULL THEN '\xffffffff'::bytea
                ELSE int4send(octet_length(convert_to(value, 'UTF8'))) || convert_to(value, 'UTF8')
           END
$$;

-- The record hash. proxy/observe/auditlog/chain.py recomputes it independently: keep them in step.
CREATE FUNCTION opgate_audit_hash(
    prev bytea, stream text, seq bigint, at timestamptz, kind text, operation_id text,
    record jsonb
) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT sha256(
        convert_to('opgate-audit-v1', 'UTF8') || prev
        || opgate_audit_field(stream) || opgate_audit_field(seq::text)
        || opgate_audit_field(((extract(epoch FROM at) * 1000000)::bigint)::text)
        || opgate_audit_field(kind) || opgate_audit_field(operation_id)
        || opgate_audit_field(record::text))
$$;

-- Chains each new record to its stream's head. Runs inside the inserting statement, so a
-- transition and its audit record commit together with no extra round trip. Only the stream's
-- head row is locked: other streams proceed in parallel.
CREATE FUNCTION opgate_audit_chain() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.at := now();
    -- One statement: take the stream's head row (created on first use, locked until commit),
    -- advance it and compute the new hash from the old head in the same UPDATE.
    INSERT INTO audit_heads AS h (stream, seq, prev_hash, hash)
    VALUES (NEW.stream, 1, '\x0000000000000000000000000000000000000000000000000000000000000000',
            opgate_audit_hash('\x0000000000000000000000000000000000000000000000000000000000000000',
                              NEW.stream, 1, NEW.at, NEW.kind, NEW.operation_id, NEW.record))
    ON CONFLICT (stream) DO UPDATE
       SET seq = h.seq + 1, prev_hash = h.hash,
           hash = opgate_audit_hash(h.hash, NEW.stream, h.seq + 1, NEW.at, NEW.kind,
                                    NEW.operation_id, NEW.record)
    RETURNING h.seq, h.prev_hash, h.hash INTO NEW.seq, NEW.prev_hash, NEW.hash;
    RETURN NEW;
END
$$;

CREATE TRIGGER audit_log_chain BEFORE INSERT ON audit_log
    FOR EACH ROW EXECUTE FUNCTION opgate_audit_chain();

-- Every operation_events row (every transition query writes one in its own statement) becomes
-- an audit record of the operation's stream, in the same statement. New transitions need no
-- audit code of their own. The policy version is the writing instance's (audit_instances).
CREATE FUNCTION opgate_audit_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    instance text := nullif(current_setting('opgate.instance_id', true), '');
    version  text;
BEGIN
    SELECT policy_version INTO version FROM audit_instances WHERE instance_id = instance;
    INSERT INTO audit_log (stream, seq, kind, operation_id, record, prev_hash, hash)
    VALUES (NEW.operation_id, 0, 'transition', NEW.operation_id,
            jsonb_build_object(
                'schema_version', 1,
                'time', to_jsonb(NEW.at),
                'event', NEW.event,
                'event_id', NEW.event_id,
                'operation_id', NEW.operation_id,
                'status_before', NEW.from_status,
                'status_after', NEW.to_status,
                'actor', NEW.actor,
                'detail', NEW.detail,
                'instance_id', instance,
                'policy_version', version),
            '\x', '\x');
    RETURN NEW;
END
$$;

CREATE TRIGGER operation_events_audit AFTER INSERT ON operation_events
    FOR EACH ROW EXECUTE FUNCTION opgate_audit_transition();
