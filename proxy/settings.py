"""opgate's settings: command-line flags > environment (``OPGATE_*``) > config file (YAML).

Validated at start-up with errors that name the setting; opgate refuses to start on any.
Secrets are never settings values: tokens are given by their SHA-256, and provider credentials
are read from ``OPGATE_SECRET_<NAME>`` or ``<secrets_dir>/<name>`` (see credentials.py).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
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
    agents: list[AgentConfig] = Field(default_factory=list)
    secrets_dir: Path | None = None
    # Per provider: send to this base URL instead of the policy's upstream (staging, tests).
    upstream_overrides: dict[str, str] = Field(default_factory=dict)
    instance_id: str = Field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    pool_min_size: Annotated[int, Field(ge=1)] = 2
    pool_max_size: Annotated[int, Field(ge=1)] = 10
    pool_acquire_timeout_seconds: Annotated[float, Field(gt=0)] = 5.0
    statement_timeout_ms: Annotated[int, Field(gt=0)] = 5000
    # Added to a provider's total timeout: an attempt's lease outlives the attempt itself.
    lease_margin_seconds: Annotated[float, Field(ge=0)] = 5.0
    # A generous bound on client connections held idle between requests.
    keepalive_timeout_seconds: Annotated[float, Field(gt=0)] = 75.0
    log_level: str = "info"

    @field_validator("agent_listen", "ops_listen")
    @classmethod
    def _valid_address(cls, value: str) -> str:
        return _host_port(value)

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
