-- 0013: a one-row table that /readyz writes, to prove that a commit can be made.
--
-- A read (pg_is_in_recovery()) answered 200 while every claim hung: with
-- synchronous_standby_names set and no synchronous standby connected, a commit waits until one
-- is (measured: claims took 5-8 s and ended 503). Only a transaction that writes WAL waits
-- for the standby (one that merely takes a transaction id commits asynchronously), so
-- readiness updates this row, at the claim's own synchronous_commit, under a short timeout
-- (queries.sql commit_heartbeat). It also shows when, and by which instance, the store last
-- proved a commit.
CREATE TABLE opgate_heartbeat (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    beat_at timestamptz NOT NULL DEFAULT now(),
    instance_id text
);
INSERT INTO opgate_heartbeat DEFAULT VALUES;
