"""PAYMENT-REQUIRED read strictly: every malformed or oversized challenge is a refusal value,
never an exception, and a valid one reads as the SDK's model."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from x402.schemas import PaymentRequired

from proxy.x402.challenge import MAX_HEADER_BYTES, read_payment_required
from proxy.x402.refusal import Refused, Why
from tests.support.x402_minting import challenge, encoded, nested, requirement

MALFORMED = {
    "not base64": "%%%not-base64%%%",
    "base64 of not JSON": base64.b64encode(b"{not json").decode(),
    "a JSON list": encoded([challenge()]),
    "version 1": encoded(challenge(x402Version=1)),
    "no accepts": encoded({"x402Version": 2, "resource": {"url": "u"}}),
    "empty accepts": encoded(challenge(accepts=[])),
    "oversized": "A" * (MAX_HEADER_BYTES + 1),
    "deep JSON": encoded(challenge(extensions=nested(20))),
    "amount over uint256": encoded(challenge(requirement(amount=str(2**256)))),
    "a 100-digit amount": encoded(challenge(requirement(amount="9" * 100))),
    "a negative amount": encoded(challenge(requirement(amount="-1"))),
    "a decimal amount": encoded(challenge(requirement(amount="1.5"))),
    "amount as a number": encoded(challenge(requirement(amount=10))),
    "unicode digits": encoded(challenge(requirement(amount="\u0661\u0660"))),
    "too many requirements": encoded(challenge(*[requirement()] * 17)),
    "a requirement without payTo": encoded(
        challenge({k: v for k, v in requirement().items() if k != "payTo"})
    ),
}


@pytest.mark.parametrize("header", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_challenge_is_refused_as_malformed(header: str) -> None:
    """Each malformed challenge is a MALFORMED refusal."""
    refused = read_payment_required(header)
    assert isinstance(refused, Refused)
    assert refused.why is Why.MALFORMED


def test_json_nested_past_the_parsers_limit_is_refused() -> None:
    """JSON nested deeper than Python's recursion limit is refused, not raised."""
    header = base64.b64encode(b"[" * 9000 + b"]" * 9000).decode()
    assert isinstance(read_payment_required(header), Refused)


def test_a_valid_challenge_reads_as_the_sdks_model() -> None:
    """A minted challenge reads with its requirement intact."""
    read = read_payment_required(encoded(challenge()))
    assert isinstance(read, PaymentRequired)
    assert read.accepts[0].amount == requirement()["amount"]


@given(st.binary(max_size=512))
def test_any_bytes_are_a_value_never_an_exception(raw: bytes) -> None:
    """Arbitrary bytes, base64-encoded or not, never raise."""
    for header in (base64.b64encode(raw).decode(), raw.decode("latin-1")):
        read_payment_required(header)


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
def test_any_json_is_a_value_never_an_exception(document: Any) -> None:
    """Arbitrary JSON, alone or in place of the challenge's parts, never raises."""
    read_payment_required(encoded(document))
    read_payment_required(encoded(challenge(accepts=document)))
    read_payment_required(encoded(challenge(requirement(extra=document, amount="1"))))
