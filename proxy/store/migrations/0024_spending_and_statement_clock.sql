-- 0024: what counts against a budget, written once; and leases judged by the clock as a
-- statement runs, not by its transaction's start.
--
-- 1. An open mandate's sum (queries.sql mandate_open_use) left out every operation whose
-- approval was revoked, and an operation could be revoked after it was sent and confirmed: an
-- open mandate of 1000 confirmed 2000. Every sum (budget_spent, budget_spent_by_key,
-- mandate_open_use) now leaves out only what opgate_spends says spent nothing: an operation
-- that failed (the provider had no effect), or whose approval was revoked while nothing of it
-- had been sent (opgate_nothing_sent): no attempt, or each ended before a byte left, and no
-- failover put it in doubt (a claim on the lost timeline may have sent it: timeline_seen).
-- A revoked operation is never claimed again, so what it spent is final (a failover seen
-- later can only put it in doubt, and count it again). The Python side has the same
-- definitions (proxy/store/operation.py: Operation.nothing_sent, Operation.spends), and a
-- test keeps them equal on every state (tests/store/test_spending.py).
--
-- 2. A claim under a budget's lock (proxy/store/store.py claim_within_budgets) waits for the
-- lock in its transaction, before its UPDATE; now() is that transaction's start. So an
-- approval that expired during the wait was still claimed, and a claim that waited longer
-- than its lease committed with the lease lapsed already (a re-send was granted while the
-- first attempt was in flight), dispatched_at backdated. The statements that claim, settle
-- and release now compare with and record clock_timestamp(), the time as each row is
-- decided (after any wait for a lock, a budget's or the row's); opgate_lease_free_v2 is
-- 0016's condition on that clock. It is VOLATILE as its body is, which PostgreSQL still
-- inlines. opgate_lease_free stays for processes of the previous release while an upgrade
-- rolls; queries.sql no longer calls it.

CREATE FUNCTION opgate_lease_free_v2(lease_until timestamptz) RETURNS boolean
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT $1 IS NULL OR $1 <= clock_timestamp() $$;

-- Nothing of the operation can have reached the provider, on this timeline or a lost one
-- (Python: Operation.nothing_sent).
CREATE FUNCTION opgate_nothing_sent(
    status text, attempts integer, unsent_attempts integer, lookup_before_send timestamptz
) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT opgate_nothing_left_yet($1, $2, $3) AND $4 IS NULL $$;

-- The operation counts against every budget it is under (Python: Operation.spends): all but
-- one that failed, or was revoked with nothing sent.
CREATE FUNCTION opgate_spends(
    status text, attempts integer, unsent_attempts integer, revoked_at timestamptz,
    lookup_before_send timestamptz
) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT NOT ($1 = 'failed' OR ($4 IS NOT NULL AND opgate_nothing_sent($1, $2, $3, $5))) $$;

-- 0008's index, with the columns opgate_spends reads: a budget's sum stays an index-only scan.
CREATE INDEX operations_budget_window_v2 ON operations (provider, currency, dispatched_at)
    INCLUDE (tenant, agent_id, amount, operation_id, status, attempts, unsent_attempts,
             revoked_at, lookup_before_send)
    WHERE status IN ('dispatched', 'confirmed') AND amount IS NOT NULL;
DROP INDEX operations_budget_window;
