"""The agent's identity toward a provider that verifies signed agent requests (RFC 9421; Visa's
Trusted Agent Protocol, Web Bot Auth): opgate signs what leaves with the key it holds for the
agent, and the provider's verifier (the library's, not opgate's) accepts it."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from joserfc.jwk import OKPKey

from tests.support.opgate import (
    SECOND_AGENT_TOKEN,
    Opgate,
    StartOpgate,
    fault_policy,
    make_settings,
)
from tests.support.signing_provider import (
    SigningProvider,
    resolve_directory,
    running_signing_provider,
)

TAG = "agent-payer-auth"
AGENT_KEY = OKPKey.generate_key("Ed25519")
KEY_ID = AGENT_KEY.thumbprint()  # RFC 7638, as Web Bot Auth names keys


def signing_policy() -> str:
    """The fault provider's policy with signing switched on for it."""
    return fault_policy(deduplicates=False).replace(
        "classify:",
        f"agent_signature: {{tag: {TAG}, expires_seconds: 60}}\nclassify:",
        1,
    )


@pytest_asyncio.fixture(loop_scope="session")
async def provider() -> AsyncIterator[SigningProvider]:
    public = AGENT_KEY.public_key  # cryptography's Ed25519 public key
    async with running_signing_provider(TAG, {KEY_ID: public}) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="session")
async def gate(
    start_opgate: StartOpgate,
    policy_dir: Path,
    provider: SigningProvider,
    tmp_path: Path,
    database_url: str,
) -> AsyncIterator[Opgate]:
    (policy_dir / "fault.yaml").write_text(signing_policy())
    key_file = tmp_path / "agent-a.jwk.json"
    key_file.write_text(json.dumps(AGENT_KEY.as_dict(private=True)))
    agents = [
        a.model_dump() for a in make_settings(database_url, policy_dir).agents
    ]  # the harness's agents, agent-a with its signing key
    agents[0]["signing_key_file"] = key_file
    async with start_opgate(upstream_overrides={"fault": provider.url}, agents=agents) as running:
        yield running


async def test_what_leaves_is_signed_with_the_agents_key(
    gate: Opgate, provider: SigningProvider
) -> None:
    """An approved refund and a read leave signed over @authority, @path and content-digest,
    with created, expires (60 s later), a fresh nonce, the agent's keyid and the policy's tag;
    the provider's verifier accepts both."""
    op = await gate.approve()
    status, _, body = await gate.send(
        "/fault/v1/refunds",
        data="charge=ch_1&amount=500&currency=usd",
        headers={"X-Operation-Id": op["operation_id"]},
    )
    assert status == 200, body
    status, _, body = await gate.send("/fault/v1/charges/ch_1", method="GET", data=None)
    assert status == 200, body
    assert provider.refused == []
    assert len(provider.verified) == 2
    now = int(time.time())
    nonces = set()
    for signed in provider.verified:
        parameters = signed["parameters"]
        assert (parameters["keyid"], parameters["tag"]) == (KEY_ID, TAG)
        assert parameters["expires"] - parameters["created"] == 60
        assert abs(parameters["created"] - now) < 30
        nonces.add(parameters["nonce"])
        assert signed["components"][:3] == ['"@authority"', '"@path"', '"content-digest"']
    assert len(nonces) == 2
    assert provider.verified[0]["body"].startswith(b"charge=ch_1&amount=500")


async def test_an_agent_without_a_key_is_refused_before_anything_leaves(
    gate: Opgate, provider: SigningProvider
) -> None:
    """A provider that requires signed requests is not called for an agent opgate holds no
    key for: agent_signing_key_missing, and the provider sees nothing."""
    status, _, body = await gate.send(
        "/fault/v1/charges/ch_1", method="GET", data=None, token=SECOND_AGENT_TOKEN
    )
    assert (status, json.loads(body)["code"]) == (403, "agent_signing_key_missing")
    assert (provider.verified, provider.refused) == ([], [])


async def test_the_provider_resolves_the_agents_key_from_opgates_key_directory(
    gate: Opgate, provider: SigningProvider
) -> None:
    """Web Bot Auth's key directory on the agent listener lists the agent's public key (its
    thumbprint as kid) with a response signature by that key; a provider that knew no key
    before takes it from there and verifies what opgate signs as the agent."""
    provider.keys.clear()
    provider.keys.update(await resolve_directory(gate.http, gate.agent_url))
    assert list(provider.keys) == [KEY_ID]
    status, _, body = await gate.send("/fault/v1/charges/ch_1", method="GET", data=None)
    assert status == 200, body
    assert (len(provider.verified), provider.refused) == (1, [])


async def test_a_signature_agent_names_opgates_directory_and_is_signed(
    start_opgate: StartOpgate,
    provider: SigningProvider,
    tmp_path: Path,
    database_url: str,
    policy_dir: Path,
) -> None:
    """With ``signature_agent`` set, each signed request carries Web Bot Auth's
    ``Signature-Agent: sig1="<origin>"`` (the agent's own never leaves), covered by the
    signature as ``"signature-agent";key="sig1"``; the provider's verifier accepts it."""
    (policy_dir / "fault.yaml").write_text(signing_policy())
    key_file = tmp_path / "agent-a.jwk.json"
    key_file.write_text(json.dumps(AGENT_KEY.as_dict(private=True)))
    agents = [a.model_dump() for a in make_settings(database_url, policy_dir).agents]
    agents[0]["signing_key_file"] = key_file
    async with start_opgate(
        upstream_overrides={"fault": provider.url},
        agents=agents,
        signature_agent="https://opgate.example",
    ) as gate:
        status, _, body = await gate.send(
            "/fault/v1/charges/ch_1",
            method="GET",
            data=None,
            headers={"Signature-Agent": 'sig1="https://agent.example"'},
        )
    assert status == 200, body
    assert provider.refused == []
    [signed] = provider.verified
    assert signed["components"][3] == '"signature-agent";key="sig1"'
    assert provider.signature_agents == ['sig1="https://opgate.example"']
