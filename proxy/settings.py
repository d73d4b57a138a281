"""opgate's settings: command-line flags > environment (``OPGATE_*``) > config file (YAML).

Validated at start-up with errors that name the setting; opgate refuses to start on any.
Secrets are never settings values: tokens are given by their SHA-256, and provider credentials
are read from ``OPGATE_SECRET_<NAME>`` or ``<secrets_dir>/<name>`` by ``Secrets``.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

_DIGEST = r"^[0-9a-f]{64}$"
# The grammar of a policy's `upstream` (proxy/policy/model.py, Provider), which an override
# replaces: restated, as settings may import nothing of opgate's.
_BASE_URL = re.compile(r"^https?://[^/?#]+(/[^?#]*)?$")
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(min_length=1)]
    tenant: Annotated[str, Field(min_length=1)]
    token_sha256: Annotated[str, Field(pattern=_DIGEST)]
    # The approver (by name) this agent belongs to: with `four_eyes: true` in the policy, that
    # approver may not approve the agent's proposals (proxy/proposals/rules.py).
    owner: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    # The agent's Ed25519 private key (a JWK file) opgate signs its requests with toward
    # providers whose policy sets agent_signature (RFC 9421): opgate holds it, as it holds the
    # provider's secrets, so the agent never does.
    signing_key_file: Path | None = None


class ApproverConfig(BaseModel):
    """A human (or team) who decides proposals: the operations API and the console know them
    by their token, and record what they decide under their name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=200)]
    token_sha256: Annotated[str, Field(pattern=_DIGEST)]


class OAuthSubject(BaseModel):
    """One token subject an issuer vouches for, and the configured agent it acts as."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subject: Annotated[str, Field(min_length=1, max_length=255)]
    agent_id: Annotated[str, Field(min_length=1)]


class OAuthIssuer(BaseModel):
    """An OAuth 2.1 authorization server whose access tokens the MCP endpoint accepts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: Annotated[str, Field(min_length=1)]
    jwks_uri: Annotated[str, Field(pattern=r"^https?://")]
    subject_claim: Annotated[str, Field(min_length=1)] = "sub"
    algorithms: list[Literal["RS256", "ES256", "PS256", "EdDSA"]] = ["RS256", "ES256"]
    subjects: list[OAuthSubject]


class McpOAuth(BaseModel):
    """The MCP endpoint as an OAuth 2.1 resource server (proxy/mcp/auth.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The endpoint's canonical URI: the audience tokens must be bound to (RFC 8707), and the
    # `resource` of its metadata (RFC 9728).
    resource: Annotated[str, Field(pattern=r"^https?://[^#?]+/_opgate/mcp$")]
    issuers: Annotated[list[OAuthIssuer], Field(min_length=1)]
    # Whether agents' static opgate tokens still open the MCP endpoint beside OAuth tokens.
    static_tokens: bool = True
    jwks_cache_seconds: Annotated[float, Field(gt=0, le=86400)] = 300.0


class WitnessConfig(BaseModel):
    """A C2SP tlog-witness that cosigns the audit log's checkpoints (docs/audit.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # the submission prefix: checkpoints are POSTed to <url>/add-checkpoint
    url: Annotated[str, Field(pattern=r"^https?://")]
    # its cosigning key: <name>+<key id>+<base64(0x04 || Ed25519 public key)>
    vkey: Annotated[str, Field(min_length=3)]


class MandateIssuerConfig(BaseModel):
    """A trusted surface whose signed AP2 Payment Mandates approve operations: its public keys
    (a JWKS, inline or a file, selected by ``kid``), the tenants whose agents may present its
    mandates, and which provider each payee it names is paid through."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=200)]
    tenants: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    jwks: dict[str, Any] | None = None
    jwks_file: Path | None = None
    # AP2's payee.id -> the policy provider that pays it: a mandate for a payee not listed
    # here approves nothing (mandate_mismatch on payee)
    payees: Annotated[dict[str, str], Field(min_length=1)]

    @model_validator(mode="after")
    def _one_key_source(self) -> MandateIssuerConfig:
        if (self.jwks is None) == (self.jwks_file is None):
            raise ValueError("give exactly one of jwks and jwks_file")
        return self


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return value


def _base_url(value: str) -> str:
    if not _BASE_URL.match(value):
        raise ValueError(f"{value!r} is not an http(s) base URL (http://HOST[:PORT][/PATH])")
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OPGATE_", extra="forbid", frozen=True)

    # Each description is the settings page's text (docs/reference/settings.md, written by
    # proxy/authoring/reference.py); a test keeps none missing.
    database_url: str | None = Field(
        None,
        description="The PostgreSQL **primary** (never a replica: decisions read from it); "
        "none: an embedded PostgreSQL in `data_dir`. Several hosts (`h1:5432,h2:5432`) need "
        "`?target_session_attrs=read-write` (or `primary`), else `opgate serve` refuses to "
        "start; one host is a warning at start (a promotion is followed only if the address "
        "moves). A standby's or a read-only server's connection is dropped and made anew.",
    )
    data_dir: Path = Field(Path(".opgate"), description="Embedded PostgreSQL and dev tokens.")
    policy_dir: Path = Field(
        Path("policies"), description="The policy files (`*.yaml`, one per provider)."
    )
    agent_listen: str = Field("127.0.0.1:8080", description="HOST:PORT of the agent listener.")
    ops_listen: str = Field(
        "127.0.0.1:8081", description="HOST:PORT of the operations API and the console."
    )
    admin_token_sha256: Annotated[str, Field(pattern=_DIGEST)] | None = Field(
        None, description="The admin token's SHA-256: `opgate token` prints a token and its digest."
    )
    reviewer_token_sha256: Annotated[str, Field(pattern=_DIGEST)] | None = Field(
        None,
        description="The console's read-only role (sees everything, changes nothing), by the "
        "token's SHA-256.",
    )
    agents: list[AgentConfig] = Field(
        default_factory=list,
        description='`[{"id": "...", "tenant": "...", "token_sha256": "...", "owner": "..."}]`; '
        "`owner` (optional) is the approver the agent belongs to, for four eyes.",
    )
    console_url: Annotated[str, Field(pattern=r"^https?://")] | None = Field(
        None,
        description="The console's address as approvers open it (e.g. "
        "`https://opgate.example.com/console`). With it, an MCP client that supports URL "
        "elicitation is asked to open a proposal's approval page when its agent proposes.",
    )
    mcp_oauth: McpOAuth | None = Field(
        None,
        description='The MCP endpoint as an OAuth 2.1 resource server: `{"resource": '
        '"https://HOST/_opgate/mcp", "issuers": [{"issuer": "...", "jwks_uri": "...", '
        '"subject_claim": "sub", "subjects": [{"subject": "...", "agent_id": "..."}]}], '
        '"static_tokens": true}`. A token\'s subject acts as the configured agent it names; '
        "an unknown subject is refused. `static_tokens: false`: only OAuth tokens open it "
        "(docs/mcp.md).",
    )
    # The MCP transport's DNS-rebinding rule (docs/mcp.md): an origin as a browser sends it.
    mcp_allowed_origins: list[
        Annotated[str, Field(pattern=r"^https?://[^/?#\s]+$", max_length=300)]
    ] = Field(
        default_factory=list,
        description="Browser origins (`https://app.example.com`, as a browser sends `Origin`) "
        "that may call the MCP endpoint. A request without `Origin` is allowed; one with an "
        "origin not listed is refused 403 `mcp_origin_refused`.",
    )
    approvers: list[ApproverConfig] = Field(
        default_factory=list,
        description='`[{"name": "...", "token_sha256": "..."}]`: who may decide proposals '
        "(operations API, console, `opgate proposals`), recorded under `name`. Names are unique "
        "and each token is its own (opgate refuses one that an agent, the admin, the reviewer "
        "or another approver also holds).",
    )
    # Checked against the provider's idempotency-key retention when proposed.
    proposal_pending_seconds: Annotated[float, Field(gt=0, le=7 * 86400)] = Field(
        86400.0,
        description="A proposal waits this long for a decision (at most 7 days), then it is "
        "expired (neither approvable nor sendable).",
    )
    proposal_approval_seconds: Annotated[int, Field(gt=0, le=30 * 86400)] = Field(
        3600,
        description="An approved proposal's operation stands this long from its approval (at "
        "most 30 days, and within the provider's `idempotency.retention_seconds`).",
    )
    # Proposals cost a human's attention: capped by what waits, whatever the request rate.
    max_pending_proposals_per_agent: Annotated[int, Field(ge=1)] = Field(
        20,
        description="Pending proposals one agent may have waiting for a decision; one more is "
        "429 `rate_limited` with `Retry-After` (nothing proposed). Counted in the database: "
        "one cap across every process.",
    )
    max_pending_proposals_per_tenant: Annotated[int, Field(ge=1)] | None = Field(
        100,
        description="The same for all agents of one tenant together (none: no cap).",
    )
    proposal_declined_twin_seconds: Annotated[float, Field(ge=0, le=30 * 86400)] = Field(
        86400.0,
        description="A proposal identical to one of the same agent declined within this long "
        "(same action, path parameters, amount, currency and parameters; the reason aside) "
        "links the declined one (`declined_twin`), for the agent and the approvers (0: never).",
    )
    mandate_issuers: list[MandateIssuerConfig] = Field(
        default_factory=list,
        description="Trusted issuers of AP2 Payment Mandates (docs/mandates.md); "
        "none: POST /_opgate/v1/mandates answers mandates_not_supported.",
    )
    mandate_audience: Annotated[str, Field(min_length=1, max_length=200)] = Field(
        "opgate", description="opgate's name as a mandate verifier: the aud a key binding names."
    )
    receipt_key_file: Path | None = Field(
        None,
        description="opgate's P-256 private key (a JWK file) that signs mandate receipts; "
        "required with mandate_issuers (`--dev` makes none; docs/how-to/pay-with-a-mandate.md "
        "shows how to make one).",
    )
    signature_agent: Annotated[str, Field(pattern=r"^https://[^/?#\s\"]+$")] | None = Field(
        None,
        description="The https origin (no path) at which providers reach opgate's Web Bot Auth "
        "key directory (`/.well-known/http-message-signatures-directory` on the agent listener, "
        'behind the operator\'s TLS): sent as `Signature-Agent: sig1="<origin>"` on every '
        "request signed as an agent (policy `agent_signature`) and covered by the signature. "
        "Unset: no `Signature-Agent`; providers learn where the keys are out of band.",
    )
    secrets_dir: Path | None = Field(
        None,
        description="Provider credentials: `OPGATE_SECRET_<NAME>` or `<secrets_dir>/<name>`, "
        "never a policy file.",
    )
    upstream_overrides: dict[str, Annotated[str, AfterValidator(_base_url)]] = Field(
        default_factory=dict,
        description="Per provider, an http(s) base URL to send to instead of the policy's "
        "upstream: "
        '`{"stripe": "http://127.0.0.1:8420"}` (staging, local trials).',
    )
    instance_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}",
        description="This process's name in claims and audit records (default: `host:pid`).",
    )
    metrics_dir: Path | None = Field(
        None,
        description="Set by the worker supervisor for its workers, not by hand: where they "
        "share their metric counts (proxy/observe/shared_metrics.py).",
    )
    pool_min_size: Annotated[int, Field(ge=1)] = Field(
        2, description="Connections each worker's pool keeps open."
    )
    pool_max_size: Annotated[int, Field(ge=1)] = Field(
        10, description="Connections each worker's pool may open."
    )
    pool_acquire_timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        5.0,
        description="A request that cannot get a connection in time is refused (503), never "
        "forwarded.",
    )
    statement_timeout_ms: Annotated[int, Field(gt=0)] = Field(
        5000, description="How long one database statement may take (asyncpg's command timeout)."
    )
    lease_margin_seconds: Annotated[float, Field(ge=0)] = Field(
        5.0,
        description="An attempt's lease is the provider timeout plus this: the lease outlives "
        "the attempt itself.",
    )
    keepalive_timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        75.0, description="A generous bound on client connections held idle between requests."
    )
    # One deadline over the whole read, not per read: a byte every second would never trip a
    # per-read timeout.
    body_read_timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        10.0,
        description="The whole request body must arrive within this, one deadline over the "
        "whole read (not per read): else 408 `body_timeout`, nothing sent, and the connection "
        "is closed. Also bounds bodies on the operations API and the forward listener.",
    )
    # An agent that never reads would hold its connection, and the slot, forever.
    answer_write_timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        30.0,
        description="The agent's answer must be written within this (one deadline over the "
        "whole write): an agent that does not read its answer has its connection aborted, and "
        "an `answer_undelivered` audit record says so (docs/audit.md).",
    )
    max_requests_in_flight_per_agent: Annotated[int, Field(ge=1)] = Field(
        64,
        description="Requests of one agent in flight at once, from identification until the "
        "answer (a forwarded request until its outcome is recorded, even if the agent hung "
        "up); one more is 429 `agent_concurrency_exceeded` with `Retry-After`, before its body "
        "is read or the database is touched. **Per process**: a replica with W workers admits "
        "W times this per agent, R replicas R x W times. Below `pool_max_size`, one agent can "
        "never hold every pooled connection.",
    )
    # A provider's policy can add its own limits (`rate_limits`).
    max_requests_in_flight_per_tenant: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="The same for all agents of one tenant together (none: no cap): one more "
        "is 429 `rate_limited`. Per process.",
    )
    requests_per_second_per_agent: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description="A token bucket over every provider (burst: the rate rounded up); one more "
        "is 429 `rate_limited` with `Retry-After`. Per process.",
    )
    requests_per_second_per_tenant: Annotated[float, Field(gt=0)] | None = Field(
        None, description="The same per tenant. Per process."
    )
    log_level: str = Field("info", description="The level of opgate's log lines.")
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop",
        description="The event loop the server runs on: `uvloop` (libuv's, in C), or "
        "`asyncio` (the standard library's). Both run the same code and the same tests "
        "(`OPGATE_EVENT_LOOP=asyncio ./dev test`); bench/opgate-process-cpu.md measures them.",
    )
    workers: Annotated[int, Field(ge=1, le=256)] | None = Field(
        None,
        description="Worker processes sharing the ports (`--workers N`; none: one per core). "
        "Each has its own pool: the database sees workers x `pool_max_size` connections.",
    )
    # Longer than the longest provider timeout (Stripe: 30 s), so a drain cuts nothing short.
    drain_seconds: Annotated[float, Field(ge=0, le=3600)] = Field(
        35.0,
        description="On SIGTERM: stop accepting, finish in-flight requests for this long, exit.",
    )
    accept_async_replication: bool = Field(
        False,
        description="Run although the database's standbys are asynchronous (or "
        "`synchronous_commit` is below `remote_write`): a failover can then lose a claim whose "
        "request has left, and the operation is sent again (docs/running-ha.md gives the "
        "measured risk).",
    )
    # A heartbeat not acknowledged in time: claims would hang as long.
    replication_check_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        1.0,
        description="How often each process judges the database's replication again while "
        "running: made asynchronous (and `accept_async_replication` not set), claims are "
        "refused (503, nothing sent) and `/readyz` is 503 until it is synchronous again.",
    )
    readiness_budget_seconds: Annotated[float, Field(gt=0, le=60)] = Field(
        0.8,
        description="`/readyz` answers within this, whatever holds the pool: it checks on a "
        "connection of its own, and a check not done in time (the database or a synchronous "
        "standby slow or gone) is 503. Keep it below the probe's timeout (Kubernetes: "
        "`timeoutSeconds`, 1 by default).",
    )
    readiness_commit_timeout_seconds: Annotated[float, Field(gt=0, le=60)] = Field(
        0.5,
        description="`/readyz` commits a heartbeat row; not acknowledged within this (a "
        "synchronous standby missing), it answers 503. At most `readiness_budget_seconds`.",
    )
    database_statement_cache_size: Annotated[int, Field(ge=0)] = Field(
        100,
        description="asyncpg's prepared-statement cache; 0 behind PgBouncer in transaction "
        "pooling.",
    )
    policy_reload_interval_seconds: Annotated[float, Field(ge=0)] = Field(
        2.0,
        description="How often policy files are checked for a change (0: only on SIGHUP).",
    )
    # --- audit trail and observability (docs/audit.md) ---
    audit_redact_fields: list[str] = Field(
        default_factory=list,
        description="Field names whose values are redacted from logs, spans, audit rows and "
        "exports (docs/audit.md).",
    )
    audit_checkpoint_seconds: Annotated[float, Field(gt=0)] = Field(
        60.0,
        description="How often the chain heads are signed (needs `OPGATE_SECRET_AUDIT_KEY` or "
        "`secrets_dir`).",
    )
    audit_integrate_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        1.0,
        description="How often new audit records join the Merkle tree and a checkpoint is "
        "signed (needs `OPGATE_SECRET_TRANSPARENCY_KEY` or `secrets_dir`; dev mode makes one).",
    )
    audit_earlier_log_keys: list[Annotated[str, Field(pattern=r"^[^+\s]+\+[0-9a-f]{8}\+")]] = Field(
        default_factory=list,
        description="The transparency log's earlier public keys (vkeys), once "
        "`transparency_key` was rotated: the checkpoints they signed still verify "
        "(docs/audit.md, *Rotating the log's key*).",
    )
    audit_witnesses: list[WitnessConfig] = Field(
        default_factory=list,
        description="C2SP tlog-witnesses asked to cosign each new checkpoint (`url`, `vkey`).",
    )
    audit_witness_quorum: Annotated[int, Field(ge=0)] = Field(
        0,
        description="Cosignatures that make a checkpoint witnessed (`opgate audit "
        "verify-bundle` requires them).",
    )
    # One statement chains a batch more cheaply; what a SIGKILL can lose grows with it.
    audit_linger_seconds: Annotated[float, Field(ge=0, le=60)] = Field(
        0.02,
        description="While records keep coming, fewer than 8 waiting request records wait this "
        "long for more (one statement chains a batch).",
    )
    audit_heartbeat_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        10.0,
        description="Each run of the audit writer leaves a trace at least this often, by which "
        "`opgate audit verify` tells a running instance from one that ended without a clean "
        "stop (silent for 3 of these: ended; docs/audit.md, *Lost writes*).",
    )
    metrics_dispatched_after_seconds: Annotated[float, Field(gt=0)] = Field(
        300.0,
        description="`/metrics` counts operations dispatched longer than this and still unsettled.",
    )
    # --- forward-proxy mode ---
    forward_listen: str | None = Field(
        "127.0.0.1:3128",
        description="The listener agents reach through `HTTP_PROXY`/`HTTPS_PROXY`; `null` "
        "disables forward mode.",
    )
    ca_dir: Path | None = Field(
        None,
        description="The interception CA (default: `<data_dir>/ca`); created on first start if "
        "absent.",
    )
    forward_static_hosts: dict[str, str] = Field(
        default_factory=dict,
        description='Name -> address, like `/etc/hosts` (`{"provider.test": "127.0.0.1"}`: '
        "tests, split horizon); addresses are still checked.",
    )
    upstream_ca_file: Path | None = Field(
        None,
        description="Extra CA certificates (PEM) trusted for providers in forward mode, "
        "besides the system's.",
    )
    forward_tls_handshake_timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        10.0, description="The agent's TLS handshake inside a CONNECT must finish within this."
    )
    # --- end forward-proxy mode ---
    # --- recovery ---
    background_interval_seconds: Annotated[float, Field(gt=0)] = Field(
        5.0,
        description="How often each replica looks for operations to reconcile and "
        "notifications to deliver.",
    )
    reconcile_batch_size: Annotated[int, Field(ge=1, le=1000)] = Field(
        20, description="Operations each background pass reconciles at most."
    )
    escalation_webhook_url: str | None = Field(
        None,
        description="Where escalations and pending proposals are announced (POST JSON, signed "
        "the Standard Webhooks way; retried with backoff).",
    )
    # --- the web console on the operations listener (proxy/console/) ---
    console_session_seconds: Annotated[float, Field(gt=0, le=7 * 86400)] = Field(
        8 * 3600.0,
        description="A console session's lifetime; then the human signs in again.",
    )
    trace_url_template: str | None = Field(
        None,
        description="A trace viewer URL with `{trace_id}` (Jaeger, Langfuse, ClickStack, ...), "
        "e.g. `https://jaeger.example/trace/{trace_id}`: the console links each record's trace "
        "id to it. None: trace ids are shown, not linked.",
    )

    @field_validator("trace_url_template")
    @classmethod
    def _valid_trace_template(cls, value: str | None) -> str | None:
        if value and ("{trace_id}" not in value or not value.startswith(("https://", "http://"))):
            raise ValueError("an http(s) URL holding {trace_id}")
        return value or None

    @model_validator(mode="after")
    def _receipts_can_be_signed(self) -> Settings:
        if self.mandate_issuers and self.receipt_key_file is None:
            raise ValueError("mandate_issuers needs receipt_key_file (receipts are signed)")
        return self

    @model_validator(mode="after")
    def _approvers_are_people_not_agents(self) -> Settings:
        """Each approver is one name with its own token: an agent's token (or the admin's, or
        the reviewer's) that also approved would let its holder decide proposals under
        another identity; a name twice would make four eyes ambiguous."""
        names = [a.name for a in self.approvers]
        if len(set(names)) != len(names):
            raise ValueError("approvers: a name is given twice")
        others = {a.token_sha256 for a in self.agents}
        others |= {t for t in (self.reviewer_token_sha256, self.admin_token_sha256) if t}
        tokens = [a.token_sha256 for a in self.approvers]
        if len(set(tokens)) != len(tokens) or others & set(tokens):
            raise ValueError(
                "approvers: each needs a token of its own (not an agent's or another's)"
            )
        return self

    @field_validator("upstream_ca_file")
    @classmethod
    def _ca_file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value}: no such file")
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.lower() not in _LOG_LEVELS:
            raise ValueError(f"{value!r} is not a level ({', '.join(_LOG_LEVELS)})")
        return value.lower()

    @field_validator("escalation_webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        if value and not re.match(r"^https?://[^/?#\s]+([/?][^#\s]*)?$", value):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value or None

    @model_validator(mode="after")
    def _oauth_subjects_are_agents(self) -> Settings:
        """A subject acts as a configured agent (its tenant, limits and records): one that
        names no agent would be refused at every call, so it is refused at start."""
        if self.mcp_oauth is not None:
            known = {a.id for a in self.agents}
            for issuer in self.mcp_oauth.issuers:
                for subject in issuer.subjects:
                    if subject.agent_id not in known:
                        raise ValueError(
                            f"mcp_oauth: subject {subject.subject!r} of {issuer.issuer} names "
                            f"no configured agent {subject.agent_id!r}"
                        )
        return self

    @field_validator("agent_listen", "ops_listen")
    @classmethod
    def _valid_address(cls, value: str) -> str:
        return _host_port(value)

    @field_validator("forward_listen")
    @classmethod
    def _valid_optional_address(cls, value: str | None) -> str | None:
        # "null" as the reference spells it: an environment variable cannot hold YAML's null
        if not value or value.lower() == "null":
            return None
        return _host_port(value)

    @property
    def forward_ca_dir(self) -> Path:
        return self.ca_dir if self.ca_dir is not None else self.data_dir / "ca"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config_file = os.environ.get("OPGATE_CONFIG")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if config_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
        return tuple(sources)


class InvalidSettings(Exception):
    """Settings opgate cannot start with: one line per problem, each naming the setting (or
    the config file), where it was given, and what is wrong."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def load_settings(
    overrides: dict[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Settings from flags (``overrides``, None values dropped), environment and config file;
    InvalidSettings, never pydantic's errors, when they cannot be used."""
    environ = os.environ if environ is None else environ
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    config_file = environ.get("OPGATE_CONFIG")
    if config_file:
        _check_config_file(config_file)
    try:
        return Settings(**given)
    except ValidationError as exc:
        where = _SourceNamer(given, environ, config_file)
        raise InvalidSettings([where.problem(error) for error in exc.errors()]) from exc
    except SettingsError as exc:
        # raised before any field is validated, for a dict or list setting whose variable is
        # not JSON, in a sentence that names neither the variable nor what is wrong
        found = re.search(r'parsing value for field "(\w+)"', str(exc))
        field = found.group(1) if found else "?"
        raise InvalidSettings(
            [f"setting {field} (OPGATE_{field.upper()}): not valid JSON"]
        ) from exc


def _check_config_file(path: str) -> None:
    """The config file exists, parses as YAML and is a mapping: pydantic-settings would skip
    a missing file silently, and raise a parser's traceback for the others."""
    try:
        text = Path(path).read_text("utf-8")
    except FileNotFoundError:
        raise InvalidSettings([f"config file {path} (OPGATE_CONFIG): no such file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSettings([f"config file {path} (OPGATE_CONFIG): unreadable: {exc}"]) from exc
    try:
        content = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InvalidSettings([f"config file {path}: not valid YAML ({at}{problem})"]) from exc
    if content is not None and not isinstance(content, dict):
        problem = "should be a mapping of settings (name: value)"
        raise InvalidSettings([f"config file {path}: {problem}"])


class _SourceNamer:
    """Says where a setting's value came from (flag, variable or config file) and what is
    wrong with it, in words an operator acts on (pydantic's, trimmed)."""

    def __init__(
        self, flags: Mapping[str, Any], environ: Mapping[str, str], config_file: str | None
    ) -> None:
        self._flags, self._environ, self._config_file = flags, environ, config_file

    def problem(self, error: ErrorDetails) -> str:
        loc = [str(part) for part in error["loc"]]
        if not loc:  # a check across settings (model validator): its message names them
            return f"settings: {_message(error, nested=False)}"
        return f"setting {'.'.join(loc)} ({self._source(loc[0])}): " + _message(
            error, nested=len(loc) > 1
        )

    def _source(self, name: str) -> str:
        if name in self._flags:
            return "--" + name.replace("_", "-")
        variable = f"OPGATE_{name.upper()}"
        if variable in self._environ:
            return variable
        if self._config_file:
            return f"in {self._config_file}"
        return "its default"


_PLAIN_MESSAGES = {
    "dict_type": "should be an object",
    "list_type": "should be a list",
    "string_type": "should be a string",
    "missing": "missing (required)",
}


def _message(error: ErrorDetails, *, nested: bool) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown field" if nested else "not a setting (docs/reference/settings.md has all)"
    if kind in _PLAIN_MESSAGES:
        return _PLAIN_MESSAGES[kind]
    message = error["msg"].removeprefix("Value error, ")
    return message.replace("Input should", "should", 1)


def split_host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


class Secrets:
    """Named secrets: ``OPGATE_SECRET_STRIPE_API_KEY`` or ``<secrets_dir>/stripe_api_key`` for
    ``stripe_api_key``. Read per use (cheap: a dict lookup or a small file), so a rotated secret
    file takes effect without a restart."""

    def __init__(self, secrets_dir: Path | None, environ: dict[str, str] | None = None) -> None:
        self._secrets_dir = secrets_dir
        self._environ = environ if environ is not None else dict(os.environ)

    def secret(self, name: str) -> str | None:
        value = self._environ.get(f"OPGATE_SECRET_{name.upper()}")
        if value:
            return value
        if self._secrets_dir is not None:
            path = self._secrets_dir / name
            if path.is_file():
                return path.read_text("utf-8").strip() or None
        return None
