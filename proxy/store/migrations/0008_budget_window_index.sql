-- 0008: spend budgets (proxy/policy/budgets.py).
--
-- A budgeted claim sums, under its budget's advisory lock, the amounts of one provider's
-- dispatched and confirmed operations in one currency whose last attempt was claimed within
-- the window (queries.sql budget_spent). Without this index the sum reads every operation the
-- provider ever had while other claims on the budget wait for the lock; with it, only the
-- window's rows, from the index alone (tenant, agent and amount are included).
CREATE INDEX operations_budget_window ON operations (provider, currency, dispatched_at)
    INCLUDE (tenant, agent_id, amount, operation_id)
    WHERE status IN ('dispatched', 'confirmed') AND amount IS NOT NULL;
