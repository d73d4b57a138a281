-- 0029 (x402): a payment proven unpaid is released, and the operation may be paid once more.
--
-- Reconciliation (proxy/recovery/x402_state.py) releases the operation's payment when the
-- token shows its nonce unused after its validBefore: that authorization can never settle. The
-- row is kept (``released_at``, with the evidence) and the operation's next claim keeps a new
-- payment: one unreleased payment per operation at most. In agent-pays mode ``header`` is the
-- agent's own PAYMENT-SIGNATURE, bound to the operation by its nonce (proxy/gate/x402_pay.py).

ALTER TABLE x402_payments DROP CONSTRAINT x402_payments_pkey;
ALTER TABLE x402_payments ADD COLUMN payment_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY;
ALTER TABLE x402_payments ADD COLUMN payer_kind text NOT NULL DEFAULT 'opgate'
    CHECK (payer_kind IN ('opgate', 'agent'));
ALTER TABLE x402_payments ADD COLUMN released_at timestamptz;
ALTER TABLE x402_payments ADD COLUMN released_evidence jsonb;
CREATE UNIQUE INDEX x402_payments_one_live ON x402_payments (operation_id)
    WHERE released_at IS NULL;
