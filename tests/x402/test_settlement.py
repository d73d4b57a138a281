"""PAYMENT-RESPONSE read strictly: a malformed settlement is a refusal value, never raised."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st
from x402.schemas import SettleResponse

from proxy.x402.refusal import Refused, Why
from proxy.x402.settlement import read_payment_response
from tests.support.x402_minting import encoded, nested

SETTLED = {"success": True, "transaction": "0xab", "network": "eip155:8453", "payer": "0x01"}

MALFORMED = {
    "not base64": "%%%",
    "not JSON": base64.b64encode(b"{").decode(),
    "a list": encoded([SETTLED]),
    "no success": encoded({k: v for k, v in SETTLED.items() if k != "success"}),
    "deep": encoded({**SETTLED, "extensions": nested(20)}),
    "oversized": "A" * 20_000,
}


@pytest.mark.parametrize("header", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_settlement_is_refused(header: str) -> None:
    """Each malformed PAYMENT-RESPONSE is a MALFORMED refusal."""
    refused = read_payment_response(header)
    assert isinstance(refused, Refused)
    assert refused.why is Why.MALFORMED


def test_a_settlement_reads_as_the_sdks_model() -> None:
    """A well-formed settlement keeps its transaction."""
    read = read_payment_response(encoded(SETTLED))
    assert isinstance(read, SettleResponse)
    assert read.transaction == "0xab"


@given(st.binary(max_size=256))
def test_any_bytes_are_a_value_never_an_exception(raw: bytes) -> None:
    """Arbitrary bytes never raise."""
    read_payment_response(base64.b64encode(raw).decode())
    read_payment_response(raw.decode("latin-1"))
