-- 0012: how far each run of an opgate instance numbered its request records, and whether it
-- stopped cleanly (docs/audit.md, "Lost writes").
--
-- Request records are queued in memory and stored in batches (proxy/observe/auditlog/writer.py):
-- a SIGKILL loses what is still queued, and the stored records alone cannot show a loss at the
-- tail (the numbers after the last stored one never reached the database). Each run of the
-- writer (one run of the process, named by the `run_id` of its `started` record) keeps one row
-- here: written by the statement that stores each of its batches, by a heartbeat while it has
-- nothing to store, and once more at a clean stop. `opgate audit verify` reads it to name a run
-- that ended without a clean stop and to count what it had numbered and not stored.

CREATE TABLE audit_instance_runs (
    run_id            text             PRIMARY KEY,
    instance_id       text             NOT NULL,
    stream            text             NOT NULL,  -- requests/<instance_id>
    started_at        timestamptz      NOT NULL DEFAULT now(),
    -- the highest instance_seq the run had given out, as of last_seen_at
    numbered_seq      bigint           NOT NULL DEFAULT 0,
    -- the highest instance_seq stored, or declared dropped (a `dropped` record), by then
    stored_seq        bigint           NOT NULL DEFAULT 0,
    last_seen_at      timestamptz      NOT NULL DEFAULT now(),
    -- how often the run leaves a trace at the least: what "still running" is measured by
    heartbeat_seconds double precision NOT NULL,
    stopped_at        timestamptz                 -- a clean stop; null: running, or not clean
);

-- No index beyond the key: a run's row is updated with every batch it stores, and an index on
-- (or a predicate over) the columns that change would make each update a non-HOT one, with
-- index churn on the request path's statement. The table holds one row per process start;
-- verify reads it whole.

-- A run's trace (in_run: {"run_id", "instance_id", "stream", "numbered_seq", "stored_seq",
-- "heartbeat_seconds", "stopped"}): created by its first, moved forward by every later one
-- (numbers never go back, a stop is never undone). PL/pgSQL, an UPDATE first: it runs in every
-- batch's statement, where a LANGUAGE sql function would be planned again on each call (see
-- 0004) and an upsert would try an insert first every time; the run's row exists from its
-- first batch on.
CREATE FUNCTION opgate_audit_run_seen(in_run jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    numbered bigint := (in_run ->> 'numbered_seq')::bigint;
    stored   bigint := (in_run ->> 'stored_seq')::bigint;
    stopped  timestamptz := CASE WHEN (in_run ->> 'stopped')::boolean THEN now() END;
BEGIN
    UPDATE audit_instance_runs AS r
       SET numbered_seq = greatest(r.numbered_seq, numbered),
           stored_seq = greatest(r.stored_seq, stored),
           last_seen_at = now(),
           stopped_at = coalesce(r.stopped_at, stopped)
     WHERE r.run_id = in_run ->> 'run_id';
    IF NOT FOUND THEN
        INSERT INTO audit_instance_runs AS r
               (run_id, instance_id, stream, numbered_seq, stored_seq, heartbeat_seconds,
                stopped_at)
        VALUES (in_run ->> 'run_id', in_run ->> 'instance_id', in_run ->> 'stream', numbered,
                stored, (in_run ->> 'heartbeat_seconds')::double precision, stopped)
        ON CONFLICT (run_id) DO UPDATE  -- its first batch and first heartbeat raced
           SET numbered_seq = greatest(r.numbered_seq, numbered),
               stored_seq = greatest(r.stored_seq, stored),
               last_seen_at = now(),
               stopped_at = coalesce(r.stopped_at, stopped);
    END IF;
END
$$;

-- A batch of one run's request records and its trace, in one statement: the trace can never
-- say a record is stored that is not, nor miss one that is. in_many: chained by
-- opgate_audit_append_batch (0010) rather than by the trigger row by row (the writer decides,
-- proxy/observe/auditlog/records.py MANY_RECORDS).
CREATE FUNCTION opgate_audit_append_requests(
    in_stream text, in_kind text, in_records jsonb, in_run jsonb, in_many boolean
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM opgate_audit_run_seen(in_run);
    IF in_many THEN
        PERFORM opgate_audit_append_batch(in_stream, in_kind, in_records);
    ELSE
        INSERT INTO audit_log (stream, seq, kind, operation_id, record, prev_hash, hash)
        SELECT in_stream, 0, in_kind, r.value ->> 'operation_id', r.value, '\x', '\x'
          FROM jsonb_array_elements(in_records) WITH ORDINALITY AS r (value, position)
         ORDER BY r.position;
    END IF;
END
$$;
