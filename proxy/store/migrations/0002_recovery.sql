-- 0002: recovery. Reconciliation with the provider, escalation to a human, superseding
-- approvals, and an outbox for escalation notifications.

ALTER TABLE operations
    -- when the last attempt ended (answer, unknown, or release); NULL while one is in flight or
    -- if its replica died: then lease_until bounds it. Absence at the provider is conclusive
    -- only some grace after this, when no straggling attempt can still land.
    ADD COLUMN attempt_ended_at      timestamptz,
    ADD COLUMN settled_reason        text,      -- provider_answer, reconciled, no_effect, human_verdict
    ADD COLUMN supersedes            text UNIQUE REFERENCES operations (operation_id),
    ADD COLUMN reconcile_owner       text,
    ADD COLUMN reconcile_lease_until timestamptz,
    ADD COLUMN reconcile_attempts    integer NOT NULL DEFAULT 0,
    ADD COLUMN next_reconcile_at     timestamptz,
    ADD COLUMN escalated_at          timestamptz,
    ADD COLUMN escalation_reason     text,
    ADD COLUMN resolution_note       text;

CREATE INDEX operations_reconcilable ON operations (dispatched_at)
    WHERE status = 'dispatched' AND escalated_at IS NULL;

CREATE TABLE escalation_notifications (
    notification_id bigserial   PRIMARY KEY,
    operation_id    text        NOT NULL REFERENCES operations (operation_id),
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_until     timestamptz,
    delivered_at    timestamptz,
    last_error      text
);

CREATE INDEX escalation_notifications_due ON escalation_notifications (next_attempt_at)
    WHERE delivered_at IS NULL;
