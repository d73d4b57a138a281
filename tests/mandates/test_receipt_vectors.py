"""Known answers for opgate's receipts (tests/vectors/receipt.json): the claims and the JWS
signing input under a fixed P-256 key, and a committed signature that must verify. ES256 is
randomized, so the signature itself is verified, never recomputed."""

from __future__ import annotations

from typing import Any

from joserfc.jwk import ECKey

from proxy.mandates.receipts import key_id, public_jwks, read_receipt, receipt_claims, sign_receipt
from tests.support.vectors import REGENERATE, load

VECTOR = load("receipt")
KEY = ECKey.import_key(VECTOR["private_jwk"])
INPUTS: dict[str, Any] = VECTOR["inputs"]


def test_the_committed_inputs_give_the_committed_claims() -> None:
    """A confirmed operation's success receipt and a refusal's error receipt carry exactly the
    committed claims."""
    common = {k: INPUTS[k] for k in ("issuer", "now", "reference")}
    assert receipt_claims(**common, operation=INPUTS["operation"]) == VECTOR["claims"], REGENERATE
    refusal = (VECTOR["refusal"]["code"], VECTOR["refusal"]["sentence"])
    assert receipt_claims(**common, refusal=refusal) == VECTOR["refusal_claims"], REGENERATE


def test_the_fixed_key_gives_the_committed_kid_jwks_and_signing_input() -> None:
    """The key's thumbprint, its published JWKS, and the protected header and payload opgate
    signs (all but the randomized signature) are the committed bytes."""
    assert key_id(KEY) == VECTOR["kid"], REGENERATE
    assert public_jwks(KEY) == VECTOR["jwks"], REGENERATE
    signed = sign_receipt(KEY, VECTOR["claims"])
    assert signed.rsplit(".", 1)[0] == VECTOR["signing_input"], REGENERATE


def test_the_committed_receipt_verifies_under_the_fixed_key() -> None:
    """The committed JWS is the committed signing input with a signature that read_receipt
    accepts, giving back the committed claims."""
    assert VECTOR["jws"].rsplit(".", 1)[0] == VECTOR["signing_input"]
    assert read_receipt(KEY, INPUTS["issuer"], VECTOR["jws"]) == VECTOR["claims"]
