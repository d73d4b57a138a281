-- 0004: the same record hash as 0003, computed by a PL/pgSQL function instead of SQL ones.
--
-- Why: the audit trigger calls opgate_audit_hash (twice per record: the upsert's VALUES and its
-- DO UPDATE) from a PL/pgSQL statement, where a LANGUAGE sql function that cannot be inlined is
-- parsed and planned again on every call, and so is each of its seven opgate_audit_field
-- calls (a field's argument is used three times, which blocks inlining). That planning was
-- most of the cost of a transition: measured with pgbench on claim+settle (bench/README.md),
-- ~970 pairs/s and ~1.9 ms of machine CPU per pair before, ~1,850-2,000 pairs/s and ~1.0 ms
-- after. A PL/pgSQL function keeps its expressions' plans for the session.
--
-- The encoding is unchanged, byte for byte (proxy/observe/auditlog/chain.py recomputes it; existing
-- chains stay verifiable): the tag, the previous hash, then each field as a 4-byte big-endian
-- length and its UTF-8 bytes, or ffffffff for NULL. opgate_audit_field stays as it was, for
-- anyone who calls it by hand.

CREATE OR REPLACE FUNCTION opgate_audit_hash(
    prev bytea, stream text, seq bigint, at timestamptz, kind text, operation_id text,
    record jsonb
) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
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
$$;
