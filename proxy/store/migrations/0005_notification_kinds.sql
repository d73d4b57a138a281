-- 0005: a notification says what happened: an operation was escalated to a human, or the
-- provider later showed the effect of an escalated operation and opgate settled it.

ALTER TABLE escalation_notifications
    ADD COLUMN kind text NOT NULL DEFAULT 'escalated'
        CHECK (kind IN ('escalated', 'settled_by_provider'));
