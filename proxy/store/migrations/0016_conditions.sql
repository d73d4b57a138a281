-- 0016: the conditions several statements of queries.sql share, each written once.
--
-- Each is an SQL function of one expression, neither STRICT nor SECURITY DEFINER, with no SET
-- clause and no more volatile than its body: PostgreSQL inlines such a call into the statement
-- that makes it, before planning, so a condition costs what it cost written out and still
-- matches the indexes written with the expression (operations_unsettled's predicate: EXPLAIN in
-- tests/store/test_conditions.py). The Python side has the same definitions
-- (proxy/store/operation.py), and a test keeps the two equal on every status.

-- A lease (lease_until, reconcile_lease_until, a notification's) is free: never taken, or
-- lapsed by the database's clock.
CREATE FUNCTION opgate_lease_free(lease_until timestamptz) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT $1 IS NULL OR $1 <= now() $$;

-- Not settled yet: an agent or a human may still act on the operation (Python: UNSETTLED).
CREATE FUNCTION opgate_unsettled(status text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT $1 IN ('created', 'dispatched') $$;

-- Not settled, and nothing of it can have reached the provider: no attempt was made, or each
-- ended before a byte left (Python: Operation.nothing_left_yet).
CREATE FUNCTION opgate_nothing_left_yet(status text, attempts integer, unsent_attempts integer)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT opgate_unsettled($1) AND $2 = $3 $$;
