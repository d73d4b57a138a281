"""The agent's identity toward a provider: RFC 9421 HTTP message signatures on what leaves,
made with the Ed25519 key opgate holds for the agent, where the provider's policy sets
``agent_signature`` (Visa's Trusted Agent Protocol, Web Bot Auth). Pure: keys and the time are
given; the nonce is fresh randomness.

Signed over ``@authority``, ``@path`` and ``content-digest`` (RFC 9530, SHA-256 of the exact
bytes that leave), with ``created``, ``expires``, ``nonce``, ``keyid`` (the key's RFC 7638
thumbprint), ``alg`` and ``tag``. The signature base and the headers are the
``http-message-signatures`` library's: RFC 9421's canonicalisation is exacting, and a
provider's verifier is most likely that library or one tested against the same vectors.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from http_message_signatures import HTTPMessageSigner, algorithms
from http_message_signatures.resolvers import MappingKeyResolver
from joserfc.jwk import OKPKey
from multidict import CIMultiDict

from proxy.policy.model import AgentSignature

COVERED = ("@authority", "@path", "content-digest")
LABEL = "sig1"
SIGNATURE_AGENT = "Signature-Agent"


@dataclass(frozen=True)
class AgentKey:
    """The key opgate signs as one agent with."""

    key_id: str  # RFC 7638 thumbprint of the public key
    private: Ed25519PrivateKey
    public_jwk: dict[str, Any]  # what the key directory publishes (key_directory.py)

    @classmethod
    def from_jwk(cls, jwk: dict[str, Any]) -> AgentKey:
        key = OKPKey.import_key(jwk)
        if key.as_dict().get("crv") != "Ed25519" or not key.is_private:
            raise ValueError("an agent signing key is a private Ed25519 JWK (OKP)")
        private = key.private_key
        assert isinstance(private, Ed25519PrivateKey)
        public = {n: v for n, v in key.as_dict(private=False).items() if n in ("kty", "crv", "x")}
        return cls(str(key.thumbprint()), private, public)


@dataclass
class _Message:
    """What the library reads of a request: method, absolute URL, headers (it adds its own)."""

    method: str
    url: str
    headers: CIMultiDict[str]


def signed_headers(
    method: str,
    url: str,
    headers: CIMultiDict[str],
    body: bytes,
    key: AgentKey,
    policy: AgentSignature,
    now: datetime,
    signature_agent: str | None = None,
) -> CIMultiDict[str]:
    """``headers`` with ``Content-Digest``, ``Signature-Input`` and ``Signature`` set, and
    Web Bot Auth's ``Signature-Agent`` (the origin of opgate's key directory) when given: a
    Structured Fields dictionary whose member keyed by the signature's label is covered
    (``"signature-agent";key="sig1"``), as the Web Bot Auth protocol draft requires."""
    message = _Message(method, url, CIMultiDict(headers))
    for name in ("Content-Digest", "Signature-Input", "Signature", SIGNATURE_AGENT):
        message.headers.popall(name, None)  # the agent's own never leave: opgate signs
    covered: tuple[str, ...] = COVERED
    if signature_agent is not None:
        message.headers[SIGNATURE_AGENT] = f'{LABEL}="{signature_agent}"'
        covered = (*COVERED, f'"signature-agent";key="{LABEL}"')
    signer = HTTPMessageSigner(
        signature_algorithm=algorithms.ED25519,
        key_resolver=MappingKeyResolver(public_keys={}, private_keys={key.key_id: key.private}),
    )
    signer.sign(
        message,
        key_id=key.key_id,
        created=now,
        expires=now + timedelta(seconds=policy.expires_seconds),
        nonce=secrets.token_urlsafe(32),
        label=LABEL,
        tag=policy.tag,
        covered_component_ids=covered,
        body=body,
    )
    return message.headers
