"""The EIP-3009 authorization opgate signs for one operation, and its header.

The nonce is derived from the operation id (SHA-256 under a fixed label), so an operation can
only ever produce one authorization: the token contract refuses a second transfer with a used
nonce whoever signs it, and whatever opgate's store remembers. The gate stores the signed
payload on the operation row before it leaves and re-sends the stored one on every retry; the
derivation is the guarantee that holds even if that row were lost.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from eth_account.signers.local import LocalAccount
from x402.extensions.payment_identifier import (
    PAYMENT_IDENTIFIER,
    append_payment_identifier_to_extensions,
)
from x402.extensions.payment_identifier.utils import is_valid_payment_id
from x402.mechanisms.evm.eip712 import build_typed_data_for_signing
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.mechanisms.evm.types import (
    ExactEIP3009Authorization,
    ExactEIP3009Payload,
    TypedDataField,
)
from x402.mechanisms.evm.utils import get_evm_chain_id
from x402.schemas import PaymentPayload, PaymentRequirements, ResourceInfo

_NONCE_LABEL = b"opgate/x402/eip3009-nonce/v1\x00"


def operation_nonce(operation_id: str) -> str:
    """The 32-byte EIP-3009 nonce of ``operation_id``, as 0x-prefixed hex."""
    return "0x" + hashlib.sha256(_NONCE_LABEL + operation_id.encode()).hexdigest()


def sign_payment(
    account: LocalAccount,
    requirement: PaymentRequirements,
    resource: ResourceInfo | None,
    operation_id: str,
    now: int,
    advertised: dict[str, Any] | None = None,
) -> PaymentPayload:
    """The signed payload paying ``requirement`` for ``operation_id``, valid from now for the
    requirement's ``maxTimeoutSeconds`` (bounded by choice.MAX_TIMEOUT_SECONDS). Where the
    challenge's extensions (``advertised``) declare ``payment-identifier``, its id is the
    operation id: a server that keeps it answers the operation's retry from its record. No
    other extension is echoed: opgate endorses only what it reads."""
    authorization = ExactEIP3009Authorization(
        from_address=account.address,
        to=requirement.pay_to,
        value=requirement.amount,
        valid_after="0",
        valid_before=str(now + requirement.max_timeout_seconds),
        nonce=operation_nonce(operation_id),
    )
    extra = requirement.extra
    domain, types, primary_type, message = build_typed_data_for_signing(
        authorization,
        get_evm_chain_id(str(requirement.network)),
        requirement.asset,
        str(extra["name"]),
        str(extra["version"]),
    )
    fields = {
        name: [TypedDataField(name=f["name"], type=f["type"]) for f in entries]
        for name, entries in types.items()
    }
    signature = EthAccountSigner(account).sign_typed_data(domain, fields, primary_type, message)
    inner = ExactEIP3009Payload(authorization=authorization, signature="0x" + signature.hex())
    return PaymentPayload(
        payload=inner.to_dict(),
        accepted=requirement,
        resource=resource,
        extensions=payment_identifier(advertised or {}, operation_id),
    )


def payment_identifier(advertised: dict[str, Any], operation_id: str) -> dict[str, Any] | None:
    """The ``payment-identifier`` extension carrying the operation id, if the server declared
    it (the SDK's own reading of the declaration) and the id is one the extension allows
    (16-128 of ``[A-Za-z0-9_-]``); else None: the nonce alone binds the payment."""
    if PAYMENT_IDENTIFIER not in advertised or not is_valid_payment_id(operation_id):
        return None
    declared = {PAYMENT_IDENTIFIER: advertised[PAYMENT_IDENTIFIER]}
    append_payment_identifier_to_extensions(declared, operation_id)  # only if well formed
    extension = declared[PAYMENT_IDENTIFIER]
    info = extension.get("info") if isinstance(extension, dict) else None
    if not isinstance(info, dict) or info.get("id") != operation_id:
        return None
    return declared


def signature_header(payload: PaymentPayload) -> str:
    """``PAYMENT-SIGNATURE``'s value: the payload's JSON (camelCase), base64."""
    text = payload.model_dump_json(by_alias=True, exclude_none=True)
    return base64.b64encode(text.encode()).decode()


def payload_digest(header: str) -> str:
    """SHA-256 of the header as sent: the evidence that names one authorization."""
    return hashlib.sha256(header.encode()).hexdigest()
