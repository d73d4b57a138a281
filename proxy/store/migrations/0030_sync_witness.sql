-- 0030: what a promoted standby needs to prove that its promotion lost no acknowledged claim
-- (docs/running-ha.md "When nothing can have been lost", proxy/store/promotion.py).
--
-- Every promotion marked every unsettled operation (0014): each then waited its rule's
-- grace_seconds + total_seconds answering 409 reconcile_required, planned switchovers and
-- synchronous failovers included, where nothing can have been lost. Whether something can
-- have been lost depends on which standbys had to confirm each commit on the old primary: its
-- synchronous_standby_names, and the standbys connected under each name. opgate writes them
-- here on every replication judgement (queries.sql record_sync_witness); the promoted standby
-- has the last one it received, and the proof reads it (queries.sql timeline_facts).
CREATE TABLE sync_witness (
    timeline_id integer PRIMARY KEY,  -- the timeline of the primary it was read on
    standby_names text NOT NULL,  -- synchronous_standby_names there
    -- application_name of every WAL sender connected then (NULL where this role may not read
    -- it: pg_monitor)
    wal_senders text[] NOT NULL,
    -- the statement_timeout opgate's connections get from the server: a server-side timeout
    -- cancels a commit's wait for its standby, and PostgreSQL then acknowledges the commit
    -- with a warning although no standby confirmed it
    statement_timeout text NOT NULL,
    recorded_at timestamptz NOT NULL,
    instance_id text
);

-- Why a switch marked nothing (the proof), NULL where it marked what was unsettled.
ALTER TABLE timelines ADD COLUMN unmarked_because text;

-- The timeline this server writes on (NULL on a standby): the first 8 hex digits of the
-- current WAL file's name (pg_control_checkpoint() shows a new one only after the next
-- checkpoint). One definition for timeline_seen, timeline_facts and record_sync_witness.
CREATE FUNCTION opgate_current_timeline() RETURNS integer
    LANGUAGE sql VOLATILE
    AS $$
    SELECT CASE WHEN pg_is_in_recovery() THEN NULL
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
           END
    $$;
