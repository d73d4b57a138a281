-- 0026 (x402): the one payment opgate signed for an operation (docs/x402.md).
--
-- One row per operation at most (its primary key): the signed PAYMENT-SIGNATURE header, stored
-- before it leaves and re-sent, never re-signed, by every later attempt of the operation (a
-- retry, a replacement agent, another replica). Its EIP-3009 nonce is derived from the
-- operation id, so even without this row the token would refuse a second transfer for it.
-- ``settlement``: the upstream's PAYMENT-RESPONSE, once read.

CREATE TABLE x402_payments (
    operation_id    text        PRIMARY KEY REFERENCES operations (operation_id),
    header          text        NOT NULL,   -- PAYMENT-SIGNATURE as sent (base64 JSON)
    payload_sha256  text        NOT NULL,   -- of ``header``: names the authorization in evidence
    nonce           text        NOT NULL,   -- the EIP-3009 nonce (0x, 32 bytes)
    payer           text        NOT NULL,
    pay_to          text        NOT NULL,
    amount          numeric(78) NOT NULL CHECK (amount >= 0),
    asset           text        NOT NULL,
    network         text        NOT NULL,
    valid_before    bigint      NOT NULL,
    signed_at       timestamptz NOT NULL DEFAULT now(),
    settlement      jsonb,
    settled_at      timestamptz
);
