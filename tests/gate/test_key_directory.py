"""Web Bot Auth's key directory: a JWKS of the agents' public Ed25519 keys, and one response
signature per key that the ``http-message-signatures`` library verifies for the authority asked
(and for no other); served only for a Host that names an authority."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from http_message_signatures import HTTPMessageVerifier, algorithms
from http_message_signatures.exceptions import HTTPMessageSignaturesException
from http_message_signatures.resolvers import MappingKeyResolver
from hypothesis import given, settings
from hypothesis import strategies as st
from joserfc.jwk import OKPKey
from structlog.testing import capture_logs

from proxy.gate.key_directory import (
    COVERED,
    DIRECTORY_PATH,
    MEDIA_TYPE,
    TAG,
    public_authority,
    signed_directory,
)
from proxy.gate.signatures import AgentKey
from tests.support.audit_logs import audits
from tests.support.opgate import Opgate
from tests.support.raw_http import exchange

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


def directory_request(host_lines: list[bytes]) -> bytes:
    """A GET of the directory with exactly ``host_lines`` as its Host header lines."""
    head = [f"GET {DIRECTORY_PATH} HTTP/1.1".encode(), *host_lines, b"Connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n"


@pytest.mark.parametrize(
    "host",
    [
        b"Host: ",
        b"Host: [",
        b"Host: a:b:c",
        b"Host: exa mple",
        b"Host: opgate.test:99999",
        b"Host: opgate.test:",
        b"Host: [::1",
        b"Host: user@opgate.test",
        b"Host: opgate.test/x",
        b"Host: opgate.test\r\nHost: elsewhere.test",
    ],
    ids=[
        "empty",
        "bracket",
        "colons",
        "space",
        "port",
        "no port",
        "v6",
        "userinfo",
        "slash",
        "two",
    ],
)
async def test_a_host_that_names_no_authority_is_a_400_problem(
    fault_gate: Opgate, host: bytes
) -> None:
    """An empty, malformed or repeated Host: 400 ``request_malformed`` as problem+json, on
    record (the signature covers the authority: there is none to sign over)."""
    fault_gate.running.gateway.signing_keys = {"agent-a": AGENT_KEYS[0]}
    with capture_logs() as logs:
        answer = await exchange(fault_gate.agent_url, directory_request(host.split(b"\r\n")))
    assert (answer.status, answer.headers.get("Content-Type")) == (
        400,
        "application/problem+json",
    )
    assert answer.problem()["code"] == "request_malformed"
    [record] = audits(logs)
    assert (record["reason"], record["response_status"]) == ("request_malformed", 400)


@pytest.mark.parametrize("host", ["opgate.test:8443", "OPGATE.test", "127.0.0.1:80", "[::1]:9"])
async def test_a_well_formed_host_gets_a_directory_signed_over_it(
    fault_gate: Opgate, host: str
) -> None:
    """A well-formed Host: the directory, its signature verifying for that authority."""
    fault_gate.running.gateway.signing_keys = {"agent-a": AGENT_KEYS[0]}
    answer = await exchange(fault_gate.agent_url, directory_request([f"Host: {host}".encode()]))
    assert answer.status == 200
    url = f"http://{host.lower()}{DIRECTORY_PATH}"
    assert verify(answer.body, answer.headers, url) == {KEYS[0].thumbprint()}


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40))
def test_every_host_is_refused_or_signed_over(host: str) -> None:
    """Any printable Host value: refused (None), or an authority the directory is signed over
    and verifies for; never an exception."""
    authority = public_authority([host])
    if authority is None:
        return
    url = f"https://{authority}{DIRECTORY_PATH}"
    body, headers = signed_directory(AGENT_KEYS[:1], url, datetime.now(UTC))
    assert verify(body, headers, url) == {KEYS[0].thumbprint()}
