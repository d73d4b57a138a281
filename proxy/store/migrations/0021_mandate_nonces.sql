-- Nonces opgate hands out for the key bindings of AP2 mandates (proxy/operations/mandates_api.py).
--
-- AP2's Action Authorization has the verifier challenge the agent: opgate issues a nonce to
-- one agent of one tenant, for a few minutes; the key binding JWT (or the agent's closed
-- mandate under an open one) must answer it. It is consumed in the transaction that creates
-- the operation, by the mandate's operation id (used_for): any replica accepts it, once.
CREATE TABLE mandate_nonces (
    nonce text PRIMARY KEY,
    tenant text NOT NULL,
    agent_id text NOT NULL,
    issued_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at timestamptz,
    used_for text,  -- the operation id of the mandate that answered it
    CHECK ((used_at IS NULL) = (used_for IS NULL))
);

-- The pruning done on each issue walks expired rows only.
CREATE INDEX mandate_nonces_by_expiry ON mandate_nonces (expires_at);
