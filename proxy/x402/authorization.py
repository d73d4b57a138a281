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

from eth_account.signers.local import LocalAccount
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
) -> PaymentPayload:
    """The signed payload paying ``requirement`` for ``operation_id``, valid from now for the
    requirement's ``maxTimeoutSeconds`` (bounded by choice.MAX_TIMEOUT_SECONDS)."""
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
    return PaymentPayload(payload=inner.to_dict(), accepted=requirement, resource=resource)


def signature_header(payload: PaymentPayload) -> str:
    """``PAYMENT-SIGNATURE``'s value: the payload's JSON (camelCase), base64."""
    text = payload.model_dump_json(by_alias=True, exclude_none=True)
    return base64.b64encode(text.encode()).decode()


def payload_digest(header: str) -> str:
    """SHA-256 of the header as sent: the evidence that names one authorization."""
    return hashlib.sha256(header.encode()).hexdigest()
