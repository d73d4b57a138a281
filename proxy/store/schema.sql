-- opgate's current schema: what the migrations in proxy/store/migrations/ build, up
-- to 0032_open_mandate_caps.sql. GENERATED, do not edit; it is never run. Rewrite it with
--     .venv/bin/python -m proxy.store.schema
-- (tests/store/test_schema.py fails when it differs from what the migrations build).

-- ---------------------------------------------------------------------------------------- tables

CREATE TABLE approval_keys (
    tenant text NOT NULL,
    caller text NOT NULL,
    request_key text NOT NULL,
    fingerprint text NOT NULL,
    operation_id text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT approval_keys_pkey PRIMARY KEY (tenant, caller, request_key),
    CONSTRAINT approval_keys_operation_id_fkey FOREIGN KEY (operation_id) REFERENCES operations(operation_id)
);

CREATE TABLE audit_checkpoint_state (
    singleton boolean DEFAULT true NOT NULL,
    seen pg_snapshot NOT NULL,
    CONSTRAINT audit_checkpoint_state_pkey PRIMARY KEY (singleton),
    CONSTRAINT audit_checkpoint_state_singleton_check CHECK (singleton)
);

CREATE TABLE audit_checkpoints (
    checkpoint_id bigint DEFAULT nextval('audit_checkpoints_checkpoint_id_seq'::regclass) NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    writer text NOT NULL,
    heads jsonb NOT NULL,
    prev_mac bytea NOT NULL,
    mac bytea NOT NULL,
    CONSTRAINT audit_checkpoints_pkey PRIMARY KEY (checkpoint_id)
);

CREATE TABLE audit_heads (
    stream text NOT NULL,
    seq bigint NOT NULL,
    prev_hash bytea NOT NULL,
    hash bytea NOT NULL,
    checkpointed_seq bigint DEFAULT 0 NOT NULL,
    CONSTRAINT audit_heads_pkey PRIMARY KEY (stream)
);

CREATE TABLE audit_instance_runs (
    run_id text NOT NULL,
    instance_id text NOT NULL,
    stream text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    numbered_seq bigint DEFAULT 0 NOT NULL,
    stored_seq bigint DEFAULT 0 NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat_seconds double precision NOT NULL,
    stopped_at timestamp with time zone,
    stored_records bigint DEFAULT 0 NOT NULL,
    CONSTRAINT audit_instance_runs_pkey PRIMARY KEY (run_id)
);

CREATE TABLE audit_instances (
    instance_id text NOT NULL,
    policy_version text NOT NULL,
    loaded_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT audit_instances_pkey PRIMARY KEY (instance_id)
);

CREATE TABLE audit_log (
    stream text NOT NULL,
    seq bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    kind text NOT NULL,
    operation_id text,
    record jsonb NOT NULL,
    prev_hash bytea NOT NULL,
    hash bytea NOT NULL,
    txid bigint DEFAULT ((pg_current_xact_id())::text)::bigint,
    CONSTRAINT audit_log_pkey PRIMARY KEY (stream, seq)
);

CREATE TABLE console_sessions (
    session_digest text NOT NULL,
    role text NOT NULL,
    identity text NOT NULL,
    csrf_token text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT console_sessions_pkey PRIMARY KEY (session_digest),
    CONSTRAINT console_sessions_role_check CHECK ((role = ANY (ARRAY['admin'::text, 'reviewer'::text, 'approver'::text])))
);

CREATE TABLE escalation_notifications (
    notification_id bigint DEFAULT nextval('escalation_notifications_notification_id_seq'::regclass) NOT NULL,
    operation_id text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_until timestamp with time zone,
    delivered_at timestamp with time zone,
    last_error text,
    kind text DEFAULT 'escalated'::text NOT NULL,
    proposal_id text,
    CONSTRAINT escalation_notifications_pkey PRIMARY KEY (notification_id),
    CONSTRAINT escalation_notifications_operation_id_fkey FOREIGN KEY (operation_id) REFERENCES operations(operation_id),
    CONSTRAINT escalation_notifications_proposal_id_fkey FOREIGN KEY (proposal_id) REFERENCES proposals(proposal_id),
    CONSTRAINT escalation_notifications_kind_check CHECK ((kind = ANY (ARRAY['escalated'::text, 'settled_by_provider'::text, 'proposal_pending'::text]))),
    CONSTRAINT escalation_notifications_one_subject CHECK (((operation_id IS NULL) <> (proposal_id IS NULL)))
);

CREATE TABLE mandate_nonces (
    nonce text NOT NULL,
    tenant text NOT NULL,
    agent_id text NOT NULL,
    issued_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    used_at timestamp with time zone,
    used_for text,
    CONSTRAINT mandate_nonces_pkey PRIMARY KEY (nonce),
    CONSTRAINT mandate_nonces_check CHECK (((used_at IS NULL) = (used_for IS NULL)))
);

CREATE TABLE open_mandate_caps (
    open_digest text NOT NULL,
    identity text NOT NULL,
    spellings text[] NOT NULL,
    budget_max numeric(78,0),
    currency text NOT NULL,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT open_mandate_caps_pkey PRIMARY KEY (open_digest),
    CONSTRAINT open_mandate_caps_budget_max_check CHECK ((budget_max > (0)::numeric))
);

CREATE TABLE operation_events_unchained (
    event_id bigint,
    operation_id text,
    at timestamp with time zone,
    event text,
    from_status text,
    to_status text,
    actor text,
    detail jsonb
);

CREATE TABLE operations (
    operation_id text NOT NULL,
    tenant text NOT NULL,
    agent_id text,
    provider text NOT NULL,
    action text NOT NULL,
    method text NOT NULL,
    path text NOT NULL,
    path_params jsonb DEFAULT '{}'::jsonb NOT NULL,
    amount bigint,
    currency text,
    params jsonb DEFAULT '{}'::jsonb NOT NULL,
    idempotency_key text NOT NULL,
    approval_ref text NOT NULL,
    approved_by text NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    status text DEFAULT 'created'::text NOT NULL,
    revoked_at timestamp with time zone,
    revoked_reason text,
    attempts integer DEFAULT 0 NOT NULL,
    dispatched_at timestamp with time zone,
    lease_owner text,
    lease_until timestamp with time zone,
    last_outcome text,
    provider_status integer,
    provider_object_id text,
    response_content_type text,
    response_body bytea,
    settled_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    attempt_ended_at timestamp with time zone,
    settled_reason text,
    supersedes text,
    reconcile_owner text,
    reconcile_lease_until timestamp with time zone,
    reconcile_attempts integer DEFAULT 0 NOT NULL,
    next_reconcile_at timestamp with time zone,
    escalated_at timestamp with time zone,
    escalation_reason text,
    resolution_note text,
    unsent_attempts integer DEFAULT 0 NOT NULL,
    lookup_before_send timestamp with time zone,
    audit_seq bigint DEFAULT 0 NOT NULL,
    audit_hash bytea DEFAULT '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea NOT NULL,
    audit_event jsonb,
    audit_request jsonb,
    CONSTRAINT operations_pkey PRIMARY KEY (operation_id),
    CONSTRAINT operations_provider_key_unique UNIQUE (provider, idempotency_key),
    CONSTRAINT operations_supersedes_key UNIQUE (supersedes),
    CONSTRAINT operations_supersedes_fkey FOREIGN KEY (supersedes) REFERENCES operations(operation_id),
    CONSTRAINT operations_audit_event_consumed CHECK ((audit_event IS NULL)),
    CONSTRAINT operations_audit_request_consumed CHECK ((audit_request IS NULL)),
    CONSTRAINT operations_settled_has_answer CHECK (((status <> ALL (ARRAY['confirmed'::text, 'failed'::text])) OR (settled_at IS NOT NULL))),
    CONSTRAINT operations_status_check CHECK ((status = ANY (ARRAY['created'::text, 'dispatched'::text, 'confirmed'::text, 'failed'::text])))
);

CREATE TABLE opgate_heartbeat (
    id boolean DEFAULT true NOT NULL,
    beat_at timestamp with time zone DEFAULT now() NOT NULL,
    instance_id text,
    CONSTRAINT opgate_heartbeat_pkey PRIMARY KEY (id),
    CONSTRAINT opgate_heartbeat_id_check CHECK (id)
);

CREATE TABLE opgate_migrations (
    number integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT opgate_migrations_pkey PRIMARY KEY (number)
);

CREATE TABLE proposal_events (
    event_id bigint DEFAULT nextval('proposal_events_event_id_seq'::regclass) NOT NULL,
    proposal_id text NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    event text NOT NULL,
    from_status text,
    to_status text NOT NULL,
    actor text NOT NULL,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT proposal_events_pkey PRIMARY KEY (event_id),
    CONSTRAINT proposal_events_proposal_id_fkey FOREIGN KEY (proposal_id) REFERENCES proposals(proposal_id)
);

CREATE TABLE proposals (
    proposal_id text NOT NULL,
    operation_id text NOT NULL,
    tenant text NOT NULL,
    agent_id text NOT NULL,
    provider text NOT NULL,
    action text NOT NULL,
    method text NOT NULL,
    path text NOT NULL,
    path_params jsonb DEFAULT '{}'::jsonb NOT NULL,
    amount bigint,
    currency text,
    params jsonb DEFAULT '{}'::jsonb NOT NULL,
    idempotency_key text NOT NULL,
    reason text NOT NULL,
    approval_seconds double precision NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    decided_at timestamp with time zone,
    decided_by text,
    decision_note text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    declined_twin text,
    CONSTRAINT proposals_pkey PRIMARY KEY (proposal_id),
    CONSTRAINT proposals_operation_id_key UNIQUE (operation_id),
    CONSTRAINT proposals_declined_twin_fkey FOREIGN KEY (declined_twin) REFERENCES proposals(proposal_id),
    CONSTRAINT proposals_approval_seconds_check CHECK ((approval_seconds > (0)::double precision)),
    CONSTRAINT proposals_decided CHECK (((status = 'pending'::text) = (decided_at IS NULL))),
    CONSTRAINT proposals_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'approved'::text, 'declined'::text, 'withdrawn'::text])))
);

CREATE TABLE revoked_mandates (
    digest text NOT NULL,
    revoked_by text NOT NULL,
    reason text NOT NULL,
    revoked_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT revoked_mandates_pkey PRIMARY KEY (digest)
);

CREATE TABLE sync_witness (
    timeline_id integer NOT NULL,
    standby_names text NOT NULL,
    wal_senders text[] NOT NULL,
    statement_timeout text NOT NULL,
    recorded_at timestamp with time zone NOT NULL,
    instance_id text,
    CONSTRAINT sync_witness_pkey PRIMARY KEY (timeline_id)
);

CREATE TABLE timelines (
    timeline_id integer NOT NULL,
    seen_at timestamp with time zone DEFAULT now() NOT NULL,
    marked integer DEFAULT 0 NOT NULL,
    unmarked_because text,
    CONSTRAINT timelines_pkey PRIMARY KEY (timeline_id)
);

CREATE TABLE transparency_checkpoints (
    tree_size bigint NOT NULL,
    root bytea NOT NULL,
    note text NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT transparency_checkpoints_pkey PRIMARY KEY (tree_size)
);

CREATE TABLE transparency_cosignatures (
    tree_size bigint NOT NULL,
    witness text NOT NULL,
    line text NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT transparency_cosignatures_pkey PRIMARY KEY (tree_size, witness),
    CONSTRAINT transparency_cosignatures_tree_size_fkey FOREIGN KEY (tree_size) REFERENCES transparency_checkpoints(tree_size)
);

CREATE TABLE transparency_head_buckets (
    bucket integer NOT NULL,
    hash bytea NOT NULL,
    CONSTRAINT transparency_head_buckets_pkey PRIMARY KEY (bucket),
    CONSTRAINT transparency_head_buckets_bucket_check CHECK (((bucket >= 0) AND (bucket < 4096)))
);

CREATE TABLE transparency_heads (
    stream text NOT NULL,
    bucket integer NOT NULL,
    seq bigint NOT NULL,
    record_hash bytea NOT NULL,
    CONSTRAINT transparency_heads_pkey PRIMARY KEY (stream),
    CONSTRAINT transparency_heads_bucket_check CHECK (((bucket >= 0) AND (bucket < 4096)))
);

CREATE TABLE transparency_leaves (
    leaf_index bigint NOT NULL,
    stream text NOT NULL,
    seq bigint NOT NULL,
    record_hash bytea NOT NULL,
    CONSTRAINT transparency_leaves_pkey PRIMARY KEY (leaf_index),
    CONSTRAINT transparency_leaves_stream_seq_key UNIQUE (stream, seq)
);

CREATE TABLE transparency_nodes (
    level smallint NOT NULL,
    node_index bigint NOT NULL,
    hash bytea NOT NULL,
    CONSTRAINT transparency_nodes_pkey PRIMARY KEY (level, node_index)
);

CREATE TABLE transparency_state (
    singleton boolean DEFAULT true NOT NULL,
    tree_size bigint DEFAULT 0 NOT NULL,
    floor_txid bigint DEFAULT 0 NOT NULL,
    heads_size bigint,
    CONSTRAINT transparency_state_pkey PRIMARY KEY (singleton),
    CONSTRAINT transparency_state_singleton_check CHECK (singleton)
);

CREATE TABLE x402_payments (
    operation_id text NOT NULL,
    header text NOT NULL,
    payload_sha256 text NOT NULL,
    nonce text NOT NULL,
    payer text NOT NULL,
    pay_to text NOT NULL,
    amount numeric(78,0) NOT NULL,
    asset text NOT NULL,
    network text NOT NULL,
    valid_before bigint NOT NULL,
    signed_at timestamp with time zone DEFAULT now() NOT NULL,
    settlement jsonb,
    settled_at timestamp with time zone,
    payment_id bigint NOT NULL,
    payer_kind text DEFAULT 'opgate'::text NOT NULL,
    released_at timestamp with time zone,
    released_evidence jsonb,
    CONSTRAINT x402_payments_pkey PRIMARY KEY (payment_id),
    CONSTRAINT x402_payments_operation_id_fkey FOREIGN KEY (operation_id) REFERENCES operations(operation_id),
    CONSTRAINT x402_payments_amount_check CHECK ((amount >= (0)::numeric)),
    CONSTRAINT x402_payments_payer_kind_check CHECK ((payer_kind = ANY (ARRAY['opgate'::text, 'agent'::text])))
);


-- ------------------------------------------------------------------------------------- sequences

CREATE SEQUENCE audit_checkpoints_checkpoint_id_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1
    OWNED BY audit_checkpoints.checkpoint_id;
CREATE SEQUENCE audit_event_ids AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;
CREATE SEQUENCE escalation_notifications_notification_id_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1
    OWNED BY escalation_notifications.notification_id;
CREATE SEQUENCE proposal_events_event_id_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1
    OWNED BY proposal_events.event_id;
CREATE SEQUENCE x402_payments_payment_id_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1
    OWNED BY x402_payments.payment_id;

-- --------------------------------------------------------------------------------------- indexes

CREATE INDEX audit_heads_unchecked ON audit_heads USING btree (stream) WHERE (seq > checkpointed_seq);
CREATE INDEX audit_log_by_operation ON audit_log USING btree (operation_id, at) WHERE (operation_id IS NOT NULL);
CREATE INDEX audit_log_by_time ON audit_log USING btree (at);
CREATE INDEX audit_log_integration ON audit_log USING brin (COALESCE(txid, (0)::bigint));
CREATE INDEX console_sessions_expiry ON console_sessions USING btree (expires_at);
CREATE INDEX escalation_notifications_due ON escalation_notifications USING btree (next_attempt_at) WHERE (delivered_at IS NULL);
CREATE INDEX mandate_nonces_by_expiry ON mandate_nonces USING btree (expires_at);
CREATE INDEX operations_budget_window_v2 ON operations USING btree (provider, currency, dispatched_at) INCLUDE (tenant, agent_id, amount, operation_id, status, attempts, unsent_attempts, revoked_at, lookup_before_send) WHERE ((status = ANY (ARRAY['dispatched'::text, 'confirmed'::text])) AND (amount IS NOT NULL));
CREATE INDEX operations_by_open_mandate ON operations USING btree (split_part(approval_ref, ';open:'::text, 2)) WHERE (approval_ref ~~ 'ap2:%;open:%'::text);
CREATE INDEX operations_reconcilable ON operations USING btree (dispatched_at) WHERE ((status = 'dispatched'::text) AND (escalated_at IS NULL));
CREATE INDEX operations_unsettled ON operations USING btree (tenant, status) WHERE (status = ANY (ARRAY['created'::text, 'dispatched'::text]));
CREATE INDEX proposal_events_by_proposal ON proposal_events USING btree (proposal_id, event_id);
CREATE INDEX proposals_by_tenant ON proposals USING btree (tenant, created_at);
CREATE INDEX proposals_declined_by_agent ON proposals USING btree (tenant, agent_id, decided_at) WHERE (status = 'declined'::text);
CREATE INDEX proposals_pending ON proposals USING btree (created_at) WHERE (status = 'pending'::text);
CREATE INDEX proposals_pending_by_agent ON proposals USING btree (tenant, agent_id, expires_at) WHERE (status = 'pending'::text);
CREATE INDEX proposals_withdrawn ON proposals USING btree (decided_at) WHERE (status = 'withdrawn'::text);
CREATE INDEX transparency_heads_bucket ON transparency_heads USING btree (bucket);
CREATE INDEX x402_payments_live_by_time ON x402_payments USING btree (signed_at) WHERE (released_at IS NULL);
CREATE UNIQUE INDEX x402_payments_one_live ON x402_payments USING btree (operation_id) WHERE (released_at IS NULL);

-- ----------------------------------------------------------------------------------------- views

CREATE VIEW audit_stream_heads AS
 SELECT h.stream,
    h.seq,
    h.hash
   FROM audit_heads h
  WHERE NOT (EXISTS ( SELECT 1
           FROM operations o
          WHERE o.operation_id = h.stream))
UNION ALL
 SELECT o.operation_id AS stream,
    o.audit_seq AS seq,
    o.audit_hash AS hash
   FROM operations o
  WHERE o.audit_seq > 0;

CREATE VIEW operation_events AS
 SELECT (a.record ->> 'event_id'::text)::bigint AS event_id,
    a.stream AS operation_id,
    a.at,
    a.record ->> 'event'::text AS event,
    a.record ->> 'status_before'::text AS from_status,
    a.record ->> 'status_after'::text AS to_status,
    a.record ->> 'actor'::text AS actor,
    a.record -> 'detail'::text AS detail
   FROM audit_log a
  WHERE a.kind = 'transition'::text
UNION ALL
 SELECT operation_events_unchained.event_id,
    operation_events_unchained.operation_id,
    operation_events_unchained.at,
    operation_events_unchained.event,
    operation_events_unchained.from_status,
    operation_events_unchained.to_status,
    operation_events_unchained.actor,
    operation_events_unchained.detail
   FROM operation_events_unchained;


-- ------------------------------------------------------------------------------------- functions

CREATE OR REPLACE FUNCTION opgate_audit_append_batch(in_stream text, in_kind text, in_records jsonb)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    at_now     timestamptz := now();
    head_seq   bigint;
    head_hash  bytea;
    head_prev  bytea;
    seqs       bigint[] := '{}';
    operations text[] := '{}';
    recs       jsonb[] := '{}';
    prevs      bytea[] := '{}';
    hashes     bytea[] := '{}';
    item       jsonb;
BEGIN
    IF jsonb_array_length(in_records) = 0 THEN
        RETURN;
    END IF;
    SELECT h.seq, h.hash, h.prev_hash INTO head_seq, head_hash, head_prev
      FROM audit_heads h WHERE h.stream = in_stream FOR UPDATE;
    IF NOT FOUND THEN
        -- the stream's first records: a head at 0 (moved below, before anyone can see it);
        -- DO NOTHING then the lock: another transaction's first records went first
        INSERT INTO audit_heads (stream, seq, prev_hash, hash)
        VALUES (in_stream, 0,
                '\x0000000000000000000000000000000000000000000000000000000000000000',
                '\x0000000000000000000000000000000000000000000000000000000000000000')
        ON CONFLICT (stream) DO NOTHING;
        SELECT h.seq, h.hash, h.prev_hash INTO head_seq, head_hash, head_prev
          FROM audit_heads h WHERE h.stream = in_stream FOR UPDATE;
    END IF;
    FOR item IN SELECT r.value FROM jsonb_array_elements(in_records) WITH ORDINALITY
                                    AS r (value, position) ORDER BY r.position LOOP
        head_prev := head_hash;
        head_seq := head_seq + 1;
        head_hash := opgate_audit_hash(head_prev, in_stream, head_seq, at_now, in_kind,
                                       item ->> 'operation_id', item);
        seqs := seqs || head_seq;
        operations := operations || (item ->> 'operation_id');
        recs := recs || item;
        prevs := prevs || head_prev;
        hashes := hashes || head_hash;
    END LOOP;
    INSERT INTO audit_log (stream, seq, at, kind, operation_id, record, prev_hash, hash)
    SELECT in_stream, r.seq, at_now, in_kind, r.operation_id, r.record, r.prev_hash, r.hash
      FROM unnest(seqs, operations, recs, prevs, hashes)
           AS r (seq, operation_id, record, prev_hash, hash);
    UPDATE audit_heads SET seq = head_seq, prev_hash = head_prev, hash = head_hash
     WHERE stream = in_stream;
END
$function$;

CREATE OR REPLACE FUNCTION opgate_audit_append_requests(in_stream text, in_kind text, in_records jsonb, in_run jsonb, in_many boolean)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    run_key text := in_run ->> 'run_id';
    first   bigint := (in_run ->> 'batch_first')::bigint;
    total   integer := jsonb_array_length(in_records);
    kept    bigint;
    skipped integer := 0;
    fresh   jsonb := in_records;
BEGIN
    IF first IS NOT NULL THEN
        -- the run's row, locked until commit: a previous attempt of this batch holding it is
        -- waited for, and what it committed is read
        SELECT r.stored_records INTO kept FROM audit_instance_runs r
         WHERE r.run_id = run_key FOR UPDATE;
        IF NOT FOUND THEN
            -- the run's first trace; if an attempt of this batch wrote it meanwhile, the
            -- insert waits for it and the read below sees what it stored
            PERFORM opgate_audit_run_seen(in_run - 'stored_records');
            SELECT r.stored_records INTO kept FROM audit_instance_runs r
             WHERE r.run_id = run_key FOR UPDATE;
        END IF;
        skipped := least(greatest(kept - first + 1, 0), total);
        IF skipped > 0 THEN
            SELECT coalesce(jsonb_agg(r.value ORDER BY r.position), '[]'::jsonb) INTO fresh
              FROM jsonb_array_elements(in_records) WITH ORDINALITY AS r (value, position)
             WHERE r.position > skipped;
        END IF;
    END IF;
    PERFORM opgate_audit_run_seen(in_run);
    IF total - skipped = 0 THEN
        RETURN skipped;
    END IF;
    IF in_many THEN
        PERFORM opgate_audit_append_batch(in_stream, in_kind, fresh);
    ELSE
        INSERT INTO audit_log (stream, seq, kind, operation_id, record, prev_hash, hash)
        SELECT in_stream, 0, in_kind, r.value ->> 'operation_id', r.value, '\x', '\x'
          FROM jsonb_array_elements(fresh) WITH ORDINALITY AS r (value, position)
         ORDER BY r.position;
    END IF;
    RETURN skipped;
END
$function$;

CREATE OR REPLACE FUNCTION opgate_audit_chain()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    NEW.at := now();
    UPDATE audit_heads AS h
       SET seq = h.seq + 1, prev_hash = h.hash,
           hash = opgate_audit_hash(h.hash, NEW.stream, h.seq + 1, NEW.at, NEW.kind,
                                    NEW.operation_id, NEW.record)
     WHERE h.stream = NEW.stream
    RETURNING h.seq, h.prev_hash, h.hash INTO NEW.seq, NEW.prev_hash, NEW.hash;
    IF NOT FOUND THEN
        INSERT INTO audit_heads AS h (stream, seq, prev_hash, hash)
        VALUES (NEW.stream, 1,
                '\x0000000000000000000000000000000000000000000000000000000000000000',
                opgate_audit_hash(
                    '\x0000000000000000000000000000000000000000000000000000000000000000',
                    NEW.stream, 1, NEW.at, NEW.kind, NEW.operation_id, NEW.record))
        ON CONFLICT (stream) DO UPDATE
           SET seq = h.seq + 1, prev_hash = h.hash,
               hash = opgate_audit_hash(h.hash, NEW.stream, h.seq + 1, NEW.at, NEW.kind,
                                        NEW.operation_id, NEW.record)
        RETURNING h.seq, h.prev_hash, h.hash INTO NEW.seq, NEW.prev_hash, NEW.hash;
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION opgate_audit_field(value text)
 RETURNS bytea
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN value IS NULL THEN '\xffffffff'::bytea
                ELSE int4send(octet_length(convert_to(value, 'UTF8'))) || convert_to(value, 'UTF8')
           END
$function$;

CREATE OR REPLACE FUNCTION opgate_audit_field_v2(encoded bytea)
 RETURNS bytea
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT int4send(octet_length($1)) || $1 $function$;

CREATE OR REPLACE FUNCTION opgate_audit_hash(prev bytea, stream text, seq bigint, at timestamp with time zone, kind text, operation_id text, record jsonb)
 RETURNS bytea
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
DECLARE
    fields  text[] := ARRAY[stream, seq::text,
                            ((extract(epoch FROM at) * 1000000)::bigint)::text,
                            kind, operation_id, record::text];
    content bytea := convert_to('opgate-audit-v1', 'UTF8') || prev;
    field   text;
    encoded bytea;
BEGIN
    FOREACH field IN ARRAY fields LOOP
        IF field IS NULL THEN
            content := content || '\xffffffff'::bytea;
        ELSE
            encoded := convert_to(field, 'UTF8');
            content := content || int4send(octet_length(encoded)) || encoded;
        END IF;
    END LOOP;
    RETURN sha256(content);
END
$function$;

CREATE OR REPLACE FUNCTION opgate_audit_operation()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION opgate_audit_operation_v2()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION opgate_audit_proposal()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    instance  text := nullif(current_setting('opgate.instance_id', true), '');
    version   text;
    operation text;
BEGIN
    SELECT policy_version INTO version FROM audit_instances WHERE instance_id = instance;
    SELECT operation_id INTO operation FROM proposals WHERE proposal_id = NEW.proposal_id;
    INSERT INTO audit_log (stream, seq, kind, operation_id, record, prev_hash, hash)
    VALUES ('proposals/' || NEW.proposal_id, 0, 'proposal', operation,
            jsonb_build_object(
                'schema_version', 1,
                'time', to_jsonb(NEW.at),
                'event', NEW.event,
                'event_id', NEW.event_id,
                'proposal_id', NEW.proposal_id,
                'operation_id', operation,
                'status_before', NEW.from_status,
                'status_after', NEW.to_status,
                'actor', NEW.actor,
                'detail', NEW.detail,
                'instance_id', instance,
                'policy_version', version),
            '\x', '\x');
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION opgate_audit_run_seen(in_run jsonb)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    numbered bigint := (in_run ->> 'numbered_seq')::bigint;
    stored   bigint := (in_run ->> 'stored_seq')::bigint;
    kept     bigint := coalesce((in_run ->> 'stored_records')::bigint, 0);
    stopped  timestamptz := CASE WHEN (in_run ->> 'stopped')::boolean THEN now() END;
BEGIN
    UPDATE audit_instance_runs AS r
       SET numbered_seq = greatest(r.numbered_seq, numbered),
           stored_seq = greatest(r.stored_seq, stored),
           stored_records = greatest(r.stored_records, kept),
           last_seen_at = now(),
           stopped_at = coalesce(r.stopped_at, stopped)
     WHERE r.run_id = in_run ->> 'run_id';
    IF NOT FOUND THEN
        INSERT INTO audit_instance_runs AS r
               (run_id, instance_id, stream, numbered_seq, stored_seq, stored_records,
                heartbeat_seconds, stopped_at)
        VALUES (in_run ->> 'run_id', in_run ->> 'instance_id', in_run ->> 'stream', numbered,
                stored, kept, (in_run ->> 'heartbeat_seconds')::double precision, stopped)
        ON CONFLICT (run_id) DO UPDATE  -- its first batch and first heartbeat raced
           SET numbered_seq = greatest(r.numbered_seq, numbered),
               stored_seq = greatest(r.stored_seq, stored),
               stored_records = greatest(r.stored_records, kept),
               last_seen_at = now(),
               stopped_at = coalesce(r.stopped_at, stopped);
    END IF;
END
$function$;

CREATE OR REPLACE FUNCTION opgate_current_timeline()
 RETURNS integer
 LANGUAGE sql
AS $function$
    SELECT CASE WHEN pg_is_in_recovery() THEN NULL
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
           END
    $function$;

CREATE OR REPLACE FUNCTION opgate_lease_free(lease_until timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$ SELECT $1 IS NULL OR $1 <= now() $function$;

CREATE OR REPLACE FUNCTION opgate_lease_free_v2(lease_until timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 PARALLEL SAFE
AS $function$ SELECT $1 IS NULL OR $1 <= clock_timestamp() $function$;

CREATE OR REPLACE FUNCTION opgate_nothing_left_yet(status text, attempts integer, unsent_attempts integer)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT opgate_unsettled($1) AND $2 = $3 $function$;

CREATE OR REPLACE FUNCTION opgate_nothing_sent(status text, attempts integer, unsent_attempts integer, lookup_before_send timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT opgate_nothing_left_yet($1, $2, $3) AND $4 IS NULL $function$;

CREATE OR REPLACE FUNCTION opgate_spends(status text, attempts integer, unsent_attempts integer, revoked_at timestamp with time zone, lookup_before_send timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT NOT ($1 = 'failed' OR ($4 IS NOT NULL AND opgate_nothing_sent($1, $2, $3, $5))) $function$;

CREATE OR REPLACE FUNCTION opgate_unsettled(status text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT $1 IN ('created', 'dispatched') $function$;


-- -------------------------------------------------------------------------------------- triggers

CREATE TRIGGER audit_log_chain BEFORE INSERT ON audit_log FOR EACH ROW WHEN ((new.seq = 0)) EXECUTE FUNCTION opgate_audit_chain();
CREATE TRIGGER operations_audit BEFORE INSERT OR UPDATE ON operations FOR EACH ROW WHEN ((new.audit_event IS NOT NULL)) EXECUTE FUNCTION opgate_audit_operation_v2();
CREATE TRIGGER proposal_events_audit AFTER INSERT ON proposal_events FOR EACH ROW EXECUTE FUNCTION opgate_audit_proposal();
