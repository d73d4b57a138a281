"""Stage 5b for a rule whose upstream answers 402 with x402 v2: paid once for the operation.

If the operation has a stored payment, send it again as stored, never another. If the agent
pays (``payer: agent``), its own ``PAYMENT-SIGNATURE`` is read strictly, checked against the
approval and bound to the operation by its nonce (the first bound is the only one: another is
``payment_authorization_mismatch``), and an unpaid request's 402 reaches the agent. If opgate
pays: read the challenge strictly; choose the one requirement its approval covers (none:
refuse, nothing signed); sign the EIP-3009 authorization whose nonce the operation id derives;
keep it on the operation BEFORE it leaves (the first kept wins: another replica's is sent
instead of ours); send it with ``PAYMENT-SIGNATURE``, and keep the ``PAYMENT-RESPONSE``
settlement. A stored payment refused because its nonce is used was paid before: the row
settles confirmed, its answer lost (``x402_paid_answer_lost``), unless the server keeps its
answers by the ``payment-identifier`` extension's id: then the stored payment, sent again as
it is, brings back its answer (``recover_answer``, which reconciliation calls). Under the
policy set's x402 limits (proxy/policy/payments.py), a payment is kept only if they admit it,
judged in the transaction that keeps it, under their locks; refused, nothing is kept or sent
(``x402_budget_exceeded``). The protocol's parsing and signing are pure (proxy/x402/); the
store and the send are here.

The SDK (the optional extra ``opgate[x402]``) is imported only when a rule declares ``x402``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from multidict import CIMultiDict, CIMultiDictProxy

from proxy.errors import StoreUnavailable, UpstreamError, UpstreamNotSent
from proxy.gate import upstream
from proxy.gate.budgets import payment_limit_sum
from proxy.gate.classify import Classified, Settled, Unknown
from proxy.gate.decision import Deny
from proxy.gate.reasons import Reason
from proxy.gate.upstream import OutboundRequest, UpstreamResponse
from proxy.policy.model import X402_TERMS, X402Payment
from proxy.policy.payments import (
    NO_LIMITS,
    MandateOverBudget,
    Spent,
    X402Limits,
    limits_for,
    mandate_over_budget,
    over_limit,
)
from proxy.store.operation import LastOutcome, Status
from proxy.store.x402 import OpenMandatePaid, SignedPayment, StoredPayment, X402Payments

if TYPE_CHECKING:
    import aiohttp

    from proxy.gate.credentials import CredentialSource
    from proxy.policy.model import Provider, Rule
    from proxy.store.operation import Operation
    from proxy.store.store import Store
    from proxy.x402.choice import Accepted, Approval

PAYMENT_REQUIRED = "PAYMENT-REQUIRED"
PAYMENT_SIGNATURE = "PAYMENT-SIGNATURE"
PAYMENT_RESPONSE = "PAYMENT-RESPONSE"
# the SDK's facilitators' code for an authorization whose nonce the token has used: paid before
_NONCE_USED = "invalid_exact_evm_nonce_already_used"


@dataclass(frozen=True)
class Paid:
    """What the request of an x402 rule came to: the upstream's answer, or a refusal
    (``answered`` then is what was last received, kept for the record); ``settled_as``: how the
    row settles whatever the policy's classification says (None: as it says)."""

    answered: UpstreamResponse | UpstreamError
    refusal: Deny | None = None
    settled_as: Classified | None = None
    evidence: dict[str, Any] | None = None  # the payment sent (StoredPayment.evidence)


# The SDK's modules stage 5b imports, with web3 and eth-account behind them: seconds of imports.
_SDK_MODULES = (
    "eth_account",
    "proxy.x402.authorization",
    "proxy.x402.challenge",
    "proxy.x402.choice",
    "proxy.x402.offered",
    "proxy.x402.refusal",
    "proxy.x402.settlement",
)
_sdk_loading: asyncio.Future[None] | None = None
_sdk_ready = False


async def _sdk_loaded() -> None:
    """Import the SDK once, in a thread, before stage 5b first needs it: imported on the event
    loop (the first payment after a start), it held every request of the process for seconds,
    long enough for their statements to time out (503 store_unavailable). Every request awaits
    the one import; a missing extra is reported where it is used (``_sign``)."""
    global _sdk_loading, _sdk_ready
    if _sdk_ready:
        return
    if _sdk_loading is None or _sdk_loading.get_loop() is not asyncio.get_running_loop():

        def load() -> None:
            with contextlib.suppress(ImportError):
                for name in _SDK_MODULES:
                    importlib.import_module(name)

        _sdk_loading = asyncio.ensure_future(asyncio.to_thread(load))
    await asyncio.shield(_sdk_loading)
    _sdk_ready = True


def asks_payment(answered: UpstreamResponse | UpstreamError) -> bool:
    return isinstance(answered, UpstreamResponse) and answered.status == 402


async def send(
    store: Store,
    credentials: CredentialSource,
    client: aiohttp.ClientSession,
    terms: X402Payment,
    op: Operation,
    outbound: OutboundRequest,
    agent_headers: Mapping[str, str],
    limits: X402Limits = NO_LIMITS,
) -> Paid:
    """Stage 5b for a rule that declares ``x402``: send ``outbound`` for ``op``, with the
    operation's one payment if it has one (the agent's own, if the agent pays and offers one
    that fits and binds), else unpaid, and pay a 402 once if opgate pays; a new payment is
    kept only within ``limits`` (the policy set's)."""
    await _sdk_loaded()
    payments = _Keeper(X402Payments(store), limits)
    try:
        stored = await payments.stored(op.operation_id)
        offered = agent_headers.get(PAYMENT_SIGNATURE) if terms.payer == "agent" else None
        if offered is not None:
            bound = await _bind_offered(payments, terms, op, offered, stored)
            if isinstance(bound, Deny):
                return Paid(UpstreamNotSent("the agent's payment was refused"), bound)
            stored = bound
    except StoreUnavailable as exc:  # nothing is sent that is not kept first
        return Paid(
            UpstreamNotSent("no payment could be read or kept"),
            Deny(Reason.STORE_UNAVAILABLE, f"nothing was sent: {exc}"),
        )
    if stored is not None:  # the operation's one payment, as stored, never another
        return await _send_paid(payments, client, op, outbound, stored)
    try:
        first = await upstream.send(client, outbound)
    except UpstreamError as exc:
        return Paid(exc)
    if not asks_payment(first):
        return Paid(first)
    if terms.payer == "agent":
        # The 402 reaches the agent, which pays with its own PAYMENT-SIGNATURE: the provider
        # did nothing for an unpaid request, so the attempt ends as if never sent.
        return Paid(first, settled_as=Unknown(LastOutcome.NOT_SENT))
    return await pay(store, credentials, client, terms, op, outbound, first, limits)


async def pay(
    store: Store,
    credentials: CredentialSource,
    client: aiohttp.ClientSession,
    terms: X402Payment,
    op: Operation,
    outbound: OutboundRequest,
    first: UpstreamResponse,
    limits: X402Limits = NO_LIMITS,
) -> Paid:
    """Pay ``first`` (a 402) for ``op`` and send ``outbound`` again with the payment."""
    payments = _Keeper(X402Payments(store), limits)
    # Refused before a payment left, the unpaid request's 402 is all the provider said: it did
    # nothing without payment, so the attempt ends as never sent (the approval decides again).
    unpaid = Unknown(LastOutcome.NOT_SENT)
    try:
        stored = await _payment_to_send(payments, credentials, terms, op, first)
    except StoreUnavailable as exc:  # nothing is sent that is not kept first
        refusal = Deny(Reason.STORE_UNAVAILABLE, f"no payment was sent: {exc}")
        return Paid(first, refusal, settled_as=unpaid)
    if isinstance(stored, Deny):
        return Paid(first, stored, settled_as=unpaid)
    return await _send_paid(payments, client, op, outbound, stored)


class _Keeper:
    """The operation's payments as stage 5b keeps them: within the policy set's x402 limits."""

    def __init__(self, payments: X402Payments, limits: X402Limits) -> None:
        self.payments = payments
        self._limits = limits

    async def stored(self, operation_id: str) -> StoredPayment | None:
        return await self.payments.stored(operation_id)

    async def record_settlement(self, operation_id: str, settlement: dict[str, Any]) -> bool:
        return await self.payments.record_settlement(operation_id, settlement)

    async def keep(self, op: Operation, signed: SignedPayment) -> StoredPayment | Deny:
        """``signed`` kept for ``op`` if the limits that apply admit it (judged under their
        locks, in the transaction that keeps it), and, for an operation made under an AP2 open
        mandate, if the mandate's budget admits it too (summed under the mandate's lock, in the
        same transaction); or the payment kept for it before; refused: why, and nothing is
        kept."""
        keys = limits_for(
            self._limits,
            tenant=op.tenant,
            agent_id=op.agent_id,
            network=signed.network,
            asset=signed.asset,
        )
        if isinstance(keys, str):  # fail closed: a limit applies that cannot be counted
            return Deny(Reason.X402_BUDGET_EXCEEDED, keys)
        mandate = None
        open_digest = open_mandate_of(op.approval_ref)
        if open_digest is not None:
            mandate = await self.payments.open_mandate_cap(open_digest)
            if mandate is None:  # fail closed: its budget cannot be known
                return Deny(
                    Reason.X402_MANDATE_BUDGET_EXCEEDED,
                    "the operation was made under an open mandate whose budget opgate never "
                    "recorded: its payments cannot be counted against it",
                )
        if not keys and mandate is None:
            kept = await self.payments.keep(op.operation_id, signed)
        else:
            sums = [payment_limit_sum(k) for k in keys]

            def spent_as(sums: list[tuple[int, int]]) -> list[Spent]:
                return [Spent(amount, count) for amount, count in sums]

            def admit(sums: list[tuple[int, int]]) -> bool:
                return over_limit(keys, spent_as(sums), signed.amount) is None

            def over_mandate(paid: OpenMandatePaid) -> MandateOverBudget | None:
                assert mandate is not None
                return mandate_over_budget(
                    self._limits,
                    budget_max=mandate.budget_max,
                    currency=mandate.currency,
                    paid=paid.paid,
                    spent=paid.spent,
                    network=signed.network,
                    asset=signed.asset,
                    amount=signed.amount,
                )

            limited = await self.payments.keep_within_limits(
                op.operation_id,
                signed,
                sums,
                admit,
                mandate=mandate,
                admit_mandate=lambda paid: over_mandate(paid) is None,
            )
            if not limited.admitted and limited.mandate_paid is not None:
                refused = over_mandate(limited.mandate_paid)
                assert refused is not None
                return Deny(
                    Reason.X402_MANDATE_BUDGET_EXCEEDED,
                    refused.detail,
                    extra={"mandate": {"open_digest": open_digest, **refused.to_public()}},
                )
            if not limited.admitted:
                over = over_limit(keys, spent_as(limited.spent), signed.amount)
                assert over is not None
                return Deny(
                    Reason.X402_BUDGET_EXCEEDED, over.detail(), extra={"limit": over.to_public()}
                )
            kept = limited.payment
        if kept is None:  # the row is no longer dispatched: nothing leaves
            return Deny(Reason.X402_PAYMENT_REFUSED, "the operation is no longer dispatched")
        return kept


def open_mandate_of(approval_ref: str) -> str | None:
    """The digest of the AP2 open mandate an operation was made under (its approval
    ``ap2:<closed>;open:<open>``: docs/mandates.md), else None."""
    if not approval_ref.startswith("ap2:"):
        return None
    _, found, open_digest = approval_ref.partition(";open:")
    return open_digest if found else None


async def _send_paid(
    payments: _Keeper,
    client: aiohttp.ClientSession,
    op: Operation,
    outbound: OutboundRequest,
    stored: StoredPayment,
) -> Paid:
    """Send ``outbound`` with the stored payment, and read what it came to."""
    headers = CIMultiDict(outbound.headers)
    headers[PAYMENT_SIGNATURE] = stored.header
    evidence = stored.evidence()
    try:
        answered = await upstream.send(client, replace(outbound, headers=headers))
    except UpstreamError as exc:  # unknown: the row stays dispatched, the payment kept
        return Paid(exc, evidence=evidence)
    if answered.status == 402:
        return _refused(stored, answered)
    transaction = await _keep_settlement(payments, op.operation_id, answered)
    if transaction is not None:
        evidence["settlement_transaction"] = transaction
    return Paid(answered, evidence=evidence)


async def recover_answer(
    store: Store,
    credentials: CredentialSource,
    client: aiohttp.ClientSession,
    provider: Provider,
    rule: Rule,
    base: str,
    op: Operation,
    stored: StoredPayment,
) -> tuple[str, UpstreamResponse] | None:
    """The answer the server kept for ``op``'s paid request, with the payment id it is kept
    under; None: there is none to ask for, or none came.

    Only where the stored payment carries a ``payment-identifier`` id (opgate puts the
    operation id there when the server declared the extension) is it sent again: as stored,
    byte for byte, with the operation's idempotency key, to the operation's path. A server
    that honours the extension looks the id up before it verifies and answers from what it
    kept; one that does not refuses the payment, whose nonce the token has used: nothing can
    settle twice, and nothing is signed. A 402 is no answer; any other is the server's."""
    from proxy.gate.credentials import provider_credential
    from proxy.x402.offered import payment_id_of

    payment_id = payment_id_of(stored.header)
    if payment_id is None:
        return None
    credential = await provider_credential(credentials, client, provider, base)
    if isinstance(credential, Deny):
        return None
    headers: CIMultiDict[str] = CIMultiDict(credential)
    headers["X-Operation-Id"] = op.operation_id
    key_header = provider.key_header(rule)
    if key_header is not None:
        headers[key_header] = op.idempotency_key
    headers[PAYMENT_SIGNATURE] = stored.header
    outbound = OutboundRequest(
        method=rule.method,
        url=base + op.path,
        headers=headers,
        body=b"",
        connect_timeout=provider.timeouts.connect_seconds,
        total_timeout=provider.timeouts.total_seconds,
        max_response_bytes=provider.limits.max_response_body_bytes,
    )
    try:
        answered = await upstream.send(client, outbound)
    except UpstreamError:
        return None
    if answered.status == 402:
        return None
    await _keep_settlement(X402Payments(store), op.operation_id, answered)
    return payment_id, answered


async def _bind_offered(
    payments: _Keeper,
    terms: X402Payment,
    op: Operation,
    header: str,
    stored: StoredPayment | None,
) -> StoredPayment | Deny:
    """The agent's payment, checked against the approval and bound to the operation by its
    nonce: the first one bound is the operation's only one."""
    from proxy.x402.offered import check_offered, offered_digest, read_offered
    from proxy.x402.refusal import Refused, Why

    digest = offered_digest(header)
    if stored is not None:
        if stored.payload_sha256 == digest:
            return stored  # the same authorization: sent again as it was bound
        return Deny(
            Reason.PAYMENT_AUTHORIZATION_MISMATCH,
            "the operation is bound to another payment authorization",
            extra={"payment_sha256": stored.payload_sha256, "nonce": stored.nonce},
        )
    payload = read_offered(header)
    if isinstance(payload, Refused):
        return Deny(Reason.X402_PAYMENT_INVALID, payload.detail)
    approval = _approval(op)
    if approval is None:
        return Deny(Reason.X402_NOT_APPROVED, "the operation approves no x402 payment terms")
    checked = check_offered(payload, approval, _accepted(terms), int(time.time()))
    if isinstance(checked, Refused):
        reason = (
            Reason.X402_NOT_APPROVED
            if checked.why is Why.NOT_APPROVED
            else Reason.X402_PAYMENT_INVALID
        )
        return Deny(reason, checked.detail)
    signed = SignedPayment(
        header=header.strip(),
        payload_sha256=digest,
        nonce=checked.nonce,
        payer=checked.payer,
        pay_to=checked.pay_to,
        amount=checked.amount,
        asset=checked.asset,
        network=checked.network,
        valid_before=checked.valid_before,
        payer_kind="agent",
    )
    kept = await payments.keep(op, signed)
    if isinstance(kept, Deny):
        return kept
    if kept.payload_sha256 != digest:  # another request bound another one first
        return Deny(
            Reason.PAYMENT_AUTHORIZATION_MISMATCH,
            "the operation is bound to another payment authorization",
            extra={"payment_sha256": kept.payload_sha256, "nonce": kept.nonce},
        )
    return kept


async def _payment_to_send(
    payments: _Keeper,
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
    return await payments.keep(op, signed)


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
        from proxy.x402.choice import choose
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
    chosen = choose(required, approval, _accepted(terms))
    if isinstance(chosen, Refused):
        reason = (
            Reason.X402_NOT_APPROVED
            if chosen.why is Why.NOT_APPROVED
            else Reason.X402_CHALLENGE_INVALID
        )
        return Deny(reason, chosen.detail)
    assert terms.wallet_secret is not None  # the policy requires it where opgate pays
    key = credentials.secret(terms.wallet_secret)
    if key is None:
        return Deny(
            Reason.CREDENTIAL_UNAVAILABLE, f"secret {terms.wallet_secret!r} is not configured"
        )
    try:
        account = Account.from_key(key)
    except ValueError:
        return Deny(Reason.CREDENTIAL_UNAVAILABLE, f"secret {terms.wallet_secret!r} is not a key")
    now = int(time.time())
    payload = sign_payment(
        account, chosen, required.resource, op.operation_id, now, required.extensions
    )
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


def _accepted(terms: X402Payment) -> Accepted:
    """What the rule lets the operation pay with (its own configuration, never the 402's)."""
    from proxy.x402.choice import Accepted

    return Accepted(
        frozenset(terms.schemes),
        frozenset(terms.networks),
        frozenset(asset.lower() for asset in terms.assets),
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


def _refused(stored: StoredPayment, answered: UpstreamResponse) -> Paid:
    """The upstream answered the paid request with another 402. If it says the payment's nonce
    is used (its PAYMENT-REQUIRED's ``error``, compared with the known code, never echoed), the
    operation's one payment was settled before and its answer lost: the row settles confirmed
    with opgate's problem as its answer, and nothing is ever signed for it again. Otherwise the
    payment is refused, and the row's outcome stays unknown."""
    nonce_used = False
    header = answered.headers.get(PAYMENT_REQUIRED)
    if header is not None:
        from proxy.x402.challenge import read_payment_required
        from proxy.x402.refusal import Refused

        required = read_payment_required(header)
        nonce_used = not isinstance(required, Refused) and required.error == _NONCE_USED
    evidence = {**stored.evidence(), "nonce_used": nonce_used, "refused_with": 402}
    if not nonce_used:
        refusal = Deny(
            Reason.X402_PAYMENT_REFUSED,
            "the provider answered the paid request with another 402",
            extra=evidence,
        )
        return Paid(answered, refusal, evidence=stored.evidence())
    refusal = Deny(
        Reason.X402_PAID_ANSWER_LOST,
        "the provider says the payment's nonce is used: the operation was paid before, and "
        "its answer was lost",
        extra=evidence,
    )
    body = json.dumps(
        {"code": refusal.reason.value, "detail": refusal.detail, **evidence}, sort_keys=True
    ).encode()
    lost = UpstreamResponse(
        status=502,
        reason="Bad Gateway",
        headers=CIMultiDictProxy(CIMultiDict({"Content-Type": "application/problem+json"})),
        body=body,
    )
    return Paid(
        lost, refusal, settled_as=Settled(Status.CONFIRMED, None), evidence=stored.evidence()
    )


async def _keep_settlement(
    payments: _Keeper | X402Payments, operation_id: str, answered: UpstreamResponse
) -> str | None:
    """Keep the answer's PAYMENT-RESPONSE with the payment; its transaction, if it names one."""
    from proxy.x402.refusal import Refused
    from proxy.x402.settlement import read_payment_response

    header = answered.headers.get(PAYMENT_RESPONSE)
    if header is None:
        return None
    settlement = read_payment_response(header)
    if isinstance(settlement, Refused):
        return None
    # The answer is the agent's whatever the store does: a settlement not kept here is still in
    # the answer the operation's row keeps, and the token's state says it was paid.
    with contextlib.suppress(StoreUnavailable):
        await payments.record_settlement(operation_id, settlement.model_dump(by_alias=True))
    return settlement.transaction or None
