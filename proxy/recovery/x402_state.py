"""Reconciliation of an x402 operation whose outcome is unknown, from its payment's own
evidence: the EIP-3009 nonce's state on the chain (``authorizationState(payer, nonce)``, read
with ``eth_call`` from the node whose URL is the rule's ``chain_rpc_secret``).

- the nonce is used: the operation's one payment settled. Where that payment carries a
  ``payment-identifier`` id (the server declared the extension), it is sent again as stored
  and the server's kept answer, if the rule classifies it confirmed, settles the operation
  with it (``x402_answer_recovered``); otherwise, or if none comes, the operation was paid and its
  answer lost: confirmed (``x402_paid_answer_lost``), with the evidence;
- the nonce is unused after the authorization's validBefore (and a margin): that
  authorization can never settle: its payment is released and the attempt ends as never sent,
  so the operation may be claimed once more and pay with a new authorization;
- unused and still valid: looked at again once it has expired;
- no node configured, or it cannot answer: escalated to a human with the evidence (payment
  digest, nonce, payer, payTo, amount).

The nonce's state is the token's, not a server's or a facilitator's word: a server that lies
about a payment cannot make opgate pay twice (docs/x402.md says what it can still do).
"""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from proxy.gate.classify import Settled, classify_answer
from proxy.gate.x402_pay import recover_answer
from proxy.policy.model import X402Payment
from proxy.runtime import Gateway
from proxy.store.operation import Operation, Status
from proxy.store.store import ProviderAnswer
from proxy.store.x402 import StoredPayment, X402Payments

_RPC_TIMEOUT_SECONDS = 10.0
_ESCALATED_LOOK_AGAIN_SECONDS = 3600.0
_ESCALATE_AFTER_TRIES = 5
_RETRY_SECONDS = 30.0
PAID_ANSWER_LOST = "x402_paid_answer_lost"
ANSWER_RECOVERED = "x402_answer_recovered"


async def payment_of(gw: Gateway, op: Operation) -> StoredPayment | None:
    """The operation's live payment, if it has one to judge it by."""
    return await X402Payments(gw.store).stored(op.operation_id)


async def reconcile_payment(
    gw: Gateway,
    terms: X402Payment,
    op: Operation,
    stored: StoredPayment,
    owner: str,
    evidence: dict[str, Any],
) -> Operation | None:
    """One try for ``op``, whose reconciliation lease ``owner`` holds, judged by its payment
    ``stored``: the row as it is after it (None: the try was stale)."""
    # imported here: proxy.x402 loads the SDK's signing libraries, only for a rule that pays
    from proxy.x402.nonce_state import NonceVerdict, judge

    payments = X402Payments(gw.store)
    evidence["x402"] = stored.evidence()
    url = gw.credentials.secret(terms.chain_rpc_secret) if terms.chain_rpc_secret else None
    if url is None:
        return await _escalate(gw, op, owner, evidence, "no chain node to read the nonce from")
    now = int(time.time())  # before the read: the state read is at least this recent
    used = await _nonce_used(gw.client, url, stored)
    if used is None:
        evidence["x402"]["chain"] = "no answer"
        if op.reconcile_attempts + 1 >= _ESCALATE_AFTER_TRIES:
            return await _escalate(gw, op, owner, evidence, "the chain's node did not answer")
        return await gw.store.reconcile_inconclusive(
            op.operation_id, owner, _RETRY_SECONDS, evidence, expected_attempts=op.attempts
        )
    verdict = judge(used, stored.valid_before, now, terms.expiry_margin_seconds)
    evidence["x402"].update(nonce_used=used, judged_at=now, verdict=verdict.value)
    if verdict is NonceVerdict.PAID:
        recovered = await _kept_answer(gw, op, stored)
        if recovered is not None:
            status, answer, found = recovered
            evidence["x402"]["answer_recovered"] = found
            return await gw.store.settle_reconciled(
                op.operation_id,
                owner,
                status,
                ANSWER_RECOVERED,
                answer,
                evidence,
                expected_attempts=op.attempts,
            )
        return await gw.store.settle_reconciled(
            op.operation_id,
            owner,
            Status.CONFIRMED,
            PAID_ANSWER_LOST,
            paid_answer_lost(evidence["x402"]),
            evidence,
            expected_attempts=op.attempts,
        )
    if verdict is NonceVerdict.NOT_PAID:
        released = await payments.release_unpaid(
            op.operation_id, owner, stored.nonce, evidence, expected_attempts=op.attempts
        )
        return await gw.store.load(op.operation_id) if released else None
    wait = stored.valid_before + terms.expiry_margin_seconds + 1 - now
    return await gw.store.reconcile_inconclusive(
        op.operation_id, owner, float(max(wait, 1)), evidence, expected_attempts=op.attempts
    )


async def _kept_answer(
    gw: Gateway, op: Operation, stored: StoredPayment
) -> tuple[Status, ProviderAnswer, dict[str, Any]] | None:
    """The paid operation's answer as the server kept it under its payment id, if the rule
    classifies it confirmed (None: nothing to ask for, no answer, or another answer: the
    token's used nonce, not the server's word, says the operation was paid)."""
    provider = gw.policy.provider_named(op.provider)
    rule = provider.rule_named(op.action) if provider is not None else None
    if provider is None or rule is None:
        return None
    base = gw.upstream_base(provider.provider, provider.upstream)
    asked = await recover_answer(
        gw.store, gw.credentials, gw.client, provider, rule, base, op, stored
    )
    if asked is None:
        return None
    payment_id, answered = asked
    classified = classify_answer(provider.classification_for(rule), answered.status, answered.body)
    if not isinstance(classified, Settled) or classified.status is not Status.CONFIRMED:
        return None  # the nonce says paid: only an answer the rule confirms is taken
    answer = ProviderAnswer(
        answered.status,
        classified.object_id,
        answered.headers.get("Content-Type"),
        answered.body,
    )
    return classified.status, answer, {"payment_id": payment_id, "status": answered.status}


def paid_answer_lost(evidence: dict[str, Any]) -> ProviderAnswer:
    """The answer a paid operation whose answer was lost keeps: opgate's problem, with the
    payment's evidence (the same one the gate answers when the provider refuses a used nonce)."""
    body = {
        "code": PAID_ANSWER_LOST,
        "detail": "the operation's payment was settled (its nonce is used) and its answer lost",
        **evidence,
    }
    encoded = json.dumps(body, sort_keys=True).encode()
    return ProviderAnswer(502, None, "application/problem+json", encoded)


async def _nonce_used(
    client: aiohttp.ClientSession, url: str, stored: StoredPayment
) -> bool | None:
    from proxy.x402.nonce_state import authorization_state_call, read_nonce_used

    call = authorization_state_call(stored.asset, stored.payer, stored.nonce)
    try:
        async with client.post(
            url, json=call, timeout=aiohttp.ClientTimeout(total=_RPC_TIMEOUT_SECONDS)
        ) as response:
            if response.status != 200:
                return None
            answer = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):  # no answer: nothing is judged
        return None
    return read_nonce_used(answer)


async def _escalate(
    gw: Gateway, op: Operation, owner: str, evidence: dict[str, Any], why: str
) -> Operation | None:
    return await gw.store.escalate(
        op.operation_id,
        owner,
        f"x402 payment outcome unknown: {why}",
        evidence,
        look_again_seconds=_ESCALATED_LOOK_AGAIN_SECONDS,
        expected_attempts=op.attempts,
    )
