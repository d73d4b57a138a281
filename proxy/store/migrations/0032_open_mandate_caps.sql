-- 0032 (mandates, x402): an open mandate's budget as its first closed mandate recorded it, so
-- that payments kept for the operations made under it (proxy/store/x402.py) are summed against
-- it too, where the money commits (queries.sql ``open_mandate_cap``, ``open_mandate_paid``).
--
-- One row per spelling of the open mandate's digest (its identity and its twin's: the
-- operations' approval_ref names either), each carrying the identity (the lock's name) and
-- every spelling (what the payments are summed under). Written once, never changed: every
-- closed mandate under one open mandate reads the same budget.

CREATE TABLE open_mandate_caps (
    open_digest  text PRIMARY KEY,
    identity     text NOT NULL,
    spellings    text[] NOT NULL,
    budget_max   numeric(78) CHECK (budget_max > 0),  -- minor units; NULL: no payment.budget
    currency     text NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now()
);
