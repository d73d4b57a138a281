-- 0031 (x402): limits on payments across payees and providers (proxy/policy/payments.py).
--
-- A payment is kept only after the payments of its tenant (or agent) in its window, on its
-- network in its asset, were summed under the limit's lock (queries.sql ``payment_limit_spent``): the
-- sum reads the live payments kept since a moment, by when they were signed.

CREATE INDEX x402_payments_live_by_time ON x402_payments (signed_at)
    WHERE released_at IS NULL;
