-- 0027: the application's Idempotency-Key on POST /v1/operations (docs/reference/operations-api.md).
--
-- An approval answered 503 may exist: its insert committed and the answer was lost with the
-- connection (a failover, a standby outage). An application retrying without an operation id
-- created a second approved operation for one intent. With an Idempotency-Key (the IETF
-- httpapi idempotency-key draft), the retry finds the operation the key made: the key is
-- stored with the operation, in the same statement (queries.sql create_operation_keyed), and
-- with a fingerprint of the approval, so that the same key with another approval is refused
-- (422), not answered with an operation it did not ask for.
--
-- Scope: the tenant the approval is for, and the caller (the admin token: "admin"), so that
-- two tenants' applications cannot collide on a key or learn of each other's operations.
CREATE TABLE approval_keys (
    tenant text NOT NULL,
    caller text NOT NULL,
    request_key text NOT NULL,
    fingerprint text NOT NULL,  -- sha256 of the approval in canonical JSON (hex)
    operation_id text NOT NULL REFERENCES operations (operation_id),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, caller, request_key)
);
