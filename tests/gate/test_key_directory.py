"""Web Bot Auth's key directory, built without a server: a JWKS of the agents' public Ed25519
keys, and one response signature per key that the ``http-message-signatures`` library
verifies for the authority asked (and for no other)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from http_message_signatures import HTTPMessageVerifier, algorithms
from http_message_signatures.exceptions import HTTPMessageSignaturesException
from http_message_signatures.resolvers import MappingKeyResolver
from joserfc.jwk import OKPKey

from proxy.gate.key_directory import COVERED, MEDIA_TYPE, TAG, signed_directory
from proxy.gate.signatures import AgentKey

URL = "https://opgate.example/.well-known/http-message-signatures-directory"
KEYS = [OKPKey.generate_key("Ed25519") for _ in range(2)]
AGENT_KEYS = [AgentKey.from_jwk(dict(k.as_dict(private=True))) for k in KEYS]


@dataclass
class _Request:
    method: str
    url: str
    headers: dict[str, str]


@dataclass
class _Response:
    status_code: int
    headers: Any
    request: _Request


def verify(body: bytes, headers: Any, url: str) -> set[str]:
    """The keyids whose signature the library verifies, keys taken from the body itself."""
    offered = {k["kid"]: OKPKey.import_key(k).public_key for k in json.loads(body)["keys"]}
    verifier = HTTPMessageVerifier(
        signature_algorithm=algorithms.ED25519,
        key_resolver=MappingKeyResolver(public_keys=offered, private_keys={}),
    )
    message = _Response(200, headers, _Request("GET", url, {}))
    results = verifier.verify(message, expect_tag=TAG, require_components=COVERED, body=body)
    return {r.parameters["keyid"] for r in results}


def test_each_key_is_listed_by_thumbprint_and_signs_the_response() -> None:
    """Two agents' keys (and one repeated): two entries, kid the thumbprint, two signatures."""
    body, headers = signed_directory([*AGENT_KEYS, AGENT_KEYS[0]], URL, datetime.now(UTC))
    listed = json.loads(body)["keys"]
    assert sorted(k["kid"] for k in listed) == sorted(k.thumbprint() for k in KEYS)
    assert all((k["kty"], k["crv"]) == ("OKP", "Ed25519") and "d" not in k for k in listed)
    assert headers["Content-Type"] == MEDIA_TYPE
    assert verify(body, headers, URL) == {k.thumbprint() for k in KEYS}


@pytest.mark.parametrize("scenario", ["another authority", "another body"])
def test_the_signatures_bind_the_authority_and_the_body(scenario: str) -> None:
    """Re-served under another authority, or with a key list altered, it does not verify."""
    body, headers = signed_directory(AGENT_KEYS, URL, datetime.now(UTC))
    url = URL.replace("opgate.example", "elsewhere.example") if scenario != "another body" else URL
    if scenario == "another body":
        body = json.dumps({"keys": json.loads(body)["keys"][:1]}, sort_keys=True).encode()
    with pytest.raises(HTTPMessageSignaturesException):
        verify(body, headers, url)


def test_no_key_is_an_empty_directory() -> None:
    """An opgate holding no agent key publishes an empty set, unsigned."""
    body, headers = signed_directory([], URL, datetime.now(UTC))
    assert json.loads(body) == {"keys": []}
    assert "Signature" not in headers
