"""An agent's own ``PAYMENT-SIGNATURE`` (rule ``x402.payer: agent``), read strictly and checked
against the approval: the requirement it fulfils must be one the approval covers (choice), the
EIP-3009 authorization must pay exactly that requirement to that payee within a window open
now and at most choice.MAX_TIMEOUT_SECONDS long, for the approved resource, and its signature
must be its payer's. The gate then binds it to the operation by its nonce (proxy/gate/x402_pay.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass

from eth_account import Account
from eth_keys.exceptions import BadSignature
from pydantic import ValidationError
from x402.extensions.payment_identifier import extract_payment_identifier
from x402.mechanisms.evm.eip712 import hash_eip3009_authorization
from x402.mechanisms.evm.types import ExactEIP3009Authorization
from x402.mechanisms.evm.utils import get_evm_chain_id
from x402.schemas import PaymentPayload

from proxy.x402.challenge import MAX_DEPTH, MAX_HEADER_BYTES, MAX_UINT256_DIGITS, depth
from proxy.x402.choice import MAX_TIMEOUT_SECONDS, Accepted, Approval, miss
from proxy.x402.refusal import Refused, Why

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_NONCE = re.compile(r"0x[0-9a-fA-F]{64}")
_SIGNATURE = re.compile(r"0x[0-9a-fA-F]{130}")
_AUTHORIZATION_FIELDS = ("from", "to", "value", "validAfter", "validBefore", "nonce")


@dataclass(frozen=True)
class OfferedPayment:
    """An agent's payment that fits the approval: what it pays, for the operation's evidence."""

    payer: str
    pay_to: str
    amount: int
    asset: str
    network: str
    nonce: str  # lower-case 0x hex: the binding to the operation
    valid_before: int


def read_offered(header: str) -> PaymentPayload | Refused:
    """The payload in ``header``, or why it is not one opgate reads (MALFORMED)."""
    if len(header) > MAX_HEADER_BYTES:
        return Refused(Why.MALFORMED, f"PAYMENT-SIGNATURE is over {MAX_HEADER_BYTES} bytes")
    try:
        document = json.loads(base64.b64decode(header.strip(), validate=True))
    except (binascii.Error, ValueError, RecursionError):
        return Refused(Why.MALFORMED, "PAYMENT-SIGNATURE is not base64-encoded JSON")
    if not isinstance(document, dict) or depth(document) > MAX_DEPTH:
        return Refused(Why.MALFORMED, "PAYMENT-SIGNATURE is not an x402 payment payload")
    if document.get("x402Version") != 2:
        return Refused(Why.MALFORMED, "PAYMENT-SIGNATURE is not an x402 version 2 payment")
    try:
        return PaymentPayload.model_validate(document)
    except ValidationError:
        return Refused(Why.MALFORMED, "PAYMENT-SIGNATURE does not have the protocol's fields")


def payment_id_of(header: str) -> str | None:
    """The ``payment-identifier`` id a payment carries (None: none, or not one the extension
    allows): the key under which a server that declared the extension keeps its answer."""
    payload = read_offered(header)
    if isinstance(payload, Refused):
        return None
    return extract_payment_identifier(payload)


def check_offered(
    payload: PaymentPayload, approval: Approval, accepted: Accepted, now: int
) -> OfferedPayment | Refused:
    """``payload`` as a payment the approval covers, or why not (MALFORMED or NOT_APPROVED)."""
    requirement = payload.accepted
    resource = payload.resource.url if payload.resource is not None else None
    if resource != approval.resource:
        return Refused(Why.NOT_APPROVED, "the payment names a resource the approval does not")
    amount = requirement.amount
    if not (amount.isascii() and amount.isdigit() and len(amount) <= MAX_UINT256_DIGITS):
        return Refused(Why.MALFORMED, "the payment's amount is not a uint256")
    missed = miss(requirement, approval, accepted)
    if missed is not None:
        return Refused(Why.NOT_APPROVED, f"the payment does not fit the approval: {missed}")
    inner = payload.payload
    authorization = inner.get("authorization")
    signature = inner.get("signature")
    if not isinstance(authorization, dict) or not isinstance(signature, str):
        return Refused(Why.MALFORMED, "the payment is not an EIP-3009 authorization")
    values = [authorization.get(name) for name in _AUTHORIZATION_FIELDS]
    if not all(isinstance(value, str) for value in values):
        return Refused(Why.MALFORMED, "the authorization's fields are not all text")
    payer, pay_to, value, valid_after, valid_before, nonce = (str(v) for v in values)
    numbers = (value, valid_after, valid_before)
    if not all(n.isascii() and n.isdigit() and len(n) <= MAX_UINT256_DIGITS for n in numbers):
        return Refused(Why.MALFORMED, "the authorization's amounts or times are not integers")
    if not (_ADDRESS.fullmatch(payer) and _ADDRESS.fullmatch(pay_to)):
        return Refused(Why.MALFORMED, "the authorization's addresses are not EVM addresses")
    if not (_NONCE.fullmatch(nonce) and _SIGNATURE.fullmatch(signature)):
        return Refused(Why.MALFORMED, "the authorization's nonce or signature is malformed")
    if pay_to.lower() != requirement.pay_to.lower() or int(value) != int(amount):
        return Refused(Why.NOT_APPROVED, "the authorization pays other than its requirement")
    if not int(valid_after) <= now < int(valid_before) <= now + MAX_TIMEOUT_SECONDS:
        return Refused(Why.NOT_APPROVED, "the authorization's validity window is not open now")
    extra = requirement.extra or {}
    typed = ExactEIP3009Authorization(
        from_address=payer,
        to=pay_to,
        value=value,
        valid_after=valid_after,
        valid_before=valid_before,
        nonce=nonce,
    )
    digest = hash_eip3009_authorization(
        typed,
        get_evm_chain_id(str(requirement.network)),
        requirement.asset,
        str(extra["name"]),
        str(extra["version"]),
    )
    try:
        signer = Account._recover_hash(digest, signature=bytes.fromhex(signature[2:]))
    except (BadSignature, ValueError, TypeError):  # the agent's bytes: a refusal, not an error
        return Refused(Why.MALFORMED, "the authorization's signature does not recover")
    if signer.lower() != payer.lower():
        return Refused(Why.MALFORMED, "the authorization is not signed by its payer")
    return OfferedPayment(
        payer=payer,
        pay_to=pay_to,
        amount=int(value),
        asset=requirement.asset,
        network=str(requirement.network),
        nonce=nonce.lower(),
        valid_before=int(valid_before),
    )


def offered_digest(header: str) -> str:
    """SHA-256 of the header as the agent sent it (stripped of surrounding blanks)."""
    return hashlib.sha256(header.strip().encode()).hexdigest()
