"""Compact ES256 JWS verification (proxy/transparency/jws.py) against RFC 7515 Appendix A.3's
example, RFC 7518 section 3.4's signature form, and tokens that withhold, trim, reorder, pad or
duplicate parts of a valid one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.transparency import jws
from tests.support.jws import (
    RFC_HEADER,
    RFC_JWS,
    RFC_PAYLOAD,
    RFC_PAYLOAD_BYTES,
    RFC_PUBLIC_JWK,
    RFC_SIGNATURE,
    b64url,
    raw_signature,
    signed,
    token,
)


def test_the_rfc_7515_a3_example_verifies_with_its_key() -> None:
    """RFC 7515 A.3's JWS verifies under the RFC's P-256 key, giving its header and the
    payload's exact octets (CRLF line breaks kept)."""
    verified = jws.verify(RFC_JWS, RFC_PUBLIC_JWK)
    assert verified.header == {"alg": "ES256"}
    assert verified.payload == RFC_PAYLOAD_BYTES
    assert jws.header(RFC_JWS) == {"alg": "ES256"}


def test_the_rfc_example_does_not_verify_under_another_key_or_with_another_payload() -> None:
    """The RFC's signature fails under a key it was not made with, and over a changed payload."""
    other = {**RFC_PUBLIC_JWK, "x": RFC_PUBLIC_JWK["y"], "y": RFC_PUBLIC_JWK["x"]}
    with pytest.raises(jws.JwsInvalid):  # not a point of the curve, even: refused either way
        jws.verify(RFC_JWS, other)
    changed = b64url(RFC_PAYLOAD_BYTES.replace(b"joe", b"eve"))
    with pytest.raises(jws.SignatureMismatch):
        jws.verify(f"{RFC_HEADER}.{changed}.{RFC_SIGNATURE}", RFC_PUBLIC_JWK)


@pytest.mark.parametrize(
    "alg",
    [
        pytest.param("none", id="none"),
        pytest.param("HS256", id="hmac"),
        pytest.param("ES384", id="another-curve"),
        pytest.param("es256", id="lower-case"),
        pytest.param("ES256 ", id="trailing-space"),
        pytest.param(None, id="missing"),
        pytest.param(["ES256"], id="a-list"),
    ],
)
def test_alg_is_exactly_es256(alg: Any) -> None:
    """RFC 7518 3.1: only the registered name ES256, spelt exactly, is accepted; the token is
    signed, so only the rule refuses it."""
    header = {"kid": "k"} if alg is None else {"alg": alg}
    with pytest.raises(jws.JwsInvalid, match="ES256 only"):
        jws.verify(token(header, {"a": 1}), RFC_PUBLIC_JWK)


@pytest.mark.parametrize(
    "header",
    [
        pytest.param({"alg": "ES256", "crit": ["exp"], "exp": 1}, id="crit-an-extension"),
        pytest.param({"alg": "ES256", "crit": []}, id="crit-empty"),
        pytest.param({"alg": "ES256", "crit": ["b64"], "b64": False}, id="crit-b64"),
        pytest.param({"alg": "ES256", "b64": True}, id="b64-without-crit"),
    ],
)
def test_no_extension_is_understood(header: dict[str, Any]) -> None:
    """RFC 7515 4.1.11: a crit this verifier does not understand (it understands none) is
    refused, and so is b64 (RFC 7797), which would change what the signature covers."""
    with pytest.raises(jws.JwsInvalid, match="header parameter is not accepted"):
        jws.verify(token(header, {"a": 1}), RFC_PUBLIC_JWK)


@pytest.mark.parametrize(
    "header_text",
    [
        pytest.param('{"alg":"ES256","kid":"a","kid":"b"}', id="kid-twice"),
        pytest.param('{"alg":"none","alg":"ES256"}', id="alg-twice-last-es256"),
        pytest.param('{"alg":"ES256","alg":"ES256"}', id="alg-twice-same"),
        pytest.param('{"alg":"ES256","x":NaN}', id="nan"),
        pytest.param('{"alg":"ES256","x":"\\ud800"}', id="lone-surrogate"),
        pytest.param('{"alg":"ES256","x":"\\u0000"}', id="nul"),
        pytest.param('["alg","ES256"]', id="an-array"),
        pytest.param('{"alg":"ES256","x":' + "[" * 40 + "]" * 40 + "}", id="deep"),
    ],
)
def test_the_header_is_strict_json(header_text: str) -> None:
    """A header that reads two ways (a member named twice), is not JSON's, or nests deeper than
    the bound, is refused though signed."""
    with pytest.raises(jws.JwsInvalid, match="JWS header"):
        jws.verify(token(header_text, {"a": 1}), RFC_PUBLIC_JWK)


def _padded(segment: str) -> str:
    return segment + "=" * (-len(segment) % 4)


PAYLOAD_WITH_SLACK = b64url(b'{"a":1}')  # 7 bytes: 10 characters, the last holding 2 spare bits


@pytest.mark.parametrize(
    ("header_b64", "payload_b64"),
    [
        pytest.param(RFC_HEADER + "==", RFC_PAYLOAD, id="header-padded"),
        pytest.param(RFC_HEADER, _padded(PAYLOAD_WITH_SLACK), id="payload-padded"),
        pytest.param(RFC_HEADER, PAYLOAD_WITH_SLACK[:-1] + "F", id="payload-non-canonical"),
        pytest.param(RFC_HEADER, "eyJhIjo+fQ", id="standard-alphabet-plus"),
        pytest.param(RFC_HEADER, PAYLOAD_WITH_SLACK[:4] + "\n" + PAYLOAD_WITH_SLACK[4:], id="nl"),
        pytest.param(RFC_HEADER, PAYLOAD_WITH_SLACK[:4] + " " + PAYLOAD_WITH_SLACK[4:], id="sp"),
        pytest.param(RFC_HEADER, PAYLOAD_WITH_SLACK[:-1], id="length-one-mod-four"),
    ],
)
def test_base64url_is_unpadded_and_canonical(header_b64: str, payload_b64: str) -> None:
    """RFC 7515 2: base64url without '=' and (so that a value has one text) without spare bits
    set; the standard alphabet and whitespace are refused, though the token is signed."""
    assert PAYLOAD_WITH_SLACK[-1] == "Q"  # "F": the same value, spare bits set
    assert len(PAYLOAD_WITH_SLACK) == 10
    with pytest.raises(jws.JwsInvalid, match="base64url"):
        jws.verify(signed(header_b64, payload_b64), RFC_PUBLIC_JWK)


def test_a_padded_or_non_canonical_signature_is_refused() -> None:
    """The signature segment is held to the same base64url rules as the others."""
    good = token({"alg": "ES256"}, {"a": 1})
    header_b64, payload_b64, signature = good.split(".")
    assert len(signature) == 86  # 64 bytes: two spare bits in the last character
    jws.verify(good, RFC_PUBLIC_JWK)
    for changed in (signature + "==", signature[:-1] + chr(ord(signature[-1]) ^ 1)):
        if changed[-1] in "AQgw=":  # the spare bits unset: not this case
            continue
        with pytest.raises(jws.JwsInvalid, match="base64url"):
            jws.verify(f"{header_b64}.{payload_b64}.{changed}", RFC_PUBLIC_JWK)


N = jws.P256_ORDER


@pytest.mark.parametrize(
    ("signature", "words"),
    [
        pytest.param(b"", "not 64 bytes", id="empty"),
        pytest.param(bytes(63), "not 64 bytes", id="63-bytes"),
        pytest.param(bytes(65), "not 64 bytes", id="65-bytes"),
        pytest.param(bytes(64), "out of range", id="r-and-s-zero"),
        pytest.param(N.to_bytes(32, "big") + (1).to_bytes(32, "big"), "out of range", id="r-n"),
        pytest.param((1).to_bytes(32, "big") + N.to_bytes(32, "big"), "out of range", id="s-n"),
    ],
)
def test_the_signature_is_r_and_s_in_64_bytes(signature: bytes, words: str) -> None:
    """RFC 7518 3.4: R || S, 32 bytes each, big-endian; each in 1..n-1."""
    with pytest.raises(jws.JwsInvalid, match=words):
        jws.verify(signed(RFC_HEADER, RFC_PAYLOAD, signature), RFC_PUBLIC_JWK)


def test_a_der_encoded_signature_is_refused() -> None:
    """An ASN.1 DER signature (what ECDSA libraries return) is not a JWS signature: refused
    by its length, even though it is a valid signature over the same input."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    raw = raw_signature(f"{RFC_HEADER}.{RFC_PAYLOAD}")
    der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    jws.public_key(RFC_PUBLIC_JWK).verify(
        der, f"{RFC_HEADER}.{RFC_PAYLOAD}".encode(), ec.ECDSA(hashes.SHA256())
    )
    with pytest.raises(jws.JwsInvalid, match="not 64 bytes"):
        jws.verify(signed(RFC_HEADER, RFC_PAYLOAD, der), RFC_PUBLIC_JWK)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        pytest.param({"crv": "P-384"}, "not a P-256 key", id="another-curve"),
        pytest.param({"kty": "OKP"}, "not a P-256 key", id="another-type"),
        pytest.param({"x": RFC_PUBLIC_JWK["x"][1:]}, "base64url|32 bytes", id="x-short"),
        pytest.param({"y": RFC_PUBLIC_JWK["y"] + "="}, "base64url", id="y-padded"),
        pytest.param({"y": b64url(bytes(32))}, "point", id="off-the-curve"),
        pytest.param({"x": None}, "strings", id="x-missing"),
    ],
)
def test_the_key_is_a_p256_point(change: dict[str, Any], words: str) -> None:
    """RFC 7518 6.2.1: kty EC, crv P-256, x and y in 32 bytes each, a point of the curve."""
    key = {**RFC_PUBLIC_JWK, **change}
    with pytest.raises(jws.JwsInvalid, match=words):
        jws.verify(RFC_JWS, key)


# --- withheld, trimmed, reordered, duplicated parts of a valid token ---------------------------
GOOD = token({"alg": "ES256", "kid": "k1", "typ": "JWT"}, {"iss": "joe", "amount": 2500})


def _mutations() -> st.SearchStrategy[str]:
    h, p, s = GOOD.split(".")
    parts = [h, p, s]
    segment = st.sampled_from(parts)
    dropped = st.integers(0, 2).map(lambda i: ".".join(x for j, x in enumerate(parts) if j != i))
    repeated = st.lists(segment, min_size=1, max_size=5).map(".".join)
    reordered = st.permutations(parts).map(".".join)
    trimmed = st.tuples(st.integers(0, 2), st.integers(1, 8), st.booleans()).map(
        lambda t: ".".join(
            (x[t[1] :] if t[2] else x[: -t[1]]) if j == t[0] else x for j, x in enumerate(parts)
        )
    )
    padded = st.tuples(st.integers(0, 2), st.sampled_from(["=", "==", "==="])).map(
        lambda t: ".".join(x + t[1] if j == t[0] else x for j, x in enumerate(parts))
    )
    extra_dots = st.sampled_from([f"{GOOD}.", f".{GOOD}", f"{h}..{p}.{s}", f"{GOOD}.{s}"])
    return st.one_of(dropped, repeated, reordered, trimmed, padded, extra_dots)


@given(_mutations())
def test_no_part_of_a_valid_token_can_be_withheld_trimmed_reordered_padded_or_repeated(
    changed: str,
) -> None:
    """Any token made of a valid one's segments, but not exactly it, is refused."""
    if changed == GOOD:
        return
    with pytest.raises(jws.JwsInvalid):
        jws.verify(changed, RFC_PUBLIC_JWK)


@given(
    st.sampled_from(["alg", "kid", "typ"]),
    st.sampled_from(["ES256", "none", "k1", "k2", "JWT"]),
    st.booleans(),
)
def test_a_header_member_duplicated_is_refused_wherever_it_sits(
    name: str, value: str, first: bool
) -> None:
    """A valid header with one of its members named a second time (before or after the
    original, with the same or another value) is refused, though signed."""
    members = [("alg", "ES256"), ("kid", "k1"), ("typ", "JWT")]
    extra = f"{json.dumps(name)}:{json.dumps(value)}"
    body = [f"{json.dumps(k)}:{json.dumps(v)}" for k, v in members]
    text = "{" + ",".join([extra, *body] if first else [*body, extra]) + "}"
    with pytest.raises(jws.JwsInvalid, match="JWS header"):
        jws.verify(token(text, {"a": 1}), RFC_PUBLIC_JWK)


def test_the_valid_token_itself_verifies() -> None:
    """The token the mutations start from verifies (so each refusal above is the mutation's)."""
    verified = jws.verify(GOOD, RFC_PUBLIC_JWK)
    assert verified.header == {"alg": "ES256", "kid": "k1", "typ": "JWT"}
    assert json.loads(verified.payload) == {"iss": "joe", "amount": 2500}


def test_a_refused_header_is_still_read_as_written_for_the_record() -> None:
    """``read_header`` gives what an ``alg: none`` token names (its kid, for the audit record)
    while ``header`` and ``verify`` refuse it."""
    none = b64url(json.dumps({"alg": "none", "kid": "k1"}).encode())
    unsigned = f"{none}.{RFC_PAYLOAD}."
    assert jws.read_header(unsigned) == {"alg": "none", "kid": "k1"}
    with pytest.raises(jws.JwsInvalid, match="ES256 only"):
        jws.header(unsigned)
    with pytest.raises(jws.JwsInvalid, match="ES256 only"):
        jws.verify(unsigned, RFC_PUBLIC_JWK)


def test_a_signature_has_a_second_valid_text() -> None:
    """ECDSA's malleability, pinned: (R, n - S) verifies as (R, S) does, so a token's text is
    not its identity (the module docstring); only what is signed, header.payload, is."""
    raw = raw_signature(f"{RFC_HEADER}.{RFC_PAYLOAD}")
    s = int.from_bytes(raw[32:], "big")
    twin = signed(RFC_HEADER, RFC_PAYLOAD, raw[:32] + (N - s).to_bytes(32, "big"))
    original = signed(RFC_HEADER, RFC_PAYLOAD, raw)
    assert twin != original
    assert jws.verify(twin, RFC_PUBLIC_JWK) == jws.verify(original, RFC_PUBLIC_JWK)


def test_the_rfc_example_and_its_twin_have_one_identity() -> None:
    """RFC 7515 A.3's token is spelled with the high S: its canonical text is its twin's, whose
    S is n - S; both have the identity pinned here (a known answer, so that the canonical form
    cannot change on both sides of this test unnoticed)."""
    twin = jws.twin(RFC_JWS)
    assert jws.low_s(RFC_JWS) == twin == jws.low_s(twin)
    assert jws.twin(twin) == RFC_JWS
    assert jws.identity(RFC_JWS) == jws.identity(twin)
    assert jws.identity(RFC_JWS) == "0WF1cZ9FpfwIjB2VczBAl2OJMVo_Rzn-qAGlFiNMUdE"
    assert int.from_bytes(jws.b64url_decode(twin.split(".")[2], "s")[32:], "big") <= N // 2
    assert jws.verify(twin, RFC_PUBLIC_JWK) == jws.verify(RFC_JWS, RFC_PUBLIC_JWK)


@given(st.binary(min_size=1, max_size=64))
def test_a_token_and_its_twin_have_one_identity(payload: bytes) -> None:
    """Whichever of its two texts is given, a signed token has one identity, and its canonical
    text is the one of the two whose S is at most n / 2."""
    original = token({"alg": "ES256"}, payload)
    twin = jws.twin(original)
    assert twin != original
    assert jws.identity(original) == jws.identity(twin)
    assert jws.low_s(original) in (original, twin)
    assert int.from_bytes(jws.b64url_decode(jws.low_s(twin).split(".")[2], "s")[32:], "big") <= (
        N // 2
    )


@given(st.binary(min_size=1, max_size=64), st.binary(min_size=1, max_size=64))
def test_two_different_tokens_never_share_an_identity(first: bytes, second: bytes) -> None:
    """Tokens that differ in what is signed, or only in their signature's R (two signatures of
    one payload), have different identities: only a token's twin shares its identity."""
    one, other = token({"alg": "ES256"}, first), token({"alg": "ES256"}, second)
    resigned = token({"alg": "ES256"}, first)  # ECDSA's fresh k: another R
    assert jws.identity(one) != jws.identity(resigned)
    if first != second:
        assert jws.identity(one) != jws.identity(other)
        assert jws.identity(one) != jws.identity(jws.twin(other))


@pytest.mark.parametrize(
    ("signature", "words"),
    [
        (b"", "64 bytes"),
        (bytes(32) + (1).to_bytes(32, "big"), "out of range"),
        (b"\x01" * 32 + N.to_bytes(32, "big"), "out of range"),
    ],
    ids=["empty", "zero-r", "s-is-n"],
)
def test_a_signature_that_does_not_read_has_no_identity(signature: bytes, words: str) -> None:
    """A signature that is not R || S in range is refused, never given an identity."""
    with pytest.raises(jws.JwsInvalid, match=words):
        jws.identity(signed(RFC_HEADER, RFC_PAYLOAD, signature))
