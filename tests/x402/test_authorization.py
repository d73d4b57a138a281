"""The authorization opgate signs: its nonce is the operation's (a fixed known answer), and
its signature is the wallet's over the EIP-3009 typed data the token checks."""

from __future__ import annotations

import base64
import json

from eth_account import Account
from x402.extensions.payment_identifier import (
    PAYMENT_IDENTIFIER,
    declare_payment_identifier_extension,
)
from x402.mechanisms.evm.eip712 import hash_eip3009_authorization
from x402.mechanisms.evm.types import ExactEIP3009Authorization
from x402.schemas import PaymentRequired

from proxy.x402.authorization import (
    operation_nonce,
    payment_identifier,
    sign_payment,
    signature_header,
)
from tests.support.x402_ledger import CHAIN_ID, TOKEN, TOKEN_NAME, TOKEN_VERSION
from tests.support.x402_minting import challenge

WALLET = Account.from_key("0x" + "4f" * 32)


def test_the_nonce_is_derived_from_the_operation_id() -> None:
    """A fixed known answer, so the derivation cannot change on both sides unnoticed."""
    assert operation_nonce("op_123") == (
        "0xbbd1a8d3e7b99414208a796af7b471f9160b4847246442d6be3d0736775104ab"
    )
    assert operation_nonce("op_124") != operation_nonce("op_123")


def test_the_signed_payload_carries_the_operations_nonce_and_the_wallets_signature() -> None:
    """The header decodes to a payload whose signature recovers to the wallet."""
    required = PaymentRequired.model_validate(challenge())
    [requirement] = required.accepts
    payload = sign_payment(WALLET, requirement, required.resource, "op_123", now=1_000)
    sent = json.loads(base64.b64decode(signature_header(payload)))
    authorization = sent["payload"]["authorization"]
    assert authorization["nonce"] == operation_nonce("op_123")
    assert (authorization["validAfter"], authorization["validBefore"]) == ("0", "1300")
    assert sent["accepted"]["payTo"] == requirement.pay_to
    digest = hash_eip3009_authorization(
        ExactEIP3009Authorization(
            from_address=authorization["from"],
            to=authorization["to"],
            value=authorization["value"],
            valid_after=authorization["validAfter"],
            valid_before=authorization["validBefore"],
            nonce=authorization["nonce"],
        ),
        CHAIN_ID,
        TOKEN,
        TOKEN_NAME,
        TOKEN_VERSION,
    )
    signature = bytes.fromhex(sent["payload"]["signature"].removeprefix("0x"))
    assert Account._recover_hash(digest, signature=signature) == WALLET.address


def test_the_payment_identifier_is_the_operation_id_where_the_server_declares_it() -> None:
    """A challenge declaring payment-identifier (the SDK's own declaration) gets the operation
    id as its id; a challenge without it, or an id the extension does not allow, gets none."""
    declared = {PAYMENT_IDENTIFIER: declare_payment_identifier_extension()}
    required = PaymentRequired.model_validate(challenge(extensions=declared))
    [requirement] = required.accepts
    operation_id = "op_0123456789abcdef01234567"
    payload = sign_payment(
        WALLET, requirement, required.resource, operation_id, 1_000, required.extensions
    )
    sent = json.loads(base64.b64decode(signature_header(payload)))
    assert sent["extensions"][PAYMENT_IDENTIFIER]["info"]["id"] == operation_id
    bare = sign_payment(WALLET, requirement, required.resource, operation_id, 1_000, None)
    assert "extensions" not in json.loads(base64.b64decode(signature_header(bare)))
    assert payment_identifier(declared, "op_short") is None  # under 16 characters
    assert payment_identifier({PAYMENT_IDENTIFIER: "not a declaration"}, operation_id) is None
