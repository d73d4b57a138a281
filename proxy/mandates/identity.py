"""A mandate's identity: the digest that keys its operation, its open mandate's uses and its
revocation. ES256 signatures are malleable ((R, n - S) verifies as (R, S) does), so the digest is
of the issuer-signed JWT's canonical, low-S text (proxy/transparency/jws.py ``low_s``), which a
JWT and its twin share. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.mandates.sdjwt import b64url_digest
from proxy.transparency import jws


@dataclass(frozen=True, slots=True)
class MandateIdentity:
    """A mandate's identity (``digest``), and the digest a record made before it was keyed by
    its identity may hold instead (``twin``)."""

    # base64url SHA-256 of the issuer-signed JWT's canonical (low-S) text: one value for the
    # JWT and its twin (R, n - S), which anyone holding it can make and the verifier accepts
    digest: str
    # of the other (high-S) text: until this release a mandate was keyed by the digest of its
    # text as presented, so an operation approved, an open mandate's use or a revocation made
    # then under a high-S text is found under this one (no migration rewrote them)
    twin: str

    @property
    def spellings(self) -> tuple[str, str]:
        return self.digest, self.twin


def mandate_identity(issuer_signed_jwt: str) -> MandateIdentity:
    """A mandate's identity, the same whichever of its disclosures a presentation reveals and
    whichever of its signature's two texts it carries (proxy/transparency/jws.py). A JWT whose
    signature does not read (a refused presentation, kept for the record) has one text only."""
    try:
        canonical = jws.low_s(issuer_signed_jwt)
    except jws.JwsInvalid:
        return MandateIdentity(b64url_digest(issuer_signed_jwt), b64url_digest(issuer_signed_jwt))
    return MandateIdentity(b64url_digest(canonical), b64url_digest(jws.twin(canonical)))
