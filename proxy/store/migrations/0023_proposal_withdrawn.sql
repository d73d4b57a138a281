-- 0023: a pending proposal can be withdrawn by the agent that made it.
--
-- An agent that no longer wants what it asked for (an MCP client cancelling the proposal's
-- task, or POST /_opgate/v1/proposals/{id}/withdraw) takes it out of the approvers' queue and
-- frees its place under the pending caps. Nothing can have left for a pending proposal (no
-- operation exists before an approval), so withdrawing it is always safe. Status: pending ->
-- approved | declined | withdrawn; decided_at and decided_by say when and which agent
-- (queries.sql proposal_withdraw, which writes its proposal_events row in the same statement).

ALTER TABLE proposals DROP CONSTRAINT proposals_status_check;
ALTER TABLE proposals ADD CONSTRAINT proposals_status_check
    CHECK (status IN ('pending', 'approved', 'declined', 'withdrawn'));

-- The console lists the proposals withdrawn lately (queries.sql proposals_withdrawn_lately).
CREATE INDEX proposals_withdrawn ON proposals (decided_at) WHERE status = 'withdrawn';
