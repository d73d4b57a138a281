"""The policy file format, version 1: one YAML file per provider.

Parsed by pydantic with ``extra="forbid"`` everywhere, so a typo is an error, not a silently
ignored key. The platform team edits these files; opgate never writes them.
"""

from __future__ import annotations

import re
import string
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    GetJsonSchemaHandler,
    Tag,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from proxy.policy import expressions
from proxy.policy.amounts import AmountFormat
from proxy.policy.budgets import Budget, RateLimits, no_duplicate_budgets
from proxy.policy.paths import PathPattern

_NAME = r"^[a-z][a-z0-9_.-]*$"
_SECRET_NAME = r"^[a-z][a-z0-9_]*$"  # noqa: S105  (the grammar of a secret's name)
_STATUS_SPEC = re.compile(r"^[1-5]xx$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BodyKind(StrEnum):
    FORM = "form"  # application/x-www-form-urlencoded, Stripe-style bracket keys
    JSON = "json"  # application/json; fields are JSON pointers
    NONE = "none"  # no body allowed (reads)


class OperationRequirement(StrEnum):
    REQUIRED = "required"
    NONE = "none"  # only for non-mutating calls: forwarded without an operation, still audited


class Mode(StrEnum):
    """``report`` (shadow mode) forwards what a payload check would deny and audits
    ``would_deny``; identity and state checks always apply (see checks.RELAXED_IN_REPORT_MODE)."""

    ENFORCE = "enforce"
    REPORT = "report"


# Rule paths are parsed into a PathPattern; in the JSON Schema (editors) they are strings.
_PATH_SCHEMA = WithJsonSchema(
    {
        "type": "string",
        "pattern": r"^(/([A-Za-z0-9_.~-]+|\{[a-z_][a-z0-9_]*(\.\.\.)?\}))+$",
        "description": "/v1/refunds, /v1/charges/{charge}/capture, /v1/{rest...}",
    }
)


class CredentialInjection(Strict):
    """How opgate authenticates to the provider with a static secret: a bearer token
    (``Authorization: Bearer ...``), HTTP Basic (``scheme: Basic``, the secret being the base64
    of ``user:password``, as Twilio takes it) or a provider API-key header (``X-API-Key: ...``
    with ``scheme: null``). The secret's value never lives in a policy: ``secret`` names it, and
    it is read from ``OPGATE_SECRET_<NAME>`` or the secrets directory."""

    kind: Literal["static"] = "static"
    header: str = "Authorization"
    scheme: str | None = "Bearer"
    secret: Annotated[str, Field(pattern=_SECRET_NAME)]


class OAuth2ClientCredentials(Strict):
    """OAuth 2.0 client credentials (RFC 6749 section 4.4): opgate asks ``token_url`` for an
    access token with the client id and the secret named ``secret``, caches it until
    ``refresh_before_seconds`` before it expires, and sends ``Authorization: Bearer <token>``.
    The token is opgate's alone: agents never see it, and a token endpoint that fails makes the
    request fail closed (credential_unavailable), never leave unauthenticated."""

    kind: Literal["oauth2_client_credentials"]
    # absolute, or a path on the provider's upstream (so an upstream override moves it too)
    token_url: Annotated[str, Field(pattern=r"^(https?://[^/?#]+)?/[^?#]*$")]
    client_id: Annotated[str, Field(min_length=1)] | None = None
    # or the name of a secret holding it, so that one policy serves every deployment
    client_id_secret: Annotated[str, Field(pattern=_SECRET_NAME)] | None = None
    secret: Annotated[str, Field(pattern=_SECRET_NAME)]  # the client secret's name
    scope: str | None = None
    # client_secret_basic (RFC 6749 2.3.1, PayPal's way) or client_secret_post (in the form)
    client_auth: Literal["client_secret_basic", "client_secret_post"] = "client_secret_basic"
    refresh_before_seconds: Annotated[float, Field(ge=0, le=3600)] = 60.0
    header: str = "Authorization"
    scheme: str | None = "Bearer"

    @model_validator(mode="after")
    def _one_client_id(self) -> OAuth2ClientCredentials:
        if (self.client_id is None) == (self.client_id_secret is None):
            raise ValueError("give exactly one of client_id and client_id_secret")
        return self


def _credential_kind(value: object) -> str:
    if isinstance(value, dict):
        return str(value.get("kind", "static"))
    return str(getattr(value, "kind", "static"))


Credential = Annotated[
    Annotated[CredentialInjection, Tag("static")]
    | Annotated[OAuth2ClientCredentials, Tag("oauth2_client_credentials")],
    Discriminator(_credential_kind),
]


class ErrorDialect(StrEnum):
    """The shape of opgate's refusals on this provider's route: problem+json, or the
    provider's own error body, so that its SDK raises its own typed error with opgate's code."""

    PROBLEM = "problem"
    STRIPE = "stripe"
    PAYPAL = "paypal"
    SQUARE = "square"
    ADYEN = "adyen"


class Idempotency(Strict):
    """Where the idempotency key travels, and what the provider does with it. The key names
    the operation (an agent may send the key alone), must equal the approved one
    (idempotency_key_mismatch), and is set by opgate where it goes: in ``header`` (any name;
    ``null``: opgate adds none), in the body at ``body_field`` (a form key or a JSON pointer,
    Square's ``/idempotency_key``), or both.

    Neither (``idempotency: none``, or ``header: null`` alone): the provider takes no key (an
    SMS API, an issue tracker). opgate sends none, agents name operations by
    ``X-Operation-Id``, and an unknown outcome is never re-sent on the key's strength."""

    header: str | None = "Idempotency-Key"
    body_field: str | None = None
    # The provider's limits on a key, checked when an approval is created (approval_not_sendable)
    # so that no approved key is refused by the provider after the claim (Adyen: 64).
    max_length: Annotated[int, Field(ge=1, le=255)] | None = None
    # A regex character class of the characters the provider accepts, e.g. "A-Za-z0-9_-".
    characters: Annotated[str, Field(min_length=1)] | None = None
    # True only if the provider returns the first answer for a repeated key instead of acting
    # twice: then an attempt whose outcome is unknown may be re-sent with the same key.
    provider_deduplicates: bool = False
    # How long the provider keeps a key (Stripe: 24 h). An approval may not outlive it, and
    # after it a re-send is treated as on a provider that does not deduplicate. None: the
    # provider publishes no window, so deduplication is never relied on past the first send.
    retention_seconds: Annotated[float, Field(gt=0)] | None = None

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The object, or ``none`` (editors then accept what the model does)."""
        described = handler.resolve_ref_schema(handler(core_schema))
        return {
            "anyOf": [
                {k: v for k, v in described.items() if k not in ("description", "title")},
                {"const": "none", "description": "the provider takes no idempotency key"},
            ],
            "title": described.get("title", cls.__name__),
            "description": described.get("description", ""),
        }

    @model_validator(mode="before")
    @classmethod
    def _none(cls, value: object) -> object:
        """``idempotency: none``: the provider takes no key (no header, no body field)."""
        return {"header": None} if value == "none" else value

    @model_validator(mode="after")
    def _placed(self) -> Idempotency:
        if not self.takes_key:
            # What a provider does with a key means nothing where it takes none: said, so
            # that nobody believes a re-send is deduplicated.
            described = ("provider_deduplicates", "retention_seconds", "max_length", "characters")
            given = [name for name in described if getattr(self, name) not in (None, False)]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: the provider takes no key (idempotency: none, or "
                    "header: null without a body_field), so there is nothing to describe"
                )
        if self.characters is not None:
            try:
                re.compile(f"[{self.characters}]+")
            except re.error as exc:
                raise ValueError(f"characters {self.characters!r}: not a character class") from exc
        return self

    @property
    def takes_key(self) -> bool:
        """Whether the provider reads a key at all (in a header, the body, or both)."""
        return self.header is not None or self.body_field is not None

    def key_problem(self, key: str) -> str | None:
        """Why the provider would refuse ``key``; None if it fits its documented limits."""
        if self.max_length is not None and len(key) > self.max_length:
            return (
                f"the idempotency key is {len(key)} characters, the provider takes at most "
                f"{self.max_length}"
            )
        if self.characters is not None and not re.fullmatch(f"[{self.characters}]+", key):
            return f"the idempotency key holds characters outside [{self.characters}]"
        return None

    @model_validator(mode="after")
    def _retention_declared(self) -> Idempotency:
        if self.provider_deduplicates and self.retention_seconds is None:
            raise ValueError(
                "provider_deduplicates: true needs retention_seconds (how long the provider "
                "keeps a key: a re-send after it is not deduplicated)"
            )
        return self

    @property
    def dedup_window_seconds(self) -> float | None:
        """How long after an operation's creation a re-send with its key is deduplicated by
        the provider; None: never relied on."""
        return self.retention_seconds if self.provider_deduplicates else None


class FormFieldInjection(Strict):
    kind: Literal["form_field"]
    field: str  # e.g. metadata[operation_id]


class JsonPointerInjection(Strict):
    kind: Literal["json_pointer"]
    pointer: Annotated[str, Field(pattern=r"^(/[^/]+)+$")]  # e.g. /metadata/operation_id


MetadataInjection = Annotated[
    FormFieldInjection | JsonPointerInjection, Field(discriminator="kind")
]


class Timeouts(Strict):
    connect_seconds: Annotated[float, Field(gt=0, le=60)] = 5.0
    total_seconds: Annotated[float, Field(gt=0, le=600)] = 30.0


class Limits(Strict):
    max_request_body_bytes: Annotated[int, Field(gt=0, le=16 * 1024 * 1024)] = 64 * 1024
    max_response_body_bytes: Annotated[int, Field(gt=0, le=64 * 1024 * 1024)] = 1024 * 1024


StatusSpec = int | str


def _status_matches(spec: StatusSpec, status: int) -> bool:
    if isinstance(spec, int):
        return spec == status
    return status // 100 == int(spec[0])


class Classification(Strict):
    """How a provider's answer settles the operation. Whatever matches neither list is
    *unknown*: the row stays dispatched. Never list a status as failed unless the provider
    guarantees that answer means no effect."""

    confirmed: list[StatusSpec] = Field(default_factory=lambda: list[StatusSpec](["2xx"]))
    failed: list[StatusSpec] = Field(default_factory=list)
    object_id: str | None = "/id"  # JSON pointer into a confirmed answer

    @field_validator("confirmed", "failed")
    @classmethod
    def _valid_specs(cls, specs: list[StatusSpec]) -> list[StatusSpec]:
        for spec in specs:
            if isinstance(spec, int) and not 100 <= spec <= 599:
                raise ValueError(f"{spec} is not an HTTP status")
            if isinstance(spec, str) and not _STATUS_SPEC.match(spec):
                raise ValueError(f"{spec!r} is neither a status nor a class like '2xx'")
        return specs

    @model_validator(mode="after")
    def _disjoint(self) -> Classification:
        for status in range(100, 600):
            if self.is_confirmed(status) and self.is_failed(status):
                raise ValueError(f"status {status} is both confirmed and failed")
        return self

    def is_confirmed(self, status: int) -> bool:
        return any(_status_matches(spec, status) for spec in self.confirmed)

    def is_failed(self, status: int) -> bool:
        return any(_status_matches(spec, status) for spec in self.failed)


class ReconcileLookup(Strict):
    """One way to ask the provider whether an operation's effect exists.

    ``path`` and ``query`` values are templates over the operation's approved ``params`` and
    ``path_params`` (``{charge}``); a lookup whose names the operation lacks is skipped. The
    effect is the item (of the list at ``items``, or the answer itself when ``items`` is null)
    whose ``match`` pointer equals the operation id (opgate injected it as metadata)."""

    path: Annotated[str, Field(pattern=r"^/")]
    query: dict[str, str] = Field(default_factory=dict)
    items: str | None = "/data"
    match: str = "/metadata/operation_id"
    # true at this pointer means the list is incomplete: absence then proves nothing
    has_more: str | None = "/has_more"
    # Only if the provider's list is authoritative and complete for this lookup may "not found"
    # settle the operation as failed with no effect.
    absence_is_conclusive: bool = False


class Reconcile(Strict):
    lookups: Annotated[list[ReconcileLookup], Field(min_length=1)]
    # After the last attempt ended (or its lease ran out), how long a straggling request may
    # still land at the provider: absence is only conclusive after this.
    grace_seconds: Annotated[float, Field(ge=0, le=86400)] = 30.0
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 5
    retry_seconds: Annotated[float, Field(gt=0, le=86400)] = 10.0
    # An escalated operation is still looked up, at this lower rate: an effect the provider
    # shows settles it (the humans are told); absence leaves it with them.
    escalated_retry_seconds: Annotated[float, Field(gt=0, le=86400)] = 300.0


class PreconditionLookup(Strict):
    """One provider lookup and what its answer must still show before the operation is sent.

    ``path`` and ``query`` are templates like a reconcile lookup's (approved ``params``,
    ``path_params``, ``operation_id``); a lookup whose names the operation lacks is skipped.
    Each ``require`` is an assertion in the expression form (proxy/policy/expressions.py):
    JSON pointers into the answer, literals and ``approved.<field>``, e.g.
    ``/amount_refunded + approved.amount <= /amount``. All must hold."""

    path: Annotated[str, Field(pattern=r"^/")]
    query: dict[str, str] = Field(default_factory=dict)
    require: Annotated[list[str], Field(min_length=1)]

    @field_validator("require")
    @classmethod
    def _parsed(cls, require: list[str]) -> list[str]:
        errors = []
        for text in require:
            try:
                expressions.parse(text)
            except expressions.ExpressionError as exc:
                errors.append(f"{text!r}: {exc}")
        if errors:
            raise ValueError("; ".join(errors))
        return require

    def assertions(self) -> list[expressions.Assertion]:
        return [expressions.parse(text) for text in self.require]


def _template_names(lookup: PreconditionLookup) -> set[str]:
    """The names a lookup's path and query templates use."""
    names: set[str] = set()
    for template in (lookup.path, *lookup.query.values()):
        try:
            names |= {name for _, name, _, _ in string.Formatter().parse(template) if name}
        except ValueError as exc:
            raise ValueError(f"precondition lookup template {template!r}: {exc}") from exc
    return names


class Preconditions(Strict):
    """What must still be true at the provider before this rule's operation is first sent:
    the approval is evidence of what was decided then, not of the world now. Checked before
    the first send of an approval older than ``recheck_after_seconds`` (0: always), and always
    before a superseding operation's first send (see proxy/gate/preconditions.py)."""

    lookups: Annotated[list[PreconditionLookup], Field(min_length=1)]
    recheck_after_seconds: Annotated[float, Field(ge=0, le=86400 * 30)] = 0.0


class MandateParams(Strict):
    """Which request parameters of this call carry what a person's payment mandate (AP2,
    docs/mandates.md) approves besides the amount and currency: ``payee`` the mandate's
    ``payee.id`` (``account``: no parameter does, the payee is the provider account opgate's
    credential acts for, a direct payment), ``payment_instrument`` its
    ``payment_instrument.id``, ``reference`` its ``transaction_id`` (the merchant's checkout
    reference). ``absent``: parameters that would pay someone else (a connected account), left
    absent. Each is one of the rule's ``params``; an operation a mandate creates approves these
    values, so the agent cannot choose them. A rule without ``mandate`` cannot be approved by a
    mandate: its payee could not be expressed."""

    payee: Annotated[str, Field(min_length=1)]
    payment_instrument: str | None = None
    reference: str | None = None
    absent: list[str] = Field(default_factory=list)

    def carried(self) -> dict[str, str]:
        """The parameter carrying each of payee, payment_instrument and reference named."""
        named = {
            "payee": None if self.payee == PAYEE_IS_ACCOUNT else self.payee,
            "payment_instrument": self.payment_instrument,
            "reference": self.reference,
        }
        return {what: param for what, param in named.items() if param is not None}


# MandateParams.payee for a direct payment: the payee is the account the credential acts for
PAYEE_IS_ACCOUNT = "account"


class X402Payment(Strict):
    """This call's upstream may answer 402 with x402 v2 (``PAYMENT-REQUIRED``), paid once per
    operation (docs/x402.md). ``payer: opgate`` (the default): opgate pays with the wallet
    whose private key is the secret ``wallet_secret`` (read like a provider credential's, never
    from a policy); the agent holds no key. ``payer: agent``: the agent's own
    ``PAYMENT-SIGNATURE`` is checked against the approval and bound to the operation by its
    nonce. Either way by one of ``schemes`` on one of ``networks`` (CAIP-2) in one of
    ``assets`` (token contracts). ``chain_rpc_secret``: the secret holding a JSON-RPC URL of
    the network's chain, where reconciliation reads an unknown payment's nonce state
    (``authorizationState``); ``expiry_margin_seconds`` after its validBefore, an unused nonce
    proves the payment unpaid. What one operation may pay (resource, maximum amount, asset,
    network, payee) is approved per operation, in its params named by ``X402_TERMS``."""

    payer: Literal["opgate", "agent"] = "opgate"
    wallet_secret: Annotated[str, Field(pattern=_SECRET_NAME)] | None = None
    chain_rpc_secret: Annotated[str, Field(pattern=_SECRET_NAME)] | None = None
    # After an authorization's validBefore, how long until its unused nonce proves it unpaid
    # (the chain's block time and a node answering from an older block; docs/x402.md)
    expiry_margin_seconds: Annotated[int, Field(ge=0, le=3600)] = 120
    schemes: Annotated[list[Literal["exact"]], Field(min_length=1)] = Field(
        default_factory=lambda: list[Literal["exact"]](["exact"])
    )
    networks: Annotated[
        list[Annotated[str, Field(pattern=r"^eip155:[1-9][0-9]{0,17}$")]], Field(min_length=1)
    ]
    assets: Annotated[
        list[Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{40}$")]], Field(min_length=1)
    ]

    @model_validator(mode="after")
    def _wallet_only_where_opgate_pays(self) -> X402Payment:
        if self.payer == "opgate" and self.wallet_secret is None:
            raise ValueError("x402 with `payer: opgate` needs `wallet_secret`")
        if self.payer == "agent" and self.wallet_secret is not None:
            raise ValueError("x402 with `payer: agent` has no `wallet_secret`: the agent signs")
        return self


# The approved params of an operation whose rule declares ``x402``: what it may pay. They are
# terms of the payment, not fields of the request, so they are approved without being sent.
X402_TERMS = ("x402_resource", "x402_max_amount", "x402_asset", "x402_network", "x402_pay_to")


class Rule(Strict):
    name: Annotated[str, Field(pattern=_NAME)]
    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
    path: Annotated[PathPattern, _PATH_SCHEMA]
    operation: OperationRequirement = OperationRequirement.REQUIRED
    body: BodyKind = BodyKind.FORM
    amount: str | None = None  # the field carrying the amount
    # minor_units: 1099 (JSON integer, form digits); decimal: "10.99", the approved minor units
    # in the currency's ISO 4217 exponent (needs `currency`, which gives the exponent)
    amount_format: AmountFormat = AmountFormat.MINOR_UNITS
    currency: str | None = None
    params: list[str] = Field(default_factory=list)  # must equal the approved values, or be absent
    free: list[str] = Field(default_factory=list)  # fields the agent may set; '*' = any run
    classify: Classification | None = None  # overrides the provider's default
    # False for provider calls that refuse metadata (e.g. Stripe's payment intent cancel).
    inject_metadata: bool = True
    # Where this call keeps the operation id, when not at the provider's metadata_injection
    # (PayPal: /purchase_units/0/custom_id on an order, /custom_id on a refund).
    inject_metadata_at: str | None = None
    # False for a call the provider takes no idempotency key on (Square's CancelPayment, which
    # is idempotent by itself): opgate then sends no key, and the agent names the operation by
    # X-Operation-Id.
    send_key: bool = True
    reconcile: Reconcile | None = None
    preconditions: Preconditions | None = None
    mode: Mode | None = None  # None: the provider's mode
    # A proposal of this call may not be approved by the approver its agent belongs to (the
    # agent's `owner`, or an approver named as the agent). None: the provider's four_eyes.
    four_eyes: bool | None = None
    # The parameters that carry a payment mandate's payee, instrument and reference (None: a
    # mandate cannot approve this call).
    mandate: MandateParams | None = None
    # The upstream may answer 402 with x402, which opgate pays for the operation (None: a 402
    # is an answer like any other).
    x402: X402Payment | None = None

    @field_validator("path", mode="before")
    @classmethod
    def _parse_path(cls, value: object) -> PathPattern:
        if isinstance(value, PathPattern):
            return value
        if not isinstance(value, str):
            raise ValueError("path must be a string like /v1/refunds/{refund}")
        return PathPattern.parse(value)

    @model_validator(mode="after")
    def _coherent(self) -> Rule:
        mutating = self.method not in ("GET", "HEAD")
        if mutating and self.operation is OperationRequirement.NONE:
            raise ValueError(f"{self.method} changes the provider: it must require an operation")
        if self.operation is OperationRequirement.NONE and (
            self.amount or self.currency or self.params
        ):
            raise ValueError("amount, currency and params need `operation: required`")
        if self.body is BodyKind.NONE and (
            self.amount or self.currency or self.params or self.free
        ):
            raise ValueError("a rule with `body: none` cannot read fields from the body")
        if self.amount_format is AmountFormat.DECIMAL and (not self.amount or not self.currency):
            raise ValueError(
                "amount_format: decimal needs `amount` and `currency` (the currency's ISO 4217 "
                "exponent says how many decimals the amount has)"
            )
        named = [f for f in (self.amount, self.currency, *self.params) if f is not None]
        if len(named) != len(set(named)):
            raise ValueError("a field is named twice among amount, currency and params")
        if self.preconditions is not None:
            self._check_preconditions(self.preconditions)
        if self.x402 is not None and self.operation is not OperationRequirement.REQUIRED:
            raise ValueError(
                "x402 needs `operation: required`: a payment is approved per operation"
            )
        return self

    @model_validator(mode="after")
    def _mandate_params_approved(self) -> Rule:
        """What carries a mandate's payee is approved like any param, and only a call that
        moves an amount is a payment a mandate can approve."""
        if self.mandate is None:
            return self
        if self.amount is None:
            raise ValueError("mandate needs `amount`: a payment mandate approves an amount")
        named = [*self.mandate.carried().values(), *self.mandate.absent]
        missing = sorted(param for param in named if param not in self.params)
        if missing:
            raise ValueError(f"mandate names {missing}, which are not among the rule's params")
        if len(set(named)) != len(named):
            raise ValueError("mandate names one parameter twice")
        return self

    def _check_preconditions(self, preconditions: Preconditions) -> None:
        """Every assertion against what this rule approves: an approved value it never has,
        or types that can never compare, is an error now rather than a refusal later."""
        if self.operation is OperationRequirement.NONE:
            raise ValueError("preconditions need `operation: required`: they check an approval")
        errors = []
        known = {*self.params, *self.path.param_names, "operation_id"}
        for lookup in preconditions.lookups:
            # A name the rule never approves would skip the lookup on every operation: the
            # precondition would silently never be checked.
            for name in sorted(_template_names(lookup) - known):
                errors.append(
                    f"precondition lookup {lookup.path}: {{{name}}} is neither among the rule's "
                    "params nor a path parameter"
                )
            for assertion in lookup.assertions():
                for problem in expressions.problems(
                    assertion,
                    has_amount=self.amount is not None,
                    has_currency=self.currency is not None,
                    params=frozenset(self.params),
                    path_params=frozenset(self.path.param_names),
                ):
                    errors.append(f"precondition {assertion.text!r}: {problem}")
        if errors:
            raise ValueError("; ".join(errors))


# --- forward-proxy mode ---
class PassThroughHost(Strict):
    """A host forward mode tunnels without inspection (audited with host and byte counts)."""

    host: Annotated[str, Field(pattern=r"^([a-z0-9]([a-z0-9.-]*[a-z0-9])?|[0-9a-f:.]+)$")]
    port: Annotated[int, Field(ge=1, le=65535)] = 443


DestinationClass = Literal["loopback", "private", "link_local", "metadata"]


class ForwardProxy(Strict):
    """Forward-proxy mode (HTTPS_PROXY) for this provider. Its upstream host is always
    inspected: opgate terminates TLS and every request goes through the pipeline."""

    # Address classes this provider's hosts may resolve to; public addresses always may.
    allow_destinations: list[DestinationClass] = Field(default_factory=list)
    # Companion hosts tunnelled opaquely; the provider's own (inspected) host never is.
    pass_through: list[PassThroughHost] = Field(default_factory=list)


# --- end forward-proxy mode ---


class AgentSignature(Strict):
    """Sign each request to this provider as the agent (RFC 9421 HTTP message signatures, as
    Visa's Trusted Agent Protocol and Web Bot Auth verify them): over ``@authority``,
    ``@path`` and ``content-digest``, with ``created``, ``expires``, ``nonce``, ``keyid`` (the
    key's RFC 7638 thumbprint) and ``tag``; Ed25519, with the key opgate holds for the agent
    (``agents[].signing_key_file``). An agent without one is refused."""

    tag: Literal["agent-browser-auth", "agent-payer-auth"]
    # Trusted Agent Protocol: a signature lives at most 8 minutes
    expires_seconds: Annotated[int, Field(ge=1, le=480)] = 60


# --- response headers ---
# What of a provider's answer reaches the agent whatever its policy says (docs: policy format).
# Representation and caching metadata, the provider's request id, replay flag and rate-limit
# state: what SDKs read (Stripe's Request-Id, Square's Retry-After and X-RateLimit-Reset).
DEFAULT_RESPONSE_HEADERS = (
    "Cache-Control",
    "Content-Encoding",
    "Content-Language",
    "Content-Type",
    "Date",
    "ETag",
    "Expires",
    "Idempotent-Replayed",  # the provider answered a repeated key with its first answer
    "Last-Modified",
    "Link",
    "Location",
    "Payment-Required",  # x402: what the provider asks, for an agent that pays (payer: agent)
    "Payment-Response",  # x402: the settlement of the operation's payment (docs/x402.md)
    "RateLimit",
    "RateLimit-*",
    "Request-Id",
    "Retry-After",
    "Vary",
    "X-RateLimit-*",
    "X-Request-Id",
)
# Never passed on, whatever a policy lists: framing and hop-by-hop headers are the connection's,
# X-Operation-Id and X-Operation-Status opgate's own (set on an operation's answer).
UNLISTABLE_RESPONSE_HEADERS = frozenset(
    {
        "connection",
        "content-length",
        "keep-alive",
        "proxy-authenticate",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "x-operation-id",
        "x-operation-status",
    }
)


def _response_header_pattern(value: str) -> str:
    """A header name (RFC 9110 token), or a prefix of one ending in ``*``; never ``*`` alone
    (that would pass every header, cookies included) nor a name opgate never passes on."""
    if value.lower() in UNLISTABLE_RESPONSE_HEADERS:
        raise ValueError(f"response_headers may not list {value}: it is never passed on")
    return value


ResponseHeaderPattern = Annotated[
    str,
    Field(pattern=r"^[A-Za-z0-9!#$%&'+.^_`|~-]+\*?$"),
    AfterValidator(_response_header_pattern),
]
# --- end response headers ---


class Provider(Strict):
    version: Literal[1]
    provider: Annotated[str, Field(pattern=_NAME)]
    # "/_..." is reserved for opgate's own endpoints on the agent listener (recovery reads).
    route_prefix: Annotated[str, Field(pattern=r"^/[A-Za-z0-9.-][A-Za-z0-9_.-]*$")]
    upstream: Annotated[str, Field(pattern=r"^https?://[^/?#]+(/[^?#]*)?$")]
    credential: Credential | None = None
    # `none`: the provider takes no idempotency key (docs/how-to/apis-without-idempotency.md)
    idempotency: Idempotency = Field(default_factory=Idempotency)
    metadata_injection: MetadataInjection | None = None
    timeouts: Timeouts = Field(default_factory=Timeouts)
    limits: Limits = Field(default_factory=Limits)
    # Only these request headers reach the provider; everything else is dropped, so an agent
    # cannot retarget a call through a header the approval never saw (e.g. Stripe-Account).
    forward_headers: list[str] = Field(
        default_factory=lambda: [
            "Accept",
            "Accept-Language",
            "User-Agent",
            "traceparent",
            "tracestate",
        ]
    )
    # --- response headers ---
    # Headers of the provider's answers that reach the agent besides DEFAULT_RESPONSE_HEADERS
    # (names, or a prefix ending in ``*``); Set-Cookie and WWW-Authenticate only if listed. A
    # header carrying the injected credential never does (proxy/gate/headers.py).
    response_headers: list[ResponseHeaderPattern] = Field(default_factory=list)
    # --- end response headers ---
    classify: Classification = Field(default_factory=Classification)
    errors: ErrorDialect = ErrorDialect.PROBLEM  # the shape of opgate's refusals
    # How a currency code leaves (whatever case the agent wrote): Stripe's are lower case,
    # ISO 4217 codes as PayPal, Square and Adyen take them upper case.
    currency_case: Literal["lower", "upper"] = "lower"
    mode: Mode = Mode.ENFORCE  # report: shadow mode for every rule that does not say otherwise
    # Proposals (docs/concepts/proposals.md): every rule's four_eyes unless the rule says otherwise.
    four_eyes: bool = False
    # The provider's dashboard search for one operation, the link the console gives a human
    # an escalation waits on: a URL template over ``{operation_id}`` and the operation's
    # approved params and path params, as a lookup's path is (each value URL-quoted).
    dashboard_search_url: (
        Annotated[str, Field(pattern=r"^https://[^\s]+$", max_length=2000)] | None
    ) = None
    rules: Annotated[list[Rule], Field(min_length=1)]
    forward_proxy: ForwardProxy = Field(default_factory=ForwardProxy)  # forward mode
    # The agent's identity toward this provider: every request signed as the agent (RFC 9421)
    agent_signature: AgentSignature | None = None
    # Spend caps per currency and rolling window, enforced at claim (proxy/policy/budgets.py).
    budgets: list[Budget] = Field(default_factory=list)
    # Request rates and requests in flight per agent and per tenant on this provider.
    rate_limits: RateLimits = Field(default_factory=RateLimits)

    @field_validator("dashboard_search_url")
    @classmethod
    def _dashboard_template(cls, template: str | None) -> str | None:
        if template is not None:
            try:
                list(string.Formatter().parse(template))
            except ValueError as exc:
                raise ValueError(f"dashboard_search_url {template!r}: {exc}") from exc
        return template

    @field_validator("budgets")
    @classmethod
    def _distinct_budgets(cls, budgets: list[Budget]) -> list[Budget]:
        return no_duplicate_budgets(budgets)

    # A field validator, not a model one: the error then points at `rules:` (not at line 1)
    # and is reported alongside errors in other fields.
    @field_validator("rules")
    @classmethod
    def _unique_rule_names(cls, rules: list[Rule]) -> list[Rule]:
        seen: set[str] = set()
        for rule in rules:
            if rule.name in seen:
                raise ValueError(f"rule name {rule.name!r} is used twice")
            seen.add(rule.name)
        return rules

    @model_validator(mode="after")
    def _safe_forward_headers(self) -> Provider:
        """Headers that carry framing, routing or credentials are opgate's to set: listing
        one would let an agent's value through (e.g. its own token, where no credential is
        configured to replace it)."""
        reserved = {
            "host",
            "content-length",
            "transfer-encoding",
            "connection",
            "keep-alive",
            "te",
            "trailer",
            "upgrade",
            "expect",
            "proxy-authorization",
            "proxy-connection",
            "authorization",
            "cookie",
            "x-operation-id",
            # an agent's own payment would pay what no approval covers (docs/x402.md): opgate
            # pays an x402 upstream, and the legacy v1 header is not forwarded either
            "payment-signature",
            "x-payment",
        }
        if self.idempotency.header is not None:
            reserved.add(self.idempotency.header.lower())
        if self.credential is not None:
            reserved.add(self.credential.header.lower())
        listed = sorted(h for h in self.forward_headers if h.lower() in reserved)
        if listed:
            raise ValueError(f"forward_headers may not list {listed}: opgate sets or strips them")
        return self

    def rule_named(self, name: str) -> Rule | None:
        return next((rule for rule in self.rules if rule.name == name), None)

    def four_eyes_for(self, rule: Rule) -> bool:
        return self.four_eyes if rule.four_eyes is None else rule.four_eyes

    def metadata_field(self, rule: Rule) -> str | None:
        """The body field opgate sets to the operation id for ``rule``, if any."""
        injection = self.metadata_injection
        if injection is None or not rule.inject_metadata:
            return None
        if rule.inject_metadata_at is not None:
            return rule.inject_metadata_at
        return injection.field if isinstance(injection, FormFieldInjection) else injection.pointer

    def key_field(self, rule: Rule) -> str | None:
        """The body field carrying the idempotency key on ``rule``, if the key travels there."""
        if rule.operation is OperationRequirement.NONE or rule.body is BodyKind.NONE:
            return None
        return self.idempotency.body_field if rule.send_key else None

    def key_header(self, rule: Rule) -> str | None:
        """The header carrying the idempotency key on ``rule``, if the key travels there."""
        return self.idempotency.header if rule.send_key else None

    def sends_key(self, rule: Rule) -> bool:
        """Whether ``rule``'s requests leave with the idempotency key (in a header or the
        body): if not, nothing at the provider tells a re-send from a second request."""
        return self.key_header(rule) is not None or self.key_field(rule) is not None

    def dedup_window_for(self, rule: Rule | None) -> float | None:
        """How long after creation the provider deduplicates a re-send of ``rule``'s call;
        None: never relied on. A call that carries no key (``send_key: false``) is never
        deduplicated, whatever the provider does with the key its other calls carry. No rule
        (a policy reloaded without it): the provider's."""
        if rule is not None and not self.sends_key(rule):
            return None
        return self.idempotency.dedup_window_seconds

    def currency_spelling(self, currency: str) -> str:
        """The approved currency as this provider takes it."""
        return currency.upper() if self.currency_case == "upper" else currency.lower()

    def mode_for(self, rule: Rule) -> Mode:
        return rule.mode or self.mode

    def classification_for(self, rule: Rule) -> Classification:
        return rule.classify or self.classify
