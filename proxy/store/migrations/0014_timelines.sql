-- 0014: the PostgreSQL timelines opgate has seen, and the operations a switch put in doubt.
--
-- On asynchronous replication a claim (created -> dispatched) can commit on the primary, its
-- request leave, and the primary die before the commit reaches the standby. The promoted
-- standby then shows the row exactly as before the claim: the row itself cannot tell. What can
-- tell is the timeline: a promotion starts a new one. The first time a store connection sees a
-- timeline greater than every one recorded here (queries.sql timeline_seen), it records it and,
-- in the same statement, marks every operation still created or dispatched: such a row may have
-- been claimed and sent on the lost timeline, and is looked up at the provider before its next
-- send (proxy/gate/checks.py decide_by_state, queries.sql claim_operation).
CREATE TABLE timelines (
    timeline_id integer     PRIMARY KEY,
    seen_at     timestamptz NOT NULL DEFAULT now(),
    -- how many operations this switch marked (0 for the first timeline ever recorded)
    marked      integer     NOT NULL DEFAULT 0
);

-- When the switch that put this row in doubt was seen (NULL: not in doubt). Cleared by the claim
-- that follows the lookup; the lookup's grace counts from it (a lost claim's request may still
-- be on its way to the provider when the switch is seen).
ALTER TABLE operations ADD COLUMN lookup_before_send timestamptz;
