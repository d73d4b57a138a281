-- 0015: a batch of request records sent again after its commit happened is stored once.
--
-- The audit writer (proxy/observe/auditlog/writer.py) sends a batch again when its statement
-- raised. But a statement can raise after its transaction committed: the acknowledgement lost
-- with the connection (a failover, a cut network), or a wait for a synchronous standby ended by
-- a cancel or a terminate (PostgreSQL keeps the transaction committed locally and only warns).
-- Sent again, the batch was chained a second time, and `opgate audit verify` reported the
-- instance's records "stored twice": a trail a reviewer cannot tell from tampering (issue 27).
--
-- Each run's row (0012) now also counts how many of the run's records are stored: the writer
-- queues a run's records in one order (its `started` record first, 1) and stores them in that
-- order, a batch being the front of the queue, so what is stored is always a prefix of it. A
-- batch says where it begins in that order (in_run "batch_first"); the records of it the
-- prefix already holds are skipped, the others chained, and the count moved past the batch, in
-- the batch's statement. The decision is taken holding the run's row lock (taken before the
-- stream's head lock, in the order 0012 took them): an earlier attempt of the same batch still
-- running on the server (its client gone) is waited for, and what it committed is read after it.
-- So it is exact, and takes no read of audit_log.
--
-- Nothing about the chain changes: the records stored, their encoding and hashes, the trigger
-- and opgate_audit_append_batch (0010) are as they were, and every chain written before verifies
-- as before. A call without "batch_first" (a writer from before this migration) stores every
-- record, as before. The function now returns how many records it skipped (the writer logs them).

-- how many of the run's records, in the order its writer queued them, are stored
ALTER TABLE audit_instance_runs ADD COLUMN stored_records bigint NOT NULL DEFAULT 0;

-- 0012's trace, now also moving stored_records (in_run "stored_records"; absent: unchanged).
CREATE OR REPLACE FUNCTION opgate_audit_run_seen(in_run jsonb) RETURNS void
LANGUAGE plpgsql AS $$
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
$$;

DROP FUNCTION opgate_audit_append_requests(text, text, jsonb, jsonb, boolean);

-- A batch of one run's request records and its trace, in one statement (0012), storing only
-- the records not already stored (above); returns how many were. in_run "batch_first": the
-- run's ordinal of the batch's first record; absent, every record is stored.
CREATE FUNCTION opgate_audit_append_requests(
    in_stream text, in_kind text, in_records jsonb, in_run jsonb, in_many boolean
) RETURNS integer
LANGUAGE plpgsql AS $$
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
$$;
