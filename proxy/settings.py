"""opgate's settings: command-line flags > environment (``OPGATE_*``) > config file (YAML).

Validated at start-up with errors that name the setting; opgate refuses to start on any.
Secrets are never settings values: tokens are given by their SHA-256, and provider credentials
are read from ``OPGATE_SECRET_<NAME>`` or ``<secrets_dir>/<name>`` by ``Secrets``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

_DIGEST = r"^[0-9a-f]{64}$"


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(min_length=1)]
    tenant: Annotated[str, Field(min_length=1)]
    token_sha256: Annotated[str, Field(pattern=_DIGEST)]
    # The approver (by name) this agent belongs to: with `four_eyes: true` in the policy, that
    # approver may not approve the agent's proposals (proxy/operations/proposals.py).
    owner: Annotated[str, Field(min_length=1, max_length=200)] | None = None


class ApproverConfig(BaseModel):
    """A human (or team) who decides proposals: the operations API and the console know them
    by their token, and record what they decide under their name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=200)]
    token_sha256: Annotated[str, Field(pattern=_DIGEST)]


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OPGATE_", extra="forbid", frozen=True)

    # The PostgreSQL *primary*. Empty: opgate runs an embedded PostgreSQL in data_dir.
    database_url: str | None = None
    data_dir: Path = Path(".opgate")
    policy_dir: Path = Path("policies")
    agent_listen: str = "127.0.0.1:8080"
    ops_listen: str = "127.0.0.1:8081"
    admin_token_sha256: Annotated[str, Field(pattern=_DIGEST)] | None = None
    # The console's read-only role (proxy/console/): sees everything, changes nothing.
    reviewer_token_sha256: Annotated[str, Field(pattern=_DIGEST)] | None = None
    agents: list[AgentConfig] = Field(default_factory=list)
    # The approver role: decides agents' proposals (and sees what a reviewer sees).
    approvers: list[ApproverConfig] = Field(default_factory=list)
    # A proposal waits this long for a human, then it is expired (neither approvable nor
    # sendable); once approved, its operation stands this long (checked against the provider's
    # idempotency-key retention when proposed).
    proposal_pending_seconds: Annotated[float, Field(gt=0, le=7 * 86400)] = 86400.0
    proposal_approval_seconds: Annotated[int, Field(gt=0, le=30 * 86400)] = 3600
    secrets_dir: Path | None = None
    # Per provider: send to this base URL instead of the policy's upstream (staging, tests).
    upstream_overrides: dict[str, str] = Field(default_factory=dict)
    instance_id: str = Field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    # Set by the worker supervisor for its workers, not by hand: where they share their metric
    # counts (proxy/observe/shared_metrics.py).
    metrics_dir: Path | None = None
    pool_min_size: Annotated[int, Field(ge=1)] = 2
    pool_max_size: Annotated[int, Field(ge=1)] = 10
    pool_acquire_timeout_seconds: Annotated[float, Field(gt=0)] = 5.0
    statement_timeout_ms: Annotated[int, Field(gt=0)] = 5000
    # Added to a provider's total timeout: an attempt's lease outlives the attempt itself.
    lease_margin_seconds: Annotated[float, Field(ge=0)] = 5.0
    # A generous bound on client connections held idle between requests.
    keepalive_timeout_seconds: Annotated[float, Field(gt=0)] = 75.0
    # The whole request body must arrive within this (one deadline over the whole read, not
    # per read: a byte every second would never trip a per-read timeout). Else 408.
    body_read_timeout_seconds: Annotated[float, Field(gt=0)] = 10.0
    # An agent's answer must be written within this (one deadline over the whole write: an
    # agent that never reads would hold its connection, and the slot, forever); else the
    # connection is aborted, and an `answer_undelivered` audit record says so.
    answer_write_timeout_seconds: Annotated[float, Field(gt=0)] = 30.0
    # Requests of one agent in flight at once in this process (from identification to the
    # recorded outcome); one more is 429. Per process: a replica with W workers admits W times
    # this per agent, a deployment of R such replicas R x W times.
    max_requests_in_flight_per_agent: Annotated[int, Field(ge=1)] = 64
    # The same for all agents of one tenant together (None: no cap), and request rates per
    # agent and per tenant over every provider (None: none; a provider's policy can add its
    # own, `rate_limits`). Per process, like the cap above; one more is 429 rate_limited.
    max_requests_in_flight_per_tenant: Annotated[int, Field(ge=1)] | None = None
    requests_per_second_per_agent: Annotated[float, Field(gt=0)] | None = None
    requests_per_second_per_tenant: Annotated[float, Field(gt=0)] | None = None
    log_level: str = "info"
    # Worker processes sharing the listening sockets (None: one per core). Each has its own
    # pool: the database sees workers x pool_max_size connections.
    workers: Annotated[int, Field(ge=1, le=256)] | None = None
    # On SIGTERM: stop accepting, let in-flight requests finish for this long, then exit.
    # Longer than the longest provider timeout (Stripe: 30 s), so a drain cuts nothing short.
    drain_seconds: Annotated[float, Field(ge=0, le=3600)] = 35.0
    # Run although the database's standbys are asynchronous (or synchronous_commit is below
    # remote_write): a failover can then lose a claim whose request has left, and the
    # operation is sent again (docs/running-ha.md gives the measured risk).
    accept_async_replication: bool = False
    # /readyz commits a heartbeat row; not acknowledged within this (a synchronous standby
    # missing), it answers 503: claims would hang as long.
    readiness_commit_timeout_seconds: Annotated[float, Field(gt=0, le=60)] = 2.0
    # asyncpg's prepared-statement cache; 0 for PgBouncer in transaction pooling mode.
    database_statement_cache_size: Annotated[int, Field(ge=0)] = 100
    # Policy hot reload: how often the policy files are checked for a change (0: SIGHUP only).
    policy_reload_interval_seconds: Annotated[float, Field(ge=0)] = 2.0
    # --- audit trail and observability (docs/audit.md) ---
    # Field names whose values are redacted from logs, spans, audit rows and exports.
    audit_redact_fields: list[str] = Field(default_factory=list)
    # How often the chain heads are signed (needs OPGATE_SECRET_AUDIT_KEY or secrets_dir).
    audit_checkpoint_seconds: Annotated[float, Field(gt=0)] = 60.0
    # While records keep coming, fewer than 8 waiting request records wait this long for more
    # (one statement chains a batch more cheaply); what a SIGKILL can lose grows with it.
    audit_linger_seconds: Annotated[float, Field(ge=0, le=60)] = 0.02
    # How often each run of the writer leaves a trace (audit_instance_runs) while it stores
    # nothing: `opgate audit verify` takes a run silent for 3 of these as ended.
    audit_heartbeat_seconds: Annotated[float, Field(gt=0, le=3600)] = 10.0
    # /metrics counts operations dispatched longer than this and still unsettled.
    metrics_dispatched_after_seconds: Annotated[float, Field(gt=0)] = 300.0
    # --- forward-proxy mode ---
    # The listener agents reach through HTTP_PROXY/HTTPS_PROXY; empty (null) disables it.
    forward_listen: str | None = "127.0.0.1:3128"
    # opgate's interception CA (created on first start if absent); default <data_dir>/ca.
    ca_dir: Path | None = None
    # Static name resolution for forward-mode egress, like /etc/hosts: {"provider.test":
    # "127.0.0.1"}. For tests and split-horizon set-ups; addresses are still checked.
    forward_static_hosts: dict[str, str] = Field(default_factory=dict)
    # Extra CA certificates (PEM) trusted for providers' TLS in forward mode, besides the
    # system's: a private CA, or a test CA.
    upstream_ca_file: Path | None = None
    forward_tls_handshake_timeout_seconds: Annotated[float, Field(gt=0)] = 10.0
    # --- end forward-proxy mode ---
    # Recovery: how often each replica looks for operations to reconcile and notifications to
    # deliver, and where escalations are announced (POST JSON; retried with backoff).
    background_interval_seconds: Annotated[float, Field(gt=0)] = 5.0
    reconcile_batch_size: Annotated[int, Field(ge=1, le=1000)] = 20
    escalation_webhook_url: str | None = None
    # --- the web console on the operations listener (proxy/console/) ---
    # A signed-in session lasts this long, then the human signs in again.
    console_session_seconds: Annotated[float, Field(gt=0, le=7 * 86400)] = 8 * 3600.0
    # Where a record's trace id links to, {trace_id} replaced by it (32 hex digits), e.g.
    # https://jaeger.example/trace/{trace_id}. Empty: trace ids are shown, not linked.
    trace_url_template: str | None = None

    @field_validator("trace_url_template")
    @classmethod
    def _valid_trace_template(cls, value: str | None) -> str | None:
        if value and ("{trace_id}" not in value or not value.startswith(("https://", "http://"))):
            raise ValueError("an http(s) URL holding {trace_id}")
        return value or None

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

    @field_validator("agent_listen", "ops_listen")
    @classmethod
    def _valid_address(cls, value: str) -> str:
        return _host_port(value)

    @field_validator("forward_listen")
    @classmethod
    def _valid_optional_address(cls, value: str | None) -> str | None:
        return _host_port(value) if value else None

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


def load_settings(overrides: dict[str, Any] | None = None) -> Settings:
    """Settings from flags (``overrides``, None values dropped), environment and config file."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    return Settings(**given)


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
