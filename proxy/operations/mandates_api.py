"""Signed mandates over HTTP. On the agent listener (agent token, each call one audited agent
request): ``POST /_opgate/v1/mandates/nonces`` hands the agent a nonce for its next key
binding (AP2's verifier challenge; single use, a few minutes, this agent only);
``POST /_opgate/v1/mandates`` presents an AP2 Payment Mandate as the approval of one
operation and answers the operation with a signed receipt; ``GET
/_opgate/v1/mandates/{operation_id}/receipt`` answers the receipt of where it stands;
``POST /_opgate/v1/mandates/receipts`` takes a receipt opgate signed (from a replacement agent)
and answers where its operation stands; ``GET /.well-known/jwks.json`` publishes the
receipts' key. On the operations listener
(admin): ``POST /v1/mandates/{digest}/revoke``.

Why a separate call before the provider request, rather than a header on it: AP2 has the
verifier answer each presentation with a receipt, the operation row must exist (and be the
only one the mandate can ever name) before anything is sent, and the agent's provider SDK
then names that operation as every other approval's (``X-Operation-Id``); the gate's checks
compare the request with the row the mandate wrote, exactly as for any approval.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import structlog
from aiohttp import web
from joserfc.jwk import ECKey
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from proxy.admin.access import admin_problem
from proxy.errors import AlreadySuperseded, IdempotencyKeyInUse
from proxy.gate.bodies import BodyRejected, parse_json_object
from proxy.gate.checks import Agent
from proxy.gate.ids import IdKind, id_rule, path_id, path_operation_id, valid_id
from proxy.gate.problem import problem_response
from proxy.gate.reasons import REASONS, Reason
from proxy.mandates.ap2 import (
    CheckoutBinding,
    MandateCode,
    MandateRefusal,
    MandateTerms,
    approved_params,
    terms_of,
    x402_approved_params,
)
from proxy.mandates.chain import (
    Expectation,
    IssuerUnknown,
    TrustedKey,
    VerifiedMandate,
    presented_parts,
    verify_presentation,
)
from proxy.mandates.checkout import checkout_of
from proxy.mandates.identity import MandateIdentity, mandate_identity
from proxy.mandates.receipts import (
    ReceiptInvalid,
    public_jwks,
    read_receipt,
    receipt_claims,
    sign_receipt,
)
from proxy.mandates.sdjwt import ClaimWithheld, SdJwtExpired, SdJwtInvalid
from proxy.observe.audit import AuditRecord, Decision
from proxy.operations.agent_body import read_agent_body
from proxy.operations.api import read_document
from proxy.operations.approvals import (
    OperationRequest,
    plan_operation,
    same_approval,
    validation_errors,
)
from proxy.policy.payments import paid_in_minor, to_atomic
from proxy.recovery.api import recorded, recovery_view
from proxy.runtime import GATEWAY, Gateway
from proxy.settings import MandateIssuerConfig, Settings
from proxy.store.mandates import (
    MandateStore,
    NonceRefused,
    NonceUse,
    OpenMandateLimits,
    OpenMandateUsed,
)
from proxy.store.operation import Operation, Status
from proxy.store.store import NewOperation

MANDATES_PREFIX = "/_opgate/v1/mandates"
JWKS_PATH = "/.well-known/jwks.json"
MANDATE_RULE = "mandate"  # the rule name presentations are recorded under: opgate's own
# The operation a mandate approves lives as long as the mandate, and at most this long: within
# every shipped provider's memory of an idempotency key (approvals.py checks it).
_LONGEST_APPROVAL = timedelta(hours=1)
# A nonce answers one presentation within this long: the key binding's own age limit
# (chain.Expectation.max_key_binding_age_seconds), so neither outlives the other.
NONCE_TTL_SECONDS = 300
_log = structlog.get_logger("opgate.mandates")


@dataclass(frozen=True)
class Issuer:
    name: str
    tenants: frozenset[str]
    keys: dict[str, TrustedKey]  # kid -> key
    jwks: dict[str, Any]  # as configured: kept with each audit record
    payees: dict[str, str]  # AP2 payee.id -> provider


@dataclass(frozen=True)
class MandateTrust:
    """Who opgate trusts to sign mandates, and the key opgate signs its receipts with."""

    audience: str
    issuers: tuple[Issuer, ...]
    receipt_key: ECKey

    def for_tenant(self, tenant: str) -> tuple[dict[str, TrustedKey], dict[str, Issuer]]:
        keys: dict[str, TrustedKey] = {}
        by_name: dict[str, Issuer] = {}
        for issuer in self.issuers:
            if tenant in issuer.tenants:
                keys.update(issuer.keys)
                by_name[issuer.name] = issuer
        return keys, by_name


MANDATE_TRUST = web.AppKey("opgate_mandate_trust", MandateTrust)
# the fields kept_presentation records (null when the payment mandate did not split)
_KEPT_FIELDS = ("digest", "open_digest", "reference", "issuer", "presentation", "issuer_jwks")


def load_mandate_trust(settings: Settings) -> MandateTrust | None:
    """The trust settings name, keys read once (None: no issuer, mandates not accepted)."""
    if not settings.mandate_issuers or settings.receipt_key_file is None:
        return None
    key = ECKey.import_key(json.loads(settings.receipt_key_file.read_text("utf-8")))
    issuers = tuple(_issuer(config) for config in settings.mandate_issuers)
    return MandateTrust(settings.mandate_audience, issuers, key)


def _issuer(config: MandateIssuerConfig) -> Issuer:
    jwks = config.jwks
    if jwks is None:
        assert config.jwks_file is not None
        jwks = json.loads(Path(config.jwks_file).read_text("utf-8"))
    keys = {
        k["kid"]: TrustedKey(
            config.name, {n: v for n, v in k.items() if n in ("kty", "crv", "x", "y")}
        )
        for k in jwks.get("keys", [])
        if isinstance(k, dict) and isinstance(k.get("kid"), str)
    }
    return Issuer(config.name, frozenset(config.tenants), keys, jwks, dict(config.payees))


class Presentation(BaseModel):
    """The body of ``POST /_opgate/v1/mandates``: the mandate, and the provider call it pays."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mandate: Annotated[str, Field(min_length=1, max_length=64 * 1024)]
    # AP2's Checkout Mandate of the checkout this payment pays: when given, the payment's
    # transaction_id must be its checkout_hash (and payment.reference its open checkout's)
    checkout_mandate: Annotated[str | None, Field(min_length=1, max_length=64 * 1024)] = None
    provider: Annotated[str, Field(min_length=1, max_length=128)]
    action: Annotated[str, Field(min_length=1, max_length=128)]
    path_params: dict[str, str] = Field(default_factory=dict)
    params: dict[str, JsonValue] = Field(default_factory=dict)


def mandate_digest(issuer_signed_jwt: str) -> str:
    """A mandate's identity, as a digest: ``mandate_identity(...).digest``."""
    return mandate_identity(issuer_signed_jwt).digest


def kept_presentation(
    text: str, keys: dict[str, TrustedKey], issuers: dict[str, Issuer]
) -> dict[str, Any] | None:
    """What the audit record keeps of one presentation, accepted or refused: its digests, AP2's
    reference, the presentation as received, and the issuer its ``kid`` names with that issuer's
    JWKS as then configured (null for a kid no issuer of the tenant holds). Read before anything
    is verified, so that a refusal keeps it too; None if the text does not split as one."""
    parts = presented_parts(text)
    if parts is None:
        return None
    trusted = None if parts.kid is None else keys.get(parts.kid)
    issuer = None if trusted is None else issuers[trusted.issuer]
    chained = parts.closed_jwt != parts.root_jwt
    return {
        "digest": mandate_digest(parts.closed_jwt),
        "open_digest": mandate_digest(parts.root_jwt) if chained else None,
        "reference": parts.reference,
        "issuer": None if issuer is None else issuer.name,
        "presentation": text,
        "issuer_jwks": None if issuer is None else issuer.jwks,
    }


def _operation_id(digest: str) -> str:
    return "ap2_" + hashlib.sha256(digest.encode("ascii")).hexdigest()[:32]


def _refuse(
    record: AuditRecord,
    trust: MandateTrust | None,
    reason: Reason,
    detail: str,
    reference: str | None = None,
    **extra: Any,
) -> web.Response:
    record.decision, record.reason = Decision.DENY, reason.value
    if trust is not None:
        claims = receipt_claims(
            issuer=trust.audience,
            now=int(time.time()),
            reference=reference,
            refusal=(reason.value, REASONS[reason].title),
        )
        extra["receipt"] = sign_receipt(trust.receipt_key, claims)
    return problem_response(reason, detail, extra=extra or None)


_CODES = {
    MandateCode.INVALID: Reason.MANDATE_INVALID,
    MandateCode.MISMATCH: Reason.MANDATE_MISMATCH,
    MandateCode.CONSTRAINT_FAILED: Reason.MANDATE_CONSTRAINT_FAILED,
}


def _verified(
    text: str, keys: dict[str, TrustedKey], expect: Expectation
) -> VerifiedMandate | Refused:
    try:
        return verify_presentation(text, keys, expect)
    except IssuerUnknown as exc:
        return Refused(Reason.MANDATE_ISSUER_UNKNOWN, str(exc))
    except SdJwtExpired as exc:
        return Refused(Reason.MANDATE_EXPIRED, str(exc))
    except ClaimWithheld as exc:
        # the claim's path is the mandate's own text: kept short, never the disclosed value
        return Refused(Reason.MANDATE_INVALID, str(exc), {"claim": exc.claim[:200]})
    except SdJwtInvalid as exc:
        return Refused(Reason.MANDATE_INVALID, str(exc))


@dataclass(frozen=True, slots=True)
class PresentedCheckout:
    verified: VerifiedMandate
    binding: CheckoutBinding


def _checkout(
    text: str | None,
    keys: dict[str, TrustedKey],
    expect: Expectation,
    payment: VerifiedMandate,
) -> PresentedCheckout | Refused | None:
    """The Checkout Mandate presented with the payment, verified as the payment is (a
    trusted issuer, key binding for opgate) and read by ``checkout_of``; None if none was."""
    if text is None:
        return None
    verified = _verified(text, keys, expect)
    if isinstance(verified, Refused):
        return Refused(verified.reason, f"the checkout mandate: {verified.detail}", verified.named)
    if None not in (payment.nonce, verified.nonce) and payment.nonce != verified.nonce:
        # one presentation answers one challenge: both key bindings name the same nonce
        return Refused(
            Reason.MANDATE_INVALID, "the payment and checkout mandates answer different nonces"
        )
    binding = checkout_of(verified)
    if isinstance(binding, MandateRefusal):
        return Refused.of(binding)
    return PresentedCheckout(verified, binding)


async def _present(
    gw: Gateway, request: web.Request, agent: Agent, record: AuditRecord
) -> web.Response:
    record.rule = MANDATE_RULE
    trust = request.app.get(MANDATE_TRUST)
    if trust is None:
        return _refuse(record, None, Reason.MANDATES_NOT_SUPPORTED, "no mandate issuer is set")
    raw = await read_agent_body(gw, request)
    if isinstance(raw, tuple):
        return _refuse(record, trust, *raw)
    try:
        presentation = Presentation.model_validate(parse_json_object(raw))
    except (BodyRejected, ValidationError) as exc:
        errors = validation_errors(exc) if isinstance(exc, ValidationError) else [str(exc)]
        return _refuse(record, trust, Reason.MANDATE_INVALID, "not a presentation", errors=errors)
    keys, issuers = trust.for_tenant(agent.tenant)
    # kept before anything is verified: a refusal is answered for with its evidence too
    kept = kept_presentation(presentation.mandate, keys, issuers)
    kept_checkout = None
    if presentation.checkout_mandate is not None:
        kept_checkout = kept_presentation(presentation.checkout_mandate, keys, issuers)
    if kept is not None or kept_checkout is not None:
        record.mandate = {**(kept or dict.fromkeys(_KEPT_FIELDS)), "checkout": kept_checkout}
    reference = None if kept is None else kept["reference"]
    now = int(time.time())
    expect = Expectation(trust.audience, now)
    verified = _verified(presentation.mandate, keys, expect)
    if isinstance(verified, Refused):
        return _refuse(record, trust, verified.reason, verified.detail, reference, **verified.named)
    issuer = issuers[verified.issuer]
    closed_id = mandate_identity(verified.closed_jwt)
    open_id = None if verified.closed is None else mandate_identity(verified.root_jwt)
    checkout = _checkout(presentation.checkout_mandate, keys, expect, verified)
    if isinstance(checkout, Refused):
        return _refuse(
            record, trust, checkout.reason, checkout.detail, verified.reference, **checkout.named
        )
    terms = terms_of(
        verified, datetime.now(UTC).date(), None if checkout is None else checkout.binding
    )
    if isinstance(terms, MandateRefusal):
        refused = Refused.of(terms)
        return _refuse(
            record, trust, refused.reason, refused.detail, verified.reference, **refused.named
        )
    if issuer.payees.get(terms.payee_id) != presentation.provider:
        return _refuse(
            record,
            trust,
            Reason.MANDATE_MISMATCH,
            f"the mandate's payee is not paid through provider {presentation.provider}",
            verified.reference,
            field="payee",
        )
    params = _approved_params(gw, presentation, terms)
    if isinstance(params, Refused):
        return _refuse(
            record, trust, params.reason, params.detail, verified.reference, **params.named
        )
    spellings = [*closed_id.spellings, *(open_id.spellings if open_id else ())]
    if await MandateStore(gw.store).revoked(spellings):
        return _refuse(record, trust, Reason.MANDATE_REVOKED, "revoked", verified.reference)
    digest, open_digest = await _keyed_as(gw, closed_id, open_id)
    planned = _plan(gw, agent, presentation, terms, params, digest, open_digest)
    if isinstance(planned, list):
        record.provider = (
            presentation.provider if gw.policy.provider_named(presentation.provider) else None
        )
        return _refuse(
            record,
            trust,
            Reason.APPROVAL_NOT_SENDABLE,
            "; ".join(planned),
            verified.reference,
            errors=planned,
        )
    record.provider, record.operation_id = planned.provider, planned.operation_id
    nonce = verified.nonce or (None if checkout is None else checkout.verified.nonce)
    if nonce is not None and not valid_id(nonce, IdKind.NONCE):  # not one opgate issued
        detail = id_rule(IdKind.NONCE)
        return _refuse(record, trust, Reason.MANDATE_NONCE_UNKNOWN, detail, verified.reference)
    nonce_use = None if nonce is None else NonceUse(nonce, agent.tenant, agent.agent_id)
    created = await _create(gw, planned, terms, open_id, nonce_use)
    if isinstance(created, Refused):
        return _refuse(record, trust, created.reason, created.detail, verified.reference)
    op, status = created
    record.status_after = op.status.value
    claims = receipt_claims(
        issuer=trust.audience, now=now, reference=verified.reference, operation=op.to_public()
    )
    body = {
        "mandate_digest": digest,
        "operation": recovery_view(gw, op),
        "receipt": sign_receipt(trust.receipt_key, claims),
    }
    return web.json_response(body, status=status)


def _approved_params(
    gw: Gateway, presentation: Presentation, terms: MandateTerms
) -> dict[str, Any] | Refused:
    """The operation's params: the mandate's payee, instrument and reference where the policy
    rule says the call carries them (``mandate``). A call whose rule names none cannot carry
    the payee the person approved, and is refused rather than approved loosely. An unknown
    provider or action is left to the plan, which names it."""
    provider = gw.policy.provider_named(presentation.provider)
    rule = None if provider is None else provider.rule_named(presentation.action)
    if rule is None:
        return dict(presentation.params)
    if rule.x402 is not None:
        return _x402_params(gw, presentation, terms)
    if rule.mandate is None:
        return Refused(
            Reason.APPROVAL_NOT_SENDABLE,
            f"rule {rule.name} names no parameter that carries a mandate's payee (its policy's "
            "`mandate`): a payment mandate cannot approve it",
        )
    params = approved_params(
        terms, rule.mandate.carried(), presentation.params, rule.mandate.absent
    )
    return Refused.of(params) if isinstance(params, MandateRefusal) else params


def _x402_params(
    gw: Gateway, presentation: Presentation, terms: MandateTerms
) -> dict[str, Any] | Refused:
    """An x402 call's payment terms from the mandate (docs/mandates.md, "Paying an x402 API"):
    its payee as the payee, its amount converted exactly through the payments file's peg of the
    asset and network the agent names; no peg: not sendable (fail closed)."""
    asset = presentation.params.get("x402_asset")
    network = presentation.params.get("x402_network")
    if not isinstance(asset, str) or not isinstance(network, str):
        return Refused(
            Reason.APPROVAL_NOT_SENDABLE,
            "an x402 call approved by a mandate names its x402_asset and x402_network in params",
        )
    peg = gw.policy.x402_limits.peg(network, asset)
    if peg is None:
        return Refused(
            Reason.APPROVAL_NOT_SENDABLE,
            f"asset {asset} on {network} has no peg to a currency in the payments file: a "
            "mandate's amount cannot be paid in it",
        )
    params = x402_approved_params(
        terms, presentation.params, to_atomic(peg, terms.amount, terms.currency)
    )
    return Refused.of(params) if isinstance(params, MandateRefusal) else params


async def _keyed_as(
    gw: Gateway, closed: MandateIdentity, open_mandate: MandateIdentity | None
) -> tuple[str, str | None]:
    """The digests the mandate's operation is keyed by (its closed mandate's, its open
    mandate's): its identities, unless it was approved under its twin's digest (by a release
    that keyed a mandate by its text as presented), whose operation is then the one answered."""
    open_digest = None if open_mandate is None else open_mandate.digest
    before = await gw.store.load(_operation_id(closed.twin))
    if before is None or not before.approval_ref.startswith("ap2:"):
        return closed.digest, open_digest
    _, _, named_open = before.approval_ref.partition(";open:")
    if open_mandate is not None and named_open in open_mandate.spellings:
        open_digest = named_open
    return closed.twin, open_digest


def _plan(
    gw: Gateway,
    agent: Agent,
    presentation: Presentation,
    terms: MandateTerms,
    params: dict[str, Any],
    digest: str,
    open_digest: str | None,
) -> NewOperation | list[str]:
    now = datetime.now(UTC)
    expires = now + _LONGEST_APPROVAL
    if terms.expires_at is not None:
        expires = min(expires, datetime.fromtimestamp(terms.expires_at, UTC))
    provider = gw.policy.provider_named(presentation.provider)
    rule = None if provider is None else provider.rule_named(presentation.action)
    # an x402 call carries the mandate's amount as its payment's maximum (x402_max_amount), and
    # the payment kept is what counts against an open mandate's budget (proxy/store/x402.py)
    x402 = rule is not None and rule.x402 is not None
    if rule is not None and rule.amount is None and not x402:
        return [f"rule {rule.name} reads no amount: a payment mandate cannot approve it"]
    if (
        rule is not None
        and rule.currency is None
        and not x402
        and not (provider and provider.budgets)
    ):
        # the currency the person approved could not be compared with what is sent
        return [f"rule {rule.name} reads no currency: a payment mandate cannot approve it"]
    try:
        approval = OperationRequest(
            operation_id=_operation_id(digest),
            tenant=agent.tenant,
            agent_id=agent.agent_id,
            provider=presentation.provider,
            action=presentation.action,
            path_params=presentation.path_params,
            amount=None if x402 else terms.amount,
            currency=None if x402 else terms.currency,
            params=params,
            idempotency_key="ap2k_" + hashlib.sha256(digest.encode()).hexdigest()[:40],
            approval_ref=f"ap2:{digest}" + (f";open:{open_digest}" if open_digest else ""),
            approved_by=f"{terms.issuer}:{terms.subject}"[:256],
            expires_at=expires,
        )
    except ValidationError as exc:
        return validation_errors(exc)
    return plan_operation(approval, gw.policy, now)


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a presentation approves nothing: the code, a sentence, and the field or the
    constraint it names (``mandate_mismatch``, ``mandate_constraint_failed``)."""

    reason: Reason
    detail: str
    named: dict[str, str] = field(default_factory=dict)

    @classmethod
    def because(cls, reason: Reason) -> Refused:
        return cls(reason, REASONS[reason].title)

    @classmethod
    def of(cls, refusal: MandateRefusal) -> Refused:
        named = {"field": refusal.field} if refusal.field else {}
        named |= {"constraint": refusal.constraint} if refusal.constraint else {}
        return cls(_CODES[refusal.code], refusal.detail, named)


_NONCE_REFUSALS = {
    NonceRefused.UNKNOWN: Refused(
        Reason.MANDATE_NONCE_UNKNOWN,
        "the key binding's nonce is not one opgate issued to this agent",
    ),
    NonceRefused.EXPIRED: Refused(Reason.MANDATE_NONCE_UNKNOWN, "the key binding's nonce expired"),
    NonceRefused.USED: Refused(
        Reason.MANDATE_NONCE_USED,
        "the key binding's nonce already answered another presentation",
    ),
}


async def _create(
    gw: Gateway,
    planned: NewOperation,
    terms: MandateTerms,
    open_mandate: MandateIdentity | None,
    nonce: NonceUse | None,
) -> tuple[Operation, int] | Refused:
    """The operation (created: 201; the mandate's earlier one: 200), or why not (a reason and
    its sentence). The nonce is consumed in the transaction that creates the row."""
    actor = planned.approved_by
    limits = None
    if terms.open_use is not None and open_mandate is not None:
        limits = OpenMandateLimits(
            open_mandate.spellings,
            terms.open_use.allows,
            budget_max=terms.open_use.budget_max,
            currency=terms.currency,
            paid_in_minor=lambda paid: paid_in_minor(gw.policy.x402_limits, paid, terms.currency),
        )
    try:
        outcome = await MandateStore(gw.store).create(planned, actor, nonce=nonce, limits=limits)
        if isinstance(outcome, OpenMandateUsed):
            return Refused.because(Reason.MANDATE_EXHAUSTED)
        if isinstance(outcome, NonceRefused):
            return _NONCE_REFUSALS[outcome]
        created = outcome
    except IdempotencyKeyInUse:
        # The key is the mandate's own (derived from its digest): another presentation of the
        # same mandate inserted the row at this very moment. Two inserts of one row racing can
        # trip the key's unique index before ON CONFLICT (operation_id) sees the other; the row
        # read below is then that presentation's, and is compared like any replay.
        created = None
    except AlreadySuperseded:
        return Refused.because(Reason.MANDATE_MISMATCH)
    if created is not None:
        _log.info("mandate_operation_created", operation_id=created.operation_id)
        return created, 201
    existing = await gw.store.load(planned.operation_id)
    if existing is not None and same_approval(planned, existing):
        return existing, 200  # the same mandate again: the same operation, never a second
    return Refused.because(Reason.MANDATE_MISMATCH)


async def _issue_nonce(
    gw: Gateway, request: web.Request, agent: Agent, record: AuditRecord
) -> web.Response:
    """A fresh nonce for this agent's next key binding: AP2 has the verifier challenge the
    agent ("a Verifier challenges an Agent to provide proof"), and the challenge is opgate's to
    make so that a copied presentation cannot be replayed by anyone, on any replica."""
    record.rule = MANDATE_RULE
    trust = request.app.get(MANDATE_TRUST)
    if trust is None:
        return _refuse(record, None, Reason.MANDATES_NOT_SUPPORTED, "no mandate issuer is set")
    nonce = secrets.token_urlsafe(32)
    expires_at = await MandateStore(gw.store).issue_nonce(
        nonce, agent.tenant, agent.agent_id, NONCE_TTL_SECONDS
    )
    body = {"nonce": nonce, "audience": trust.audience, "expires_at": expires_at.isoformat()}
    return web.json_response(body, status=201)


async def _receipt(
    gw: Gateway, request: web.Request, agent: Agent, record: AuditRecord
) -> web.Response:
    record.rule = MANDATE_RULE
    trust = request.app.get(MANDATE_TRUST)
    if trust is None:
        return _refuse(record, None, Reason.MANDATES_NOT_SUPPORTED, "no mandate issuer is set")
    operation_id = path_operation_id(request, "operation_id")
    return await _where_it_stands(gw, trust, agent, record, operation_id)


class PresentedReceipt(BaseModel):
    """The body of ``POST /_opgate/v1/mandates/receipts``: a receipt opgate signed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    receipt: Annotated[str, Field(min_length=1, max_length=16 * 1024)]


async def _receipt_presented(
    gw: Gateway, request: web.Request, agent: Agent, record: AuditRecord
) -> web.Response:
    """A receipt opgate signed, presented back (the issue: "what a replacement agent presents
    to prove the operation ended"): opgate's own signature checked, the operation it names
    answered as it stands now, with a fresh receipt. The agent need not be the one that
    presented the mandate (it is replaced); the tenant must be the operation's."""
    record.rule = MANDATE_RULE
    trust = request.app.get(MANDATE_TRUST)
    if trust is None:
        return _refuse(record, None, Reason.MANDATES_NOT_SUPPORTED, "no mandate issuer is set")
    raw = await read_agent_body(gw, request)
    if isinstance(raw, tuple):
        return _refuse(record, None, *raw)
    try:
        presented = PresentedReceipt.model_validate(parse_json_object(raw))
        claims = read_receipt(trust.receipt_key, trust.audience, presented.receipt)
    except (BodyRejected, ValidationError, ReceiptInvalid) as exc:
        detail = str(exc) if isinstance(exc, ReceiptInvalid) else "not a receipt presentation"
        return _refuse(record, None, Reason.MANDATE_RECEIPT_INVALID, detail)
    # the reference opgate signed then: AP2's, of the presentation the operation was made from
    reference = claims.get("reference")
    return await _where_it_stands(
        gw, trust, agent, record, claims["operation_id"], reference=reference
    )


async def _where_it_stands(
    gw: Gateway,
    trust: MandateTrust,
    agent: Agent,
    record: AuditRecord,
    operation_id: str | None,
    *,
    reference: object = None,
) -> web.Response:
    """The operation a mandate approved, as it stands, with its current receipt (``reference``
    as given, else the mandate digest the operation's approval names)."""
    op = await gw.store.load(operation_id) if valid_id(operation_id, IdKind.OPERATION) else None
    if op is None or op.tenant != agent.tenant or not op.approval_ref.startswith("ap2:"):
        # the same answer for "absent", "not yours" and "not a mandate's"
        return _refuse(record, None, Reason.OPERATION_UNKNOWN, "no operation of a mandate")
    record.provider, record.operation_id = op.provider, op.operation_id
    record.status_after = op.status.value
    claims = receipt_claims(
        issuer=trust.audience,
        now=int(time.time()),
        reference=(
            reference
            if isinstance(reference, str)
            else op.approval_ref.removeprefix("ap2:").split(";", 1)[0]
        ),
        operation=op.to_public(),
    )
    settled = op.status in (Status.CONFIRMED, Status.FAILED)
    body = {
        "settled": settled,
        "operation": recovery_view(gw, op),
        "receipt": sign_receipt(trust.receipt_key, claims),
    }
    return web.json_response(body)


async def jwks(request: web.Request) -> web.Response:
    trust = request.app.get(MANDATE_TRUST)
    if trust is None:
        return problem_response(Reason.MANDATES_NOT_SUPPORTED, "no mandate issuer is set")
    return web.json_response(public_jwks(trust.receipt_key))


class MandateRevocation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    reason: str = Field(min_length=1, max_length=1000)


async def revoke_mandate(request: web.Request) -> web.Response:
    """Revoke a mandate by its digest: it approves nothing more; each operation it approved of
    which nothing has left is revoked too (one that left is the recovery protocol's)."""
    gateway = request.app[GATEWAY]
    digest = path_id(request, IdKind.MANDATE, "digest")
    if digest is None:
        return admin_problem(400, "invalid_request", id_rule(IdKind.MANDATE))
    try:
        revocation = MandateRevocation.model_validate(await read_document(request))
    except ValidationError as exc:
        return admin_problem(
            400, "invalid_request", "a reason is required", errors=validation_errors(exc)
        )
    operation_ids = await MandateStore(gateway.store).revoke(digest, "admin", revocation.reason)
    revoked = []
    for operation_id in operation_ids:
        if await gateway.store.revoke(operation_id, revocation.reason, actor="admin"):
            revoked.append(operation_id)
    _log.info("mandate_revoked", digest=digest, operations=revoked)
    return web.json_response({"digest": digest, "operations": operation_ids, "revoked": revoked})


# admitted under the agent's request limits: a presentation writes an operation (or, refused,
# an audit record keeping the presentation), which an agent may not flood
present_mandate = recorded(_present, rate_limited=True)
read_receipt_now = recorded(_receipt)
receipt_presented = recorded(_receipt_presented)
# admitted under the agent's request limits: each nonce is a row until it is pruned
issue_nonce = recorded(_issue_nonce, rate_limited=True)


def add_agent_mandate_routes(app: web.Application, settings: Settings) -> None:
    trust = load_mandate_trust(settings)
    if trust is not None:
        app[MANDATE_TRUST] = trust
    app.router.add_post(MANDATES_PREFIX, present_mandate)
    app.router.add_post(MANDATES_PREFIX + "/nonces", issue_nonce)
    app.router.add_get(MANDATES_PREFIX + "/{operation_id}/receipt", read_receipt_now)
    app.router.add_post(MANDATES_PREFIX + "/receipts", receipt_presented)
    app.router.add_get(JWKS_PATH, jwks)


def add_ops_mandate_routes(app: web.Application) -> None:
    app.router.add_post("/v1/mandates/{digest}/revoke", revoke_mandate)
