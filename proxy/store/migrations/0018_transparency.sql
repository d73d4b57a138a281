-- 0018: the audit log as a transparency log (docs/audit.md, *Transparency log*).
--
-- Every audit record gets a global index and becomes a leaf of one RFC 6962 Merkle tree
-- (leaf = SHA-256(0x00 || the record's chain hash)), whose heads opgate signs as C2SP
-- checkpoints with an Ed25519 key the database never sees, and witnesses cosign. The
-- integrator (proxy/observe/auditlog/integrator.py) does it, one at a time across replicas.
--
-- Which records are new, without missing one that commits late: each row records the
-- transaction that inserted it (`txid`). Below the oldest transaction still running (the
-- snapshot's xmin) no row can appear any more; so a round takes every visible row at or above
-- its floor that has no leaf yet, and when it took them all, raises the floor to the xmin it
-- saw. The window above the floor stays small unless a transaction stays open long (the anti-
-- join is by primary key). Rows written before this migration have no txid and count as txid
-- 0; the column has no default value for them, so adding it rewrites nothing.

-- The txid is kept as a bigint (an xid8 is a 64-bit counter that never wraps), for a BRIN
-- index: rows arrive in txid order, so the index costs next to nothing per record, and the
-- newest pages (not summarized yet) are the ones a round reads anyway.
ALTER TABLE audit_log ADD COLUMN txid bigint;
ALTER TABLE audit_log ALTER COLUMN txid SET DEFAULT pg_current_xact_id()::text::bigint;
CREATE INDEX audit_log_integration ON audit_log USING brin ((COALESCE(txid, 0)));

-- The leaves: which record each index holds, and the record's hash when it was integrated
-- (what the tree commits to: a row rewritten later no longer matches its leaf).
CREATE TABLE transparency_leaves (
    leaf_index  bigint PRIMARY KEY,
    stream      text   NOT NULL,
    seq         bigint NOT NULL,
    record_hash bytea  NOT NULL,
    UNIQUE (stream, seq)
);

-- The tree's complete subtrees: (level, node_index) hashes leaves
-- [node_index * 2^level, (node_index + 1) * 2^level). Written once, never changed.
CREATE TABLE transparency_nodes (
    level      smallint NOT NULL,
    node_index bigint   NOT NULL,
    hash       bytea    NOT NULL,
    PRIMARY KEY (level, node_index)
);

-- The integrator's position: the tree's size, and the txid below which every row is a leaf.
CREATE TABLE transparency_state (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    tree_size  bigint  NOT NULL DEFAULT 0,
    floor_txid bigint  NOT NULL DEFAULT 0
);
INSERT INTO transparency_state DEFAULT VALUES;

-- Signed checkpoints (C2SP tlog-checkpoint, the whole signed note) and the witnesses'
-- cosignature lines for them (C2SP tlog-cosignature).
CREATE TABLE transparency_checkpoints (
    tree_size bigint      PRIMARY KEY,
    root      bytea       NOT NULL,
    note      text        NOT NULL,
    at        timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE transparency_cosignatures (
    tree_size bigint      NOT NULL REFERENCES transparency_checkpoints,
    witness   text        NOT NULL,  -- the witness's key name
    line      text        NOT NULL,  -- its signature line, verbatim
    at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tree_size, witness)
);
