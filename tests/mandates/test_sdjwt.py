"""SD-JWT processing (RFC 9901 section 7.1) against the RFC's own examples and minted tokens."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.mandates.sdjwt import (
    ClaimWithheld,
    SdJwtExpired,
    SdJwtInvalid,
    b64url_digest,
    check_times,
    reveal,
    split,
    verify_jws,
)
from tests.support.mandates import Signer, b64url, compact, disclosure, sign

# RFC 9901 section 4.2.3: the two digests the RFC computes for its example Disclosures
RFC_CLAIM = "WyI2cU1RdlJMNWhhaiIsICJmYW1pbHlfbmFtZSIsICJNw7ZiaXVzIl0"
RFC_CLAIM_DIGEST = "uutlBuYeMDyjLLTpf6Jxi7yNkEF35jdyWMn9U7b_RYY"
RFC_ELEMENT = "WyJsa2x4RjVqTVlsR1RQVW92TU5JdkNBIiwgIkZSIl0"
RFC_ELEMENT_DIGEST = "w0I8EKcdCtUPkGCNUrfwVp2xEgNjtoIDlOxc9-PlOhs"


def test_digests_match_the_rfc_examples() -> None:
    """The digest of each of RFC 9901's example Disclosures is the one the RFC prints."""
    assert b64url_digest(RFC_CLAIM) == RFC_CLAIM_DIGEST
    assert b64url_digest(RFC_ELEMENT) == RFC_ELEMENT_DIGEST


def test_rfc_disclosures_reveal_a_claim_and_an_array_element() -> None:
    """The RFC's object-property and array-element Disclosures land where their digests are."""
    payload = {
        "_sd": [RFC_CLAIM_DIGEST],
        "nationalities": [{"...": RFC_ELEMENT_DIGEST}, "DE"],
        "_sd_alg": "sha-256",
    }
    assert reveal(payload, (RFC_CLAIM, RFC_ELEMENT)) == {
        "family_name": "Möbius",
        "nationalities": ["FR", "DE"],
    }


@pytest.mark.parametrize(
    ("scenario", "payload", "disclosures", "claim"),
    [
        ("claim withheld", {"_sd": [RFC_CLAIM_DIGEST]}, (), "$"),
        (
            "element withheld",
            {"nationalities": [{"...": RFC_ELEMENT_DIGEST}]},
            (),
            "nationalities[0]",
        ),
        (
            "decoy claim digest",
            {"_sd": [RFC_CLAIM_DIGEST, b64url_digest("decoy")]},
            (RFC_CLAIM,),
            "$",
        ),
        (
            "decoy element digest",
            {"nationalities": [{"...": RFC_ELEMENT_DIGEST}, {"...": b64url_digest("decoy")}]},
            (RFC_ELEMENT,),
            "nationalities[1]",
        ),
    ],
)
def test_an_undisclosed_digest_is_refused_not_read_as_absent(
    scenario: str, payload: dict[str, Any], disclosures: tuple[str, ...], claim: str
) -> None:
    """A digest without a Disclosure (a withheld claim or element, or a decoy: RFC 9901 makes
    them indistinguishable) is refused naming where it sits, never read as absent."""
    with pytest.raises(ClaimWithheld) as refused:
        reveal(payload, disclosures, words=frozenset({"nationalities"}))
    assert refused.value.claim == claim, scenario


def test_a_withheld_claim_is_named_where_the_caller_reads_it_by_name() -> None:
    """Where the caller names the claims it reads, the first of them not shown is named."""
    with pytest.raises(ClaimWithheld) as refused:
        reveal(
            {"_sd": [RFC_CLAIM_DIGEST], "vct": "x"},
            (),
            lambda path, claims: ("vct", "constraints"),
            frozenset({"constraints"}),
        )
    assert refused.value.claim == "constraints"


@pytest.mark.parametrize(
    ("scenario", "payload", "disclosures", "message"),
    [
        ("unreferenced disclosure", {"_sd": []}, (RFC_CLAIM,), "not referenced"),
        ("disclosure given twice", {"_sd": [RFC_CLAIM_DIGEST]}, (RFC_CLAIM,) * 2, "twice"),
        (
            "digest used twice",
            {"_sd": [RFC_CLAIM_DIGEST], "a": {"_sd": [RFC_CLAIM_DIGEST]}},
            (RFC_CLAIM,),
            "more than once",
        ),
        (
            "claim over an existing one",
            {"_sd": [RFC_CLAIM_DIGEST], "family_name": "Smith"},
            (RFC_CLAIM,),
            "existing",
        ),
        ("element in _sd", {"_sd": [RFC_ELEMENT_DIGEST]}, (RFC_ELEMENT,), "array-element"),
        ("claim as element", {"x": [{"...": RFC_CLAIM_DIGEST}]}, (RFC_CLAIM,), "array element"),
        ("other _sd_alg", {"_sd_alg": "sha-1"}, (), "_sd_alg is not"),
        ("_sd not an array", {"_sd": "x"}, (), "not an array"),
        ("padded disclosure", {"_sd": []}, (RFC_CLAIM + "=",), "unpadded"),
    ],
)
def test_malformed_selective_disclosure_is_refused(
    scenario: str, payload: dict[str, object], disclosures: tuple[str, ...], message: str
) -> None:
    """Each processing rule of RFC 9901 section 7.1 refuses its violation."""
    with pytest.raises(SdJwtInvalid, match=message):
        reveal(payload, disclosures)


def test_a_reserved_claim_name_in_a_disclosure_is_refused() -> None:
    """A Disclosure may not name ``_sd`` or ``...``."""
    for name in ("_sd", "..."):
        text = disclosure(name, ["x"])
        with pytest.raises(SdJwtInvalid, match="reserved"):
            reveal({"_sd": [b64url_digest(text)]}, (text,))


def test_nesting_deeper_than_the_bound_is_refused() -> None:
    """A payload nested past the bound is refused, not walked (no RecursionError)."""
    deep: dict[str, object] = {}
    for _ in range(3000):
        deep = {"a": deep}
    with pytest.raises(SdJwtInvalid, match="deeper"):
        reveal(deep, ())


def test_split_keeps_the_key_binding_jwt_apart() -> None:
    """The last part is the KB-JWT, or empty; sd_hash covers everything before it."""
    token = split("h.p.s~d1~d2~k.b.j")
    assert token.disclosures == ("d1", "d2")
    assert token.key_binding_jwt == "k.b.j"
    assert token.without_key_binding == "h.p.s~d1~d2~"
    assert split("h.p.s~").key_binding_jwt is None
    with pytest.raises(SdJwtInvalid):
        split("h.p.s")
    with pytest.raises(SdJwtInvalid):
        split("h.p.s~~d~")


def test_signatures_verify_only_under_the_signing_key() -> None:
    """An ES256 JWS verifies under its key and under no other."""
    signer, other = Signer("k1"), Signer("k2")
    jwt = sign(signer.key, {"kid": "k1"}, {"a": 1})
    assert verify_jws(jwt, signer.public_jwk)[1] == {"a": 1}
    with pytest.raises(SdJwtInvalid, match="does not verify"):
        verify_jws(jwt, other.public_jwk)


def test_alg_none_and_hmac_are_refused_before_any_key() -> None:
    """``alg: none`` and HS256 are refused whatever the key."""
    signer = Signer("k1")
    body = b64url(json.dumps({"a": 1}).encode())
    for alg in ("none", "HS256", "ES512"):
        header = b64url(json.dumps({"alg": alg, "kid": "k1"}).encode())
        with pytest.raises(SdJwtInvalid, match="not accepted"):
            verify_jws(f"{header}.{body}.", signer.public_jwk)


def test_a_tampered_payload_does_not_verify() -> None:
    """Changing one claim of a signed mandate breaks its signature."""
    signer = Signer("k1")
    header, _payload, signature = sign(signer.key, {"kid": "k1"}, {"amount": 2500}).split(".")
    forged = b64url(json.dumps({"amount": 2501}).encode())
    with pytest.raises(SdJwtInvalid):
        verify_jws(f"{header}.{forged}.{signature}", signer.public_jwk)


def test_times_are_checked_with_skew() -> None:
    """exp in the past (beyond the skew) is expired; iat and nbf in the future are refused."""
    check_times({"exp": 100, "iat": 50}, now=150, skew=60, what="m")
    with pytest.raises(SdJwtExpired):
        check_times({"exp": 100}, now=161, skew=60, what="m")
    with pytest.raises(SdJwtInvalid, match="future"):
        check_times({"iat": 300}, now=100, skew=60, what="m")
    with pytest.raises(SdJwtInvalid, match="integer"):
        check_times({"exp": "100"}, now=100, skew=60, what="m")


def test_a_minted_sd_jwt_round_trips() -> None:
    """A mandate minted with disclosures reveals exactly its claims after verification."""
    signer = Signer("k1")
    jwt, disclosures = signer.sd_jwt({"a": 1, "b": {"c": 2}}, disclose=("b",))
    token = split(compact(jwt, disclosures))
    _, payload = verify_jws(token.issuer_jwt, signer.public_jwk)
    assert reveal(payload, token.disclosures) == {"a": 1, "b": {"c": 2}}
