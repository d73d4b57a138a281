-- 0001: approved operations and their state-transition audit records.
--
-- Status machine: created -> dispatched -> confirmed | failed.
-- `dispatched` with a live lease means an attempt is in flight; with no live lease it means the
-- last attempt's outcome is unknown. Revocation is a flag, not a status: revoking never un-sends
-- anything, so a revoked operation can still be dispatched-and-unknown.

CREATE TABLE operations (
    operation_id        text PRIMARY KEY,
    tenant              text        NOT NULL,
    agent_id            text,                       -- NULL: any agent of the tenant
    provider            text        NOT NULL,
    action              text        NOT NULL,       -- the rule name in the provider's policy
    method              text        NOT NULL,
    path                text        NOT NULL,       -- concrete path, relative to the route prefix
    path_params         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    amount              bigint,
    currency            text,
    params              jsonb       NOT NULL DEFAULT '{}'::jsonb,
    idempotency_key     text        NOT NULL,
    approval_ref        text        NOT NULL,
    approved_by         text        NOT NULL,
    expires_at          timestamptz NOT NULL,
    status              text        NOT NULL DEFAULT 'created'
        CHECK (status IN ('created', 'dispatched', 'confirmed', 'failed')),
    revoked_at          timestamptz,
    revoked_reason      text,
    attempts            integer     NOT NULL DEFAULT 0,
    dispatched_at       timestamptz,
    lease_owner         text,
    lease_until         timestamptz,
    last_outcome        text,                       -- e.g. unknown:timeout, confirmed, failed
    provider_status     integer,
    provider_object_id  text,
    response_content_type text,
    response_body       bytea,
    settled_at          timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT operations_provider_key_unique UNIQUE (provider, idempotency_key),
    CONSTRAINT operations_settled_has_answer
        CHECK (status NOT IN ('confirmed', 'failed') OR settled_at IS NOT NULL)
);

CREATE INDEX operations_unsettled ON operations (tenant, status) WHERE status IN ('created', 'dispatched');

-- One row per state change or administrative act, written in the same transaction as the change.
CREATE TABLE operation_events (
    event_id        bigserial   PRIMARY KEY,
    operation_id    text        NOT NULL REFERENCES operations (operation_id),
    at              timestamptz NOT NULL DEFAULT now(),
    event           text        NOT NULL,   -- created, claimed, confirmed, failed, unknown, revoked
    from_status     text,
    to_status       text,
    actor           text        NOT NULL,   -- admin, agent id, or opgate instance
    detail          jsonb       NOT NULL DEFAULT '{}'::jsonb
);

CREATE INDEX operation_events_by_operation ON operation_events (operation_id, event_id);
