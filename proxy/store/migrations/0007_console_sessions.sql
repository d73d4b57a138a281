-- 0007: the web console's sign-in sessions (proxy/console/).
--
-- Server-side, in the database rather than in one process's memory: with several workers
-- sharing the operations listener, the next request of a signed-in human can reach any of
-- them, and signing out (or an expiry) must hold in all. The cookie's value is never stored,
-- only its SHA-256: a read of this table does not hand out sessions. The CSRF token of each
-- session's forms is kept with it.
CREATE TABLE console_sessions (
    session_digest text        PRIMARY KEY,
    role           text        NOT NULL CHECK (role IN ('admin', 'reviewer')),
    identity       text        NOT NULL,
    csrf_token     text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);

CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);
