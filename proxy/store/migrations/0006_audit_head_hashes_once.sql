-- 0006: the audit trigger hashes each record once, not twice.
--
-- Why: 0003's head upsert computed the hash for its VALUES row (a stream's first record) even
-- when the stream already had a head, and then again in DO UPDATE: two PL/pgSQL hashes per
-- record, most of a transition's cost in PostgreSQL (bench/README.md). Streams almost always
-- exist (an operation's stream starts at its creation), so the head is advanced by an UPDATE
-- first, and only a stream's first record takes the INSERT (ON CONFLICT still covers two first
-- records racing). The chain, the encoding and the locking are unchanged: a record is chained
-- to its stream's head under that head's row lock, in the inserting statement.

CREATE OR REPLACE FUNCTION opgate_audit_chain() RETURNS trigger
LANGUAGE plpgsql AS $$
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
$$;
