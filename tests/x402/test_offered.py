"""An agent's PAYMENT-SIGNATURE read strictly: any bytes or JSON are a value, never raised;
malformed authorizations are refused as malformed before any signature is recovered."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from eth_account import Account
from hypothesis import given, settings
from hypothesis import strategies as st
from x402.schemas import PaymentPayload, PaymentRequired

from proxy.x402.authorization import sign_payment, signature_header
from proxy.x402.choice import Accepted, Approval
from proxy.x402.offered import OfferedPayment, check_offered, read_offered
from proxy.x402.refusal import Refused, Why
from tests.support.x402_ledger import NETWORK, TOKEN
from tests.support.x402_minting import RESOURCE, challenge, encoded
from tests.support.x402_server import PAYEE, PRICE

WALLET = Account.from_key("0x" + "7c" * 32)
ACCEPTED = Accepted(frozenset({"exact"}), frozenset({NETWORK}), frozenset({TOKEN.lower()}))
APPROVAL = Approval(RESOURCE, PRICE, TOKEN, NETWORK, PAYEE)


def signed(now: int) -> dict[str, Any]:
    required = PaymentRequired.model_validate(challenge())
    payload = sign_payment(WALLET, required.accepts[0], required.resource, "op_any", now)
    document: dict[str, Any] = json.loads(base64.b64decode(signature_header(payload)))
    return document


SIGNED = json.dumps(signed(int(time.time())))  # signed once: examples only replace parts


def checked(document: dict[str, Any], now: int) -> OfferedPayment | Refused:
    payload = read_offered(encoded(document))
    assert isinstance(payload, PaymentPayload)
    return check_offered(payload, APPROVAL, ACCEPTED, now)


def test_a_payment_signed_for_the_approval_is_accepted_with_its_nonce() -> None:
    """A real signature over the approved terms: accepted, its payer and nonce read."""
    now = int(time.time())
    accepted = checked(signed(now), now)
    assert isinstance(accepted, OfferedPayment)
    assert (accepted.payer, accepted.amount) == (WALLET.address, PRICE)


MALFORMED = {
    "a short nonce": ("nonce", "0x01"),
    "a short signature": ("signature", "0x01"),
    "a number for the value": ("value", 10_000),
    "a bad payer": ("from", "0xnothex"),
}


@pytest.mark.parametrize("case", MALFORMED.keys())
def test_a_malformed_authorization_is_refused_as_malformed(case: str) -> None:
    """Each malformed field: MALFORMED, before a signature is recovered."""
    now = int(time.time())
    document = signed(now)
    name, value = MALFORMED[case]
    if name == "signature":
        document["payload"]["signature"] = value
    else:
        document["payload"]["authorization"][name] = value
    refused = checked(document, now)
    assert isinstance(refused, Refused)
    assert refused.why is Why.MALFORMED


def test_an_expired_or_not_yet_valid_authorization_is_not_approved() -> None:
    """The window must be open at the check."""
    now = int(time.time())
    document = signed(now)
    for at in (now + 10_000, now - 10_000):
        refused = checked(document, at)
        assert isinstance(refused, Refused)
        assert refused.why is Why.NOT_APPROVED


@given(st.binary(max_size=512))
def test_any_bytes_are_a_value_never_an_exception(raw: bytes) -> None:
    """Arbitrary bytes, base64-encoded or not, never raise."""
    for header in (base64.b64encode(raw).decode(), raw.decode("latin-1")):
        read_offered(header)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=6), children, max_size=3)
        ),
        max_leaves=20,
    )
)
@settings(deadline=None)  # recovering a signature takes ~100 ms on a loaded machine
def test_any_json_in_the_authorization_is_a_value_never_an_exception(value: Any) -> None:
    """Arbitrary JSON in place of the authorization or its signature never raises."""
    now = int(time.time())
    for where in ("authorization", "signature"):
        document = json.loads(SIGNED)
        document["payload"][where] = value
        payload = read_offered(encoded(document))
        if isinstance(payload, PaymentPayload):
            check_offered(payload, APPROVAL, ACCEPTED, now)
