"""opgate itself, in-process on loopback port 0, wired exactly as ``opgate serve`` wires it.

Agents and tokens used across the suite:
- ``AGENT_TOKEN``: agent ``agent-a`` of tenant ``t1``; ``SECOND_AGENT_TOKEN``: ``agent-c`` of
  ``t1``; ``OTHER_TENANT_TOKEN``: ``agent-b`` of ``t2``.
- ``ADMIN_TOKEN`` for the operations API. ``PROVIDER_SECRET`` is what providers must receive.
"""

from __future__ import annotations

import contextlib
import json
import textwrap
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from proxy.gate.identity import token_digest
from proxy.server import Running, running
from proxy.settings import Settings
from tests.support.paths import POLICIES

AGENT_TOKEN = "opg_test_agent_a_token_0123456789"
SECOND_AGENT_TOKEN = "opg_test_agent_c_token_0123456789"
OTHER_TENANT_TOKEN = "opg_test_agent_b_token_9876543210"
ADMIN_TOKEN = "opg_test_admin_token_abcdefabcdef"
PROVIDER_SECRET = "sk_test_provider_secret_never_logged"
# Standard Webhooks' form: whsec_ + base64 of the key (here 32 bytes)
WEBHOOK_SECRET = "whsec_dGVzdC13ZWJob29rLWtleS0wMTIzNDU2Nzg5YWJjZGVm"
SHIPPED_POLICIES = POLICIES
# The suite's default approval: a fault-provider refund of 5.00 of charge ch_1.
REFUND_APPROVAL: dict[str, Any] = {
    "tenant": "t1",
    "provider": "fault",
    "action": "refund.create",
    "amount": 500,
    "currency": "usd",
    "params": {"charge": "ch_1"},
    "approval_ref": "ticket-1",
    "approved_by": "alice@example.com",
    "ttl_seconds": 600,
}


def fault_policy(
    *,
    deduplicates: bool,
    body: str = "form",
    total_timeout: float = 2.0,
    grace_seconds: float | None = None,
    max_attempts: int = 2,
    retry_seconds: float = 0.05,
    escalated_retry_seconds: float | None = None,
    retention_seconds: float = 86400,
) -> str:
    """A provider policy for the fault provider; ``body`` is form or json. With
    ``grace_seconds``, refunds are reconciled by listing the charge's refunds (form only).
    A deduplicating provider keeps its keys ``retention_seconds``."""
    reconcile = (
        ""
        if grace_seconds is None
        else (
            "\n            reconcile:"
            "\n              lookups: [{path: /v1/refunds, query: {charge: '{charge}'},"
            " absence_is_conclusive: true}]"
            f"\n              grace_seconds: {grace_seconds}"
            f"\n              max_attempts: {max_attempts}"
            f"\n              retry_seconds: {retry_seconds}"
            + (
                f"\n              escalated_retry_seconds: {escalated_retry_seconds}"
                if escalated_retry_seconds is not None
                else ""
            )
        )
    )
    dedup = str(deduplicates).lower()
    if deduplicates:
        dedup += f", retention_seconds: {retention_seconds:g}"
    injection = (
        "{kind: form_field, field: 'metadata[operation_id]'}"
        if body == "form"
        else "{kind: json_pointer, pointer: /metadata/operation_id}"
    )
    field = (lambda name: name) if body == "form" else (lambda name: "/" + name)
    free = "['metadata[*]', reason]" if body == "form" else "['/metadata/*', /reason]"
    return textwrap.dedent(f"""\
        version: 1
        provider: fault
        route_prefix: /fault
        upstream: http://127.0.0.1:9
        credential: {{header: Authorization, scheme: Bearer, secret: fault_key}}
        idempotency: {{header: Idempotency-Key, provider_deduplicates: {dedup}}}
        metadata_injection: {injection}
        timeouts: {{connect_seconds: 2, total_seconds: {total_timeout}}}
        classify: {{confirmed: [2xx], failed: [400, 402, 404], object_id: /id}}
        rules:
          - name: refund.create
            method: POST
            path: /v1/refunds
            body: {body}
            amount: {field("amount")}
            currency: {field("currency")}
            params: [{field("charge")}]
            free: {free}{reconcile}
          - name: refund.cancel
            method: POST
            path: /v1/refunds/{{refund}}/cancel
            body: {body}
            inject_metadata: false
          - name: read
            method: GET
            path: /v1/{{resource...}}
            operation: none
            body: none
        """)


def make_settings(database_url: str, policy_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "policy_dir": policy_dir,
        "agent_listen": "127.0.0.1:0",
        # off unless a test turns it on (it creates a CA in its data directory)
        "forward_listen": None,
        "ops_listen": "127.0.0.1:0",
        "admin_token_sha256": token_digest(ADMIN_TOKEN),
        "agents": [
            {"id": "agent-a", "tenant": "t1", "token_sha256": token_digest(AGENT_TOKEN)},
            {"id": "agent-c", "tenant": "t1", "token_sha256": token_digest(SECOND_AGENT_TOKEN)},
            {"id": "agent-b", "tenant": "t2", "token_sha256": token_digest(OTHER_TENANT_TOKEN)},
        ],
        "pool_max_size": 10,
        "pool_acquire_timeout_seconds": 2.0,
        # The background reconciler stays out of the way unless a test asks for it.
        "background_interval_seconds": 3600.0,
        **overrides,
    }
    return Settings(**values)


@dataclass
class Opgate:
    """A running opgate and the calls tests make to it."""

    running: Running
    http: aiohttp.ClientSession

    @property
    def agent_url(self) -> str:
        return self.running.agent_url

    @property
    def ops_url(self) -> str:
        return self.running.ops_url

    async def approve(self, **fields: Any) -> dict[str, Any]:
        """Create an operation through the operations API (defaults: a fault-provider refund)."""
        body = {**REFUND_APPROVAL, **fields}
        async with self.http.post(
            f"{self.ops_url}/v1/operations", json=body, headers=admin_headers()
        ) as response:
            payload: dict[str, Any] = await response.json(content_type=None)
            assert response.status == 201, payload
            return payload

    async def operation(self, operation_id: str) -> dict[str, Any]:
        async with self.http.get(
            f"{self.ops_url}/v1/operations/{operation_id}", headers=admin_headers()
        ) as response:
            assert response.status == 200
            payload: dict[str, Any] = await response.json()
            return payload

    async def send(
        self,
        path: str,
        *,
        data: str | bytes | None = None,
        headers: dict[str, str] | None = None,
        method: str = "POST",
        token: str | None = AGENT_TOKEN,
        content_type: str | None = "application/x-www-form-urlencoded",
    ) -> tuple[int, dict[str, str], bytes]:
        """One agent request; returns status, headers and body."""
        sent: dict[str, str] = {}
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if content_type is not None and data is not None:
            sent["Content-Type"] = content_type
        sent.update(headers or {})
        async with self.http.request(
            method, f"{self.agent_url}{path}", data=data, headers=sent
        ) as response:
            return response.status, dict(response.headers), await response.read()


def process_env(
    database_url: str, policy_dir: Path, upstream_overrides: dict[str, str], **extra: str
) -> dict[str, str]:
    """OPGATE_* settings for an opgate *process* (``python -m proxy serve``): the suite's agent
    ``agent-a``, admin token and provider secrets, plus ``extra`` (OPGATE_... = value)."""
    return {
        "OPGATE_DATABASE_URL": database_url,
        "OPGATE_POLICY_DIR": str(policy_dir),
        "OPGATE_ADMIN_TOKEN_SHA256": token_digest(ADMIN_TOKEN),
        "OPGATE_AGENTS": json.dumps(
            [{"id": "agent-a", "tenant": "t1", "token_sha256": token_digest(AGENT_TOKEN)}]
        ),
        "OPGATE_SECRET_FAULT_KEY": PROVIDER_SECRET,
        "OPGATE_SECRET_STRIPE_API_KEY": PROVIDER_SECRET,
        "OPGATE_SECRET_WEBHOOK_KEY": WEBHOOK_SECRET,
        "OPGATE_UPSTREAM_OVERRIDES": json.dumps(upstream_overrides),
        **extra,
    }


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def problem(body: bytes) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(body)
    return payload


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(trust_env=False) as session:
        yield session


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    """An empty policy directory of the test's own; tests write the files they need."""
    directory = tmp_path / "policies"
    directory.mkdir()
    return directory


StartOpgate = Callable[..., contextlib.AbstractAsyncContextManager[Opgate]]


@pytest.fixture
def start_opgate(
    database_url: str,
    policy_dir: Path,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> StartOpgate:
    """A factory: ``async with start_opgate(**settings) as gate`` runs opgate for the block."""
    monkeypatch.setenv("OPGATE_SECRET_FAULT_KEY", PROVIDER_SECRET)
    monkeypatch.setenv("OPGATE_SECRET_STRIPE_API_KEY", PROVIDER_SECRET)
    # escalation notices leave only signed (proxy/recovery/webhooks.py)
    monkeypatch.setenv("OPGATE_SECRET_WEBHOOK_KEY", WEBHOOK_SECRET)

    @contextlib.asynccontextmanager
    async def start(**overrides: Any) -> AsyncIterator[Opgate]:
        settings = make_settings(
            overrides.pop("database_url", database_url),
            overrides.pop("policy_dir", policy_dir),
            **overrides,
        )
        async with running(settings) as run:
            yield Opgate(run, http)

    return start


@pytest_asyncio.fixture(loop_scope="session")
async def fault_gate(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: Any
) -> AsyncIterator[Opgate]:
    """opgate in front of the fault provider, which does NOT deduplicate on the key."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        yield gate
