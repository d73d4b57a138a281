"""Stage 5b: an upstream that answers 402 with x402 v2, paid once for the operation.

Read the challenge strictly; if the operation has a stored payment, re-send it, never another;
else choose the one requirement its approval covers (none: refuse, nothing signed), sign the
EIP-3009 authorization whose nonce the operation id derives, keep it on the operation BEFORE it
leaves (the first kept wins: another replica's is sent instead of ours), send it with
``PAYMENT-SIGNATURE``, and keep the ``PAYMENT-RESPONSE`` settlement. The protocol's parsing and
signing are pure (proxy/x402/); the store and the send are here.

The SDK (the optional extra ``opgate[x402]``) is imported only when a rule declares ``x402``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from multidict import CIMultiDict

from proxy.errors import StoreUnavailable, UpstreamError
from proxy.gate import upstream
from proxy.gate.decision import Deny
from proxy.gate.reasons import Reason
from proxy.gate.upstream import OutboundRequest, UpstreamResponse
from proxy.policy.model import X402_TERMS, X402Payment
from proxy.store.x402 import SignedPayment, StoredPayment, X402Payments

if TYPE_CHECKING:
    import aiohttp

    from proxy.gate.credentials import CredentialSource
    from proxy.store.operation import Operation
    from proxy.store.store import Store
    from proxy.x402.choice import Approval

PAYMENT_REQUIRED = "PAYMENT-REQUIRED"
PAYMENT_SIGNATURE = "PAYMENT-SIGNATURE"
PAYMENT_RESPONSE = "PAYMENT-RESPONSE"
# the SDK's facilitators' code for an authorization whose nonce the token has used: paid before
_NONCE_USED = "invalid_exact_evm_nonce_already_used"


@dataclass(frozen=True)
class Paid:
    """What the paid request came to: the upstream's answer, or a refusal (``answered`` then
    is what was last received, kept for the record)."""

    answered: UpstreamResponse | UpstreamError
    refusal: Deny | None = None


def asks_payment(answered: UpstreamResponse | UpstreamError) -> bool:
    return isinstance(answered, UpstreamResponse) and answered.status == 402


async def pay(
    store: Store,
    credentials: CredentialSource,
    client: aiohttp.ClientSession,
    terms: X402Payment,
    op: Operation,
    outbound: OutboundRequest,
    first: UpstreamResponse,
) -> Paid:
    """Pay ``first`` (a 402) for ``op`` and send ``outbound`` again with the payment."""
    payments = X402Payments(store)
    try:
        stored = await _payment_to_send(payments, credentials, terms, op, first)
    except StoreUnavailable as exc:  # nothing is sent that is not kept first
        return Paid(first, Deny(Reason.STORE_UNAVAILABLE, f"no payment was sent: {exc}"))
    if isinstance(stored, Deny):
        return Paid(first, stored)
    headers = CIMultiDict(outbound.headers)
    headers[PAYMENT_SIGNATURE] = stored.header
    try:
        answered: UpstreamResponse | UpstreamError = await upstream.send(
            client, replace(outbound, headers=headers)
        )
    except UpstreamError as exc:
        return Paid(exc)  # unknown: the row stays dispatched, the payment kept for a re-send
    if isinstance(answered, UpstreamResponse):
        if answered.status == 402:
            return Paid(answered, _refused(stored, answered))
        await _keep_settlement(payments, op.operation_id, answered)
    return Paid(answered)


async def _payment_to_send(
    payments: X402Payments,
    credentials: CredentialSource,
    terms: X402Payment,
    op: Operation,
    first: UpstreamResponse,
) -> StoredPayment | Deny:
    """The operation's one payment: the one kept already, or one signed now and kept first."""
    stored = await payments.stored(op.operation_id)
    if stored is not None:
        return stored
    signed = _sign(credentials, terms, op, first)
    if isinstance(signed, Deny):
        return signed
    kept = await payments.keep(op.operation_id, signed)
    if kept is None:  # the row is no longer dispatched: nothing leaves
        return Deny(Reason.X402_PAYMENT_REFUSED, "the operation is no longer dispatched")
    return kept


def _sign(
    credentials: CredentialSource, terms: X402Payment, op: Operation, first: UpstreamResponse
) -> SignedPayment | Deny:
    """The payment for ``op``, signed (nothing is kept or sent here), or why not."""
    try:
        from eth_account import Account

        from proxy.x402.authorization import (
            operation_nonce,
            payload_digest,
            sign_payment,
            signature_header,
        )
        from proxy.x402.challenge import read_payment_required
        from proxy.x402.choice import Accepted, choose
        from proxy.x402.refusal import Refused, Why
    except ImportError:
        return Deny(Reason.CREDENTIAL_UNAVAILABLE, "opgate[x402] is not installed")
    header = first.headers.get(PAYMENT_REQUIRED)
    if header is None:
        return Deny(Reason.X402_CHALLENGE_INVALID, "the 402 has no PAYMENT-REQUIRED")
    required = read_payment_required(header)
    if isinstance(required, Refused):
        return Deny(Reason.X402_CHALLENGE_INVALID, required.detail)
    approval = _approval(op)
    if approval is None:
        return Deny(Reason.X402_NOT_APPROVED, "the operation approves no x402 payment terms")
    accepted = Accepted(
        frozenset(terms.schemes),
        frozenset(terms.networks),
        frozenset(asset.lower() for asset in terms.assets),
    )
    chosen = choose(required, approval, accepted)
    if isinstance(chosen, Refused):
        reason = (
            Reason.X402_NOT_APPROVED
            if chosen.why is Why.NOT_APPROVED
            else Reason.X402_CHALLENGE_INVALID
        )
        return Deny(reason, chosen.detail)
    key = credentials.secret(terms.wallet_secret)
    if key is None:
        return Deny(
            Reason.CREDENTIAL_UNAVAILABLE, f"secret {terms.wallet_secret!r} is not configured"
        )
    try:
        account = Account.from_key(key)
    except ValueError:
        return Deny(Reason.CREDENTIAL_UNAVAILABLE, f"secret {terms.wallet_secret!r} is not a key")
    payload = sign_payment(account, chosen, required.resource, op.operation_id, int(time.time()))
    signature = signature_header(payload)
    return SignedPayment(
        header=signature,
        payload_sha256=payload_digest(signature),
        nonce=operation_nonce(op.operation_id),
        payer=account.address,
        pay_to=chosen.pay_to,
        amount=int(chosen.amount),
        asset=chosen.asset,
        network=str(chosen.network),
        valid_before=int(payload.payload["authorization"]["validBefore"]),
    )


def _approval(op: Operation) -> Approval | None:
    """The payment terms the operation's approval names (policy X402_TERMS), or None if one
    is missing or not text: "not shown" is not "not limited"."""
    from proxy.x402.choice import Approval

    params = op.params
    values = [params.get(name) for name in X402_TERMS]
    if not all(isinstance(value, str) and value for value in values):
        return None
    resource, max_amount, asset, network, pay_to = (str(value) for value in values)
    if not (max_amount.isascii() and max_amount.isdigit() and len(max_amount) <= 78):
        return None
    return Approval(resource, int(max_amount), asset, network, pay_to)


def _refused(stored: StoredPayment, answered: UpstreamResponse) -> Deny:
    """The upstream answered the paid request with another 402: why, as far as the protocol
    says (its PAYMENT-REQUIRED's ``error``, compared with known codes, never echoed)."""
    nonce_used = False
    header = answered.headers.get(PAYMENT_REQUIRED)
    if header is not None:
        from proxy.x402.challenge import read_payment_required
        from proxy.x402.refusal import Refused

        required = read_payment_required(header)
        nonce_used = not isinstance(required, Refused) and required.error == _NONCE_USED
    detail = (
        "the provider says the payment's nonce is used: the operation was paid before"
        if nonce_used
        else "the provider answered the paid request with another 402"
    )
    return Deny(
        Reason.X402_PAYMENT_REFUSED,
        detail,
        extra={
            "nonce_used": nonce_used,
            "nonce": stored.nonce,
            "payment_sha256": stored.payload_sha256,
        },
    )


async def _keep_settlement(
    payments: X402Payments, operation_id: str, answered: UpstreamResponse
) -> None:
    from proxy.x402.refusal import Refused
    from proxy.x402.settlement import read_payment_response

    header = answered.headers.get(PAYMENT_RESPONSE)
    if header is None:
        return
    settlement = read_payment_response(header)
    if isinstance(settlement, Refused):
        return
    # The answer is the agent's whatever the store does: a settlement not kept here is still in
    # the answer the operation's row keeps, and the token's state says it was paid.
    with contextlib.suppress(StoreUnavailable):
        await payments.record_settlement(operation_id, settlement.model_dump(by_alias=True))
