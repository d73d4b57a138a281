-- 0009: proposals, an agent's request for a human approval of the exact request it intends.
--
-- A proposal holds everything its operation row will hold (validated as an approval is, by
-- proxy/operations/approvals.py): the operation id and idempotency key are chosen when it is
-- proposed, so approving copies the row unchanged and the agent can be shown, before any human
-- looks at it, the one request it may send once approved. Status: pending -> approved |
-- declined. "Expired" is not stored: a pending proposal whose expires_at has passed is expired,
-- and every transition out of pending requires it not to be.

CREATE TABLE proposals (
    proposal_id      text        PRIMARY KEY,
    operation_id     text        NOT NULL UNIQUE,  -- the operation approval creates
    tenant           text        NOT NULL,
    agent_id         text        NOT NULL,         -- the proposing agent (from its token)
    provider         text        NOT NULL,
    action           text        NOT NULL,
    method           text        NOT NULL,
    path             text        NOT NULL,
    path_params      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    amount           bigint,
    currency         text,
    params           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    idempotency_key  text        NOT NULL,
    reason           text        NOT NULL,
    -- how long the operation stands once approved, counted from the approval
    approval_seconds double precision NOT NULL CHECK (approval_seconds > 0),
    status           text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'approved', 'declined')),
    expires_at       timestamptz NOT NULL,
    decided_at       timestamptz,
    decided_by       text,
    decision_note    text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT proposals_decided CHECK ((status = 'pending') = (decided_at IS NULL))
);

CREATE INDEX proposals_pending ON proposals (created_at) WHERE status = 'pending';
CREATE INDEX proposals_by_tenant ON proposals (tenant, created_at);

-- Every proposal decision (proposed, approved, declined), as operation_events are for
-- operations; each becomes a chained audit record of the proposal's own stream in the same
-- statement (the trigger below), so a decision cannot commit without its record.
CREATE TABLE proposal_events (
    event_id     bigserial   PRIMARY KEY,
    proposal_id  text        NOT NULL REFERENCES proposals (proposal_id),
    at           timestamptz NOT NULL DEFAULT now(),
    event        text        NOT NULL,   -- proposed, approved, declined
    from_status  text,
    to_status    text        NOT NULL,
    actor        text        NOT NULL,   -- the agent, or the human who decided
    detail       jsonb       NOT NULL DEFAULT '{}'::jsonb
);

CREATE INDEX proposal_events_by_proposal ON proposal_events (proposal_id, event_id);

-- The stream is proposals/<id> (an operation id opgate creates never holds a slash, so no
-- proposal stream can be an operation's); the record names the operation id the proposal
-- would create, so an operation's audit records include how it was proposed and approved.
CREATE FUNCTION opgate_audit_proposal() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    instance  text := nullif(current_setting('opgate.instance_id', true), '');
    version   text;
    operation text;
BEGIN
    SELECT policy_version INTO version FROM audit_instances WHERE instance_id = instance;
    SELECT operation_id INTO operation FROM proposals WHERE proposal_id = NEW.proposal_id;
    INSERT INTO audit_log (stream, seq, kind, operation_id, record, prev_hash, hash)
    VALUES ('proposals/' || NEW.proposal_id, 0, 'proposal', operation,
            jsonb_build_object(
                'schema_version', 1,
                'time', to_jsonb(NEW.at),
                'event', NEW.event,
                'event_id', NEW.event_id,
                'proposal_id', NEW.proposal_id,
                'operation_id', operation,
                'status_before', NEW.from_status,
                'status_after', NEW.to_status,
                'actor', NEW.actor,
                'detail', NEW.detail,
                'instance_id', instance,
                'policy_version', version),
            '\x', '\x');
    RETURN NEW;
END
$$;

CREATE TRIGGER proposal_events_audit AFTER INSERT ON proposal_events
    FOR EACH ROW EXECUTE FUNCTION opgate_audit_proposal();

-- Approvers are told of a new proposal through the same signed notices as escalations: a
-- notice is about an operation or about a proposal, never both.
ALTER TABLE escalation_notifications
    ALTER COLUMN operation_id DROP NOT NULL,
    ADD COLUMN proposal_id text REFERENCES proposals (proposal_id),
    ADD CONSTRAINT escalation_notifications_one_subject
        CHECK ((operation_id IS NULL) <> (proposal_id IS NULL));

ALTER TABLE escalation_notifications DROP CONSTRAINT escalation_notifications_kind_check;
ALTER TABLE escalation_notifications ADD CONSTRAINT escalation_notifications_kind_check
    CHECK (kind IN ('escalated', 'settled_by_provider', 'proposal_pending'));

-- The console's approver role: decides proposals, and nothing else.
ALTER TABLE console_sessions DROP CONSTRAINT console_sessions_role_check;
ALTER TABLE console_sessions ADD CONSTRAINT console_sessions_role_check
    CHECK (role IN ('admin', 'reviewer', 'approver'));
