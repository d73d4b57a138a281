-- AP2 Payment Mandates as approvals (proxy/mandates/, proxy/operations/mandates_api.py).
--
-- An operation a mandate approved carries approval_ref 'ap2:<closed>' or
-- 'ap2:<closed>;open:<open>', each the base64url SHA-256 of a mandate's issuer-signed JWT. The
-- index finds every operation under one open mandate: its uses and its spending are counted
-- under an advisory lock before another closed mandate is accepted under it.
CREATE INDEX operations_by_open_mandate
    ON operations (split_part(approval_ref, ';open:', 2))
    WHERE approval_ref LIKE 'ap2:%;open:%';

-- Mandates revoked through the operations API (AP2 itself has none): a revoked mandate approves
-- nothing more, and a revoked open mandate no closed one under it.
CREATE TABLE revoked_mandates (
    digest text PRIMARY KEY,
    revoked_by text NOT NULL,
    reason text NOT NULL,
    revoked_at timestamptz NOT NULL DEFAULT now()
);
