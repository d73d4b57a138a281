"""What a bundle's records say about each operation, and what they refer to, checked: the
reviewer's "did opgate send this, exactly once, and who approved it", answered from the
records ``verify-bundle`` proved and nothing else. Pure: no database, no settings.

    who approved it   the ``created`` record's approval; for a signed mandate (``ap2:<digest>``)
                      the presentation and the issuer's keys, kept in the presentation's request
                      record (its ``mandate`` field): the presentation's issuer-signed JWT must
                      hash to the digest the approval names (and its open mandate's to the
                      ``;open:`` one), and verify with a key of those issuer keys
    how often sent    the ``claimed`` records (one per attempt), less the attempts released
                      ``not_sent`` (nothing left); the replays (the stored answer, nothing sent)
    the answer        what opgate stored of the provider's answer (the bundle's ``answers``,
                      from the operation row, which no record holds whole): its status and
                      object id against the record that settled the operation, its body against
                      the ``provider_answer_sha256`` of the request records that received or
                      replayed it

A referred item that does not match its digest is a break (the bundle was altered, or the row
was); one that no record holds a digest of is listed as unproven, never trusted silently.
"""

from __future__ import annotations

import base64
import hashlib
import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.observe.auditlog.chain import StoredRecord
from proxy.policy.amounts import decimal_spelling
from proxy.transparency import jws

_SETTLED = ("confirmed", "failed")
_SETTLING_EVENTS = ("confirmed", "failed", "reconciled", "resolved")
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})
_CHAIN_SEPARATOR = "~~"  # AP2's <open mandate>~~<closed mandate>~ (proxy/mandates/chain.py)


@dataclass
class OperationEvidence:
    """One operation as its records tell it: summary lines, breaks, and what is not proven."""

    operation_id: str
    lines: list[str] = field(default_factory=list)
    breaks: list[str] = field(default_factory=list)
    unproven: list[str] = field(default_factory=list)


def operations(
    records: Sequence[StoredRecord], answers: Mapping[str, Mapping[str, Any]]
) -> list[OperationEvidence]:
    """Each operation whose own stream has records here, from ``records`` (verified already)
    and the stored ``answers`` (the bundle's, by operation id)."""
    transitions: dict[str, list[dict[str, Any]]] = {}
    requests: dict[str, list[tuple[StoredRecord, dict[str, Any]]]] = {}
    for record in sorted(records, key=lambda r: (r.stream, r.seq)):
        fields = _fields(record)
        if record.kind == "transition" and record.stream == record.operation_id:
            transitions.setdefault(record.stream, []).append(fields)
        elif record.kind == "request" and record.operation_id is not None:
            requests.setdefault(record.operation_id, []).append((record, fields))
    found = []
    for operation_id, events in sorted(transitions.items()):
        evidence = OperationEvidence(operation_id)
        named = requests.get(operation_id, [])
        _approval(evidence, events, named)
        _sends(evidence, events, named)
        _answer(evidence, events, named, answers.get(operation_id))
        found.append(evidence)
    return found


def _fields(record: StoredRecord) -> dict[str, Any]:
    try:
        fields = json.loads(record.record)
    except (ValueError, RecursionError):  # not JSON, or nested too deeply to read
        return {}
    return fields if isinstance(fields, dict) else {}


def printable(text: object) -> str:
    """A value from a record as a line may show it: every character a terminal would act on,
    that reorders the line (bidi controls) or cannot be written (a lone surrogate) as its
    escape, so that a summary line says what the record holds and nothing else."""
    return "".join(
        f"\\u{ord(c):04x}" if unicodedata.category(c) in _UNPRINTABLE else c for c in str(text)
    )


def money(amount: object, currency: object) -> str:
    """An approved amount: "5.00 USD (500 minor units)", or "500 minor units" with no currency
    (or one without a known exponent: "500 minor units of XAU")."""
    if not isinstance(amount, int) or isinstance(amount, bool):
        return printable(f"{amount!r} (not an amount in minor units)")
    if not isinstance(currency, str) or not currency:
        return f"{amount} minor units"
    spelt = decimal_spelling(amount, currency)
    code = printable(currency.upper()[:8])
    if spelt is None:
        return f"{amount} minor units of {code}"
    return f"{spelt} {code} ({amount} minor units)"


def _detail(fields: Mapping[str, Any]) -> dict[str, Any]:
    detail = fields.get("detail")
    return detail if isinstance(detail, dict) else {}


# --- who approved it --------------------------------------------------------------------------
def _approval(
    evidence: OperationEvidence,
    events: list[dict[str, Any]],
    named: list[tuple[StoredRecord, dict[str, Any]]],
) -> None:
    op = evidence.operation_id
    created = next((e for e in events if e.get("event") == "created"), None)
    if created is None:
        evidence.unproven.append(f"operation {op}: its approval (the created record) is not here")
        return
    detail = _detail(created)
    ref = str(detail.get("approval_ref"))
    amount = detail.get("amount")
    what = f"{detail.get('action')} on {detail.get('provider')}"
    what = printable(what) + (
        f", {money(amount, detail.get('currency'))}" if amount is not None else ""
    )
    evidence.lines.append(
        f"approved by {printable(detail.get('approved_by'))} ({printable(ref)}): {what}"
    )
    if not ref.startswith("ap2:"):
        return
    digest, _, open_digest = ref.removeprefix("ap2:").partition(";open:")
    presented = [(r, f["mandate"]) for r, f in named if isinstance(f.get("mandate"), dict)]
    if not presented:
        evidence.unproven.append(
            f"operation {op}: approved by mandate {digest}, whose presentation is in no record"
            " here (its request record lost before storage?): who signed it is not proven"
        )
        return
    signers: list[str] = []
    for record, mandate in presented:
        problem, signer = check_mandate(mandate, digest, open_digest or None)
        if problem is None:
            signers.append(signer)
        else:
            evidence.breaks.append(
                f"operation {op}: the presentation in stream {record.stream} seq {record.seq}"
                f" {problem}"
            )
    if signers:
        times = f", presented {len(presented)} times" if len(presented) > 1 else ""
        evidence.lines.append(f"mandate signed by {signers[0]}: verified ({digest}{times})")


def check_mandate(
    mandate: Mapping[str, Any], digest: str, open_digest: str | None
) -> tuple[str | None, str]:
    """(what is wrong, or None; who signed it) for a presentation record's ``mandate`` field
    against the digests an approval names."""
    presentation = mandate.get("presentation")
    if not isinstance(presentation, str):
        return "holds no presentation (redacted?)", ""
    segments = presentation.split(_CHAIN_SEPARATOR)
    root_jwt = segments[0].split("~", 1)[0]
    closed_jwt = segments[-1].split("~", 1)[0]
    if digest not in _spellings(closed_jwt):
        return f"is not the mandate the approval names ({digest})", ""
    if open_digest is not None and open_digest not in _spellings(root_jwt):
        return f"is not under the open mandate the approval names ({open_digest})", ""
    kid, problem = _verify_es256(root_jwt, mandate.get("issuer_jwks"))
    if problem is not None:
        return f"is not signed by the issuer's keys it was accepted with: {problem}", ""
    thumbprint = _thumbprint(mandate["issuer_jwks"], kid)
    return None, f"issuer {mandate.get('issuer')} (key {kid}, RFC 7638 thumbprint {thumbprint})"


def _thumbprint(jwks: Mapping[str, Any], kid: str | None) -> str:
    """The signing key's RFC 7638 thumbprint, which a reviewer compares with the key the issuer
    publishes (the JWKS in the record is the one opgate trusted, not proof of the issuer's)."""
    jwk = next(k for k in jwks["keys"] if isinstance(k, dict) and k.get("kid") == kid)
    members = {name: jwk[name] for name in ("crv", "kty", "x", "y")}
    canonical = json.dumps(members, separators=(",", ":"), sort_keys=True)
    return _b64url_sha256(canonical)


def _spellings(jwt: str) -> tuple[str, ...]:
    """The digests an approval may name a mandate's JWT by: its identity (the digest of its
    low-S text, jws.identity) and the digest of its other text, under which a release before
    the identity keyed the mandate presented that way; both its texts are the one mandate,
    signed once. A JWT whose signature does not read has one text."""
    try:
        return _b64url_sha256(jwt), _b64url_sha256(jws.twin(jwt))
    except jws.JwsInvalid:
        return (_b64url_sha256(jwt),)


def _b64url_sha256(text: str) -> str:
    return jws.b64url_encode(hashlib.sha256(text.encode("ascii", "replace")).digest())


def _verify_es256(jwt: str, jwks: Any) -> tuple[str | None, str | None]:
    """(the key id, None) when an ES256 key of ``jwks`` signed ``jwt``; else (kid, why not).
    Verified by opgate's one JWS verifier (proxy/transparency/jws.py), by the rules mandates
    are accepted under, so a presentation the gate refused is not proven here either."""
    try:
        kid = jws.header(jwt).get("kid")
    except jws.JwsInvalid as exc:
        return None, f"not an ES256 JWS opgate accepts: {exc}"
    keys = jwks.get("keys") if isinstance(jwks, dict) else None
    jwk = next((k for k in keys or () if isinstance(k, dict) and k.get("kid") == kid), None)
    if jwk is None or jwk.get("kty") != "EC" or jwk.get("crv") != "P-256":
        return kid, f"no P-256 key {kid} among them"
    try:
        jws.public_key(jwk)
    except jws.JwsInvalid:
        return kid, f"key {kid} is not a P-256 public key"
    try:
        jws.verify(jwt, jwk)
    except jws.SignatureMismatch:
        return kid, f"the signature does not verify with key {kid}"
    except jws.JwsInvalid as exc:
        return kid, f"not an ES256 JWS opgate accepts: {exc}"
    return kid, None


# --- how often it was sent --------------------------------------------------------------------
def _sends(
    evidence: OperationEvidence,
    events: list[dict[str, Any]],
    named: list[tuple[StoredRecord, dict[str, Any]]],
) -> None:
    claims = [e for e in events if e.get("event") == "claimed"]
    withdrawn = [
        e for e in events if e.get("event") == "unknown" and _detail(e).get("outcome") == "not_sent"
    ]
    sent = len(claims) - len(withdrawn)
    attempts = f"{len(claims)} attempt{'s' if len(claims) != 1 else ''}"
    if withdrawn:
        attempts += f", {len(withdrawn)} withdrawn before a byte left"
    if sent <= 0:
        evidence.lines.append(f"never sent ({attempts})")
    elif sent == 1:
        evidence.lines.append(f"sent once ({attempts})")
    else:
        created = next((e for e in events if e.get("event") == "created"), {})
        key = _detail(created).get("idempotency_key_sha256")
        keyed = f" (sha256 {printable(key)[:16]}...)" if isinstance(key, str) else ""
        evidence.lines.append(
            f"sent {sent} times ({attempts}), each with the operation's one idempotency key"
            f"{keyed}: one effect where the provider deduplicates on it"
        )
    replays = sum(1 for _, f in named if f.get("decision") == "replay")
    if replays:  # other streams' records, which a bundle cannot show all of: at least
        evidence.lines.append(
            f"replayed at least {replays} time{'s' if replays != 1 else ''} (the stored"
            " answer, nothing sent)"
        )


# --- the provider's answer ----------------------------------------------------------------------
def _answer(
    evidence: OperationEvidence,
    events: list[dict[str, Any]],
    named: list[tuple[StoredRecord, dict[str, Any]]],
    answer: Mapping[str, Any] | None,
) -> None:
    op = evidence.operation_id
    settled = next((e for e in reversed(events) if e.get("event") in _SETTLING_EVENTS), None)
    if settled is None:
        evidence.lines.append("not settled in these records")
        return
    detail, status = _detail(settled), settled.get("status_after")
    event = settled.get("event")
    if event in _SETTLED:
        evidence.lines.append(
            f"answered {status}: provider status {detail.get('provider_status')},"
            f" object {detail.get('object_id')}"
        )
    elif event == "reconciled":
        evidence.lines.append(f"settled {status} by a lookup at the provider (reconciled)")
    else:
        evidence.lines.append(f"settled {status} by a human verdict of {settled.get('actor')}")
    if answer is None:
        evidence.unproven.append(f"operation {op}: the stored answer is not in the bundle")
        return
    mismatch = _answer_mismatch(answer, detail, status, event)
    if mismatch is not None:
        evidence.breaks.append(
            f"operation {op}: the stored answer in the bundle is not the one the signed"
            f" records hold ({mismatch})"
        )
        return
    _answer_body(evidence, answer, named)


def _answer_mismatch(
    answer: Mapping[str, Any], detail: Mapping[str, Any], status: Any, event: Any
) -> str | None:
    if answer.get("status") != status:
        return f"status {answer.get('status')}, the record's {status}"
    if event in _SETTLED and answer.get("provider_status") != detail.get("provider_status"):
        return f"provider status {answer.get('provider_status')}, the record's"
    object_id = detail.get("object_id")
    if event in (*_SETTLED, "resolved") and object_id and answer.get("object_id") != object_id:
        return f"object {answer.get('object_id')}, the record's {object_id}"
    return None


def _answer_body(
    evidence: OperationEvidence,
    answer: Mapping[str, Any],
    named: list[tuple[StoredRecord, dict[str, Any]]],
) -> None:
    op = evidence.operation_id
    try:
        body = base64.b64decode(str(answer.get("body") or ""), validate=True)
    except ValueError:  # binascii.Error, or a character outside ASCII
        evidence.breaks.append(f"operation {op}: the stored answer's body is not base64")
        return
    actual = hashlib.sha256(body).hexdigest()
    holders = [
        (r, f["provider_answer_sha256"])
        for r, f in named
        if f.get("provider_answer_sha256")
        and f.get("status_after") in _SETTLED
        and f.get("decision") in ("allow", "replay")
    ]
    if not holders:
        evidence.unproven.append(
            f"operation {op}: no record holds a digest of the stored answer (settled by a"
            " lookup or a verdict, or before records kept one): its body is not proven"
        )
        return
    for record, expected in holders:
        if expected != actual:
            evidence.breaks.append(
                f"operation {op}: the stored answer in the bundle is not the one the signed"
                f" request record stream {record.stream} seq {record.seq} received or"
                f" replayed (SHA-256 {actual[:16]}..., the record's {str(expected)[:16]}...)"
            )
            return
    evidence.lines.append(
        f"the stored answer matches the signed record (SHA-256 {actual[:16]}...,"
        f" {len(holders)} record{'s' if len(holders) != 1 else ''})"
    )
