-- 0017: proposals cannot flood the approvers.
--
-- A proposal identical to one of the same agent declined lately links it (`declined_twin`,
-- queries.sql proposal_create), so the agent and the approver see that it was refused before.
-- Pending proposals are counted per tenant and agent at every proposal (proposals_pending_count,
-- settings max_pending_proposals_per_agent|tenant): both lookups get an index of their own.

ALTER TABLE proposals ADD COLUMN declined_twin text REFERENCES proposals (proposal_id);

CREATE INDEX proposals_pending_by_agent ON proposals (tenant, agent_id, expires_at)
    WHERE status = 'pending';
CREATE INDEX proposals_declined_by_agent ON proposals (tenant, agent_id, decided_at)
    WHERE status = 'declined';
