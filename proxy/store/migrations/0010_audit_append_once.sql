-- 0010: a batch of audit records chained in one statement, with one update of its stream's head.
--
-- Why: every audit_log row is chained by its BEFORE INSERT trigger (0003, 0006), which advances
-- the stream's head row: a batch of N request records (the audit writer's, proxy/observe/
-- auditlog/writer.py) made N new versions of that one row, each with its index entries.
-- Measured alone (bench/README.md, bench/pg_transitions.py), PostgreSQL's CPU per record in
-- batches of 16: 37-43 us before, 24-26 us with this function (8: 42-48 -> 35-38; 64: 31 ->
-- 14); equal at 4 records and dearer below (one more statement per batch), so small batches
-- still go through the trigger (the audit writer chooses: proxy/observe/auditlog/records.py).
--
-- opgate_audit_append_batch locks the stream's head row (until commit, as the trigger does),
-- hashes each record onto the one before it with opgate_audit_hash, inserts the rows with their
-- seq and hashes, and moves the head once. The chain, the record encoding, the `at` (the
-- transaction's now()), the locking and the heads are what they were: records appended before
-- this migration and after it form one chain per stream, and `opgate audit verify` checks them
-- alike. Transitions and proposals are chained by the trigger as before (moving them into a
-- function measured the same).
--
-- audit_log's chaining trigger now runs only for a row inserted with seq 0 (every INSERT
-- opgate writes but this function's, and any hand-written one: the trigger numbers and chains
-- it). A row inserted with a seq of its own is taken as it is. That is no new power: whoever
-- may insert into audit_log may update audit_heads, which the trigger needs, and could write
-- anything the trigger would have refused. verify finds such a row as it finds any other
-- written around the chain: a hash that does not match, a link that does not hold, a head that
-- is not the stream's last record.

-- Chain a batch of records (a JSON array, in order; each one's operation_id from its field of
-- that name) onto their stream's head: the head is locked once and moved once.
CREATE FUNCTION opgate_audit_append_batch(in_stream text, in_kind text, in_records jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
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
$$;

DROP TRIGGER audit_log_chain ON audit_log;
CREATE TRIGGER audit_log_chain BEFORE INSERT ON audit_log
    FOR EACH ROW WHEN (NEW.seq = 0) EXECUTE FUNCTION opgate_audit_chain();
