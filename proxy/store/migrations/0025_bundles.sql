-- 0025: where each stream ends, signed (docs/audit.md, *What a bundle proves*).
--
-- The integrator keeps, besides the tree of records, each stream's head as the tree holds it
-- (its last integrated record) in 4096 buckets, and each checkpoint it signs carries the root
-- of the map (proxy/transparency/heads.py) as an extension line. A bundle then proves where an
-- operation's stream ends at its checkpoint, so that one whose tail was dropped fails.
--
-- Nothing is backfilled here: the integrator's first round after this migration (heads_size
-- NULL, not the tree's size) rebuilds the heads from the leaves.

CREATE TABLE transparency_heads (
    stream      text    PRIMARY KEY,
    bucket      integer NOT NULL CHECK (bucket >= 0 AND bucket < 4096),
    seq         bigint  NOT NULL,
    record_hash bytea   NOT NULL
);
CREATE INDEX transparency_heads_bucket ON transparency_heads (bucket);

-- Each non-empty bucket's hash (an absent bucket is empty).
CREATE TABLE transparency_head_buckets (
    bucket integer PRIMARY KEY CHECK (bucket >= 0 AND bucket < 4096),
    hash   bytea   NOT NULL
);

-- The tree size the heads describe (NULL: not built yet).
ALTER TABLE transparency_state ADD COLUMN heads_size bigint;
