"""Forward-proxy mode end to end: real clients configured with HTTPS_PROXY/HTTP_PROXY, real
TLS (opgate's CA towards the agent, a test CA for the provider), the fault provider and
localstripe as ground truth, and the audit records each request leaves."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import trustme
from aiohttp import web
from structlog.testing import capture_logs

import proxy.observe.record_life
from proxy.forward.ca import CA_CERT_FILE
from proxy.observe.audit import AuditRecord
from tests.support.fault_provider import FaultProvider
from tests.support.forward import LOOPBACK_ALLOWED
from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.opgate import (
    AGENT_TOKEN,
    OTHER_TENANT_TOKEN,
    PROVIDER_SECRET,
    SHIPPED_POLICIES,
    Opgate,
    StartOpgate,
    fault_policy,
    problem,
)
from tests.support.polling import until
from tests.support.tls_front import (  # noqa: F401  (fixtures)
    TEST_HOSTS,
    port_of,
    provider_ca,
    provider_ca_file,
    tls_front,
)

GOOD_FORM = {"amount": "500", "currency": "usd", "charge": "ch_1"}


def blocked_policy(port: int) -> str:
    """A provider whose host resolves to loopback without the policy allowing it."""
    return textwrap.dedent(f"""\
        version: 1
        provider: blocked
        route_prefix: /blocked
        upstream: https://blocked.test:{port}
        rules:
          - {{name: read, method: GET, path: "/v1/{{rest...}}", operation: none, body: none}}
        """)


@dataclass
class ForwardGate:
    gate: Opgate
    proxy_url: str  # http://127.0.0.1:PORT, no credentials
    provider_url: str  # https://provider.test:PORT (the fault provider behind TLS)
    tls_port: int
    ca_file: Path  # opgate's CA certificate: what agents trust

    def proxy_with(self, token: str | None) -> str:
        host = self.proxy_url.removeprefix("http://")
        return f"http://agent:{token}@{host}" if token else self.proxy_url

    def agent_client(self, token: str | None = AGENT_TOKEN, **kwargs: Any) -> httpx.AsyncClient:
        verify = ssl.create_default_context(cafile=str(self.ca_file))
        return httpx.AsyncClient(
            proxy=self.proxy_with(token), verify=verify, trust_env=False, **kwargs
        )


@pytest_asyncio.fixture(loop_scope="session")
async def forward_gate(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    provider_ca: trustme.CA,  # noqa: F811
    provider_ca_file: Path,  # noqa: F811
    tmp_path: Path,
) -> AsyncIterator[ForwardGate]:
    """opgate with both listeners; the fault provider is at https://provider.test:PORT."""
    async with tls_front(provider_ca, port_of(fault_provider.url)) as tls_port:
        policy = fault_policy(deduplicates=False) + LOOPBACK_ALLOWED
        policy += f"  pass_through: [{{host: tunnel.test, port: {tls_port}}}]\n"
        (policy_dir / "fault.yaml").write_text(policy)
        (policy_dir / "blocked.yaml").write_text(blocked_policy(tls_port))
        provider_url = f"https://provider.test:{tls_port}"
        async with start_opgate(
            forward_listen="127.0.0.1:0",
            ca_dir=tmp_path / "ca",
            forward_static_hosts={name: "127.0.0.1" for name in TEST_HOSTS},
            upstream_ca_file=provider_ca_file,
            upstream_overrides={"fault": provider_url},
        ) as gate:
            assert gate.running.forward_url is not None
            yield ForwardGate(
                gate,
                gate.running.forward_url,
                provider_url,
                tls_port,
                tmp_path / "ca" / CA_CERT_FILE,
            )


def audit_records(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry.get("event") == "request" and "decision" in entry]


async def run_agent(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run a real client in its own process, with only the environment given."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(60):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def agent_env(fg: ForwardGate, tmp_path: Path) -> dict[str, str]:
    """An agent's whole environment: a proxy URL with its token, and opgate's CA to trust."""
    ca = str(fg.ca_file)
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "HTTPS_PROXY": fg.proxy_with(AGENT_TOKEN),
        "https_proxy": fg.proxy_with(AGENT_TOKEN),
        "SSL_CERT_FILE": ca,
        "REQUESTS_CA_BUNDLE": ca,
        "CURL_CA_BUNDLE": ca,
    }


PYTHON_AGENT = """
import sys, {module}
answer = {module}.post(sys.argv[1], data={{"amount": "500", "currency": "usd", "charge": "ch_1"}},
                       headers={{"Idempotency-Key": sys.argv[2]}})
print(answer.status_code)
print(answer.text)
"""


async def test_unmodified_clients_reach_an_https_provider_through_the_proxy(
    forward_gate: ForwardGate, fault_provider: FaultProvider, tmp_path: Path
) -> None:
    """requests, httpx and curl, given only HTTPS_PROXY and a CA bundle, each refund once
    through opgate; the provider gets opgate's credential and never the agent's token."""
    env = agent_env(forward_gate, tmp_path)
    url = f"{forward_gate.provider_url}/v1/refunds"
    agents = {
        "requests": lambda key: [
            sys.executable,
            "-c",
            PYTHON_AGENT.format(module="requests"),
            url,
            key,
        ],
        "httpx": lambda key: [sys.executable, "-c", PYTHON_AGENT.format(module="httpx"), url, key],
        "curl": lambda key: [
            "curl",
            "-sS",
            "-w",
            "%{http_code}\n",
            "-o",
            "/dev/null",
            "-H",
            f"Idempotency-Key: {key}",
            "-d",
            "amount=500",
            "-d",
            "currency=usd",
            "-d",
            "charge=ch_1",
            url,
        ],
    }
    for name, argv in agents.items():
        op = await forward_gate.gate.approve()
        code, out, err = await run_agent(argv(op["idempotency_key"]), env)
        assert (code, out.split("\n")[0]) == (0, "200"), (name, out, err)
        row = await forward_gate.gate.operation(op["operation_id"])
        assert row["status"] == "confirmed", name
    assert [e.operation_id for e in fault_provider.effects] == [
        r.headers["X-Operation-Id"] for r in fault_provider.requests
    ]
    assert len(fault_provider.effects) == 3
    for received in fault_provider.requests:
        assert received.headers["Authorization"] == f"Bearer {PROVIDER_SECRET}"
        assert AGENT_TOKEN not in str(received.headers)
        assert "Proxy-Authorization" not in received.headers


STRIPE_AGENT = """
import os, sys, stripe
stripe.enable_telemetry = False
stripe.ca_bundle_path = os.environ["SSL_CERT_FILE"]  # the SDK ships its own bundle otherwise
client = stripe.StripeClient("sk_test_unused_opgate_injects_the_key",
                             base_addresses={"api": sys.argv[1]})
refund = client.v1.refunds.create(params={"charge": sys.argv[2], "amount": 500},
                                  options={"idempotency_key": sys.argv[3]})
print(refund.id)
"""


async def test_stripe_sdk_refunds_once_through_the_proxy(
    start_opgate: StartOpgate,
    policy_dir: Path,
    localstripe_url: str,
    provider_ca: trustme.CA,  # noqa: F811
    provider_ca_file: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The official SDK (default RequestsClient, HTTPS_PROXY) refunds an approved operation on
    localstripe behind TLS: exactly one refund there, carrying the operation id."""
    shipped = (SHIPPED_POLICIES / "stripe.yaml").read_text()
    (policy_dir / "stripe.yaml").write_text(shipped + "\n" + LOOPBACK_ALLOWED)
    async with tls_front(provider_ca, port_of(localstripe_url)) as tls_port:
        stripe_url = f"https://stripe.test:{tls_port}"
        async with start_opgate(
            forward_listen="127.0.0.1:0",
            ca_dir=tmp_path / "ca",
            forward_static_hosts={"stripe.test": "127.0.0.1"},
            upstream_ca_file=provider_ca_file,
            upstream_overrides={"stripe": stripe_url},
        ) as gate:
            assert gate.running.forward_url is not None
            fg = ForwardGate(
                gate, gate.running.forward_url, stripe_url, tls_port, tmp_path / "ca" / CA_CERT_FILE
            )
            charge = await create_charge(localstripe_url, 2000)
            op = await gate.approve(
                provider="stripe",
                action="refund.create",
                amount=500,
                currency=None,
                params={"charge": charge},
            )
            argv = [sys.executable, "-c", STRIPE_AGENT, stripe_url, charge, op["idempotency_key"]]
            code, out, err = await run_agent(argv, agent_env(fg, tmp_path))
            assert code == 0, err
            [refund] = await list_refunds(localstripe_url, charge=charge)
            assert refund["id"] == out.strip()
            assert refund["amount"] == 500
            assert refund["metadata"]["operation_id"] == op["operation_id"]
            row = await gate.operation(op["operation_id"])
            assert (row["status"], row["provider_response"]["object_id"]) == (
                "confirmed",
                refund["id"],
            )


async def test_a_mismatched_amount_in_the_tunnel_is_refused_as_in_reverse_mode(
    forward_gate: ForwardGate, fault_provider: FaultProvider
) -> None:
    """The same re-planned request gets the same 422 amount_mismatch answer through the tunnel
    as through the route prefix, and the provider sees nothing."""
    op = await forward_gate.gate.approve()
    headers = {"Idempotency-Key": op["idempotency_key"]}
    body = "amount=2000&currency=usd&charge=ch_1"
    async with forward_gate.agent_client() as client:
        forwarded = await client.post(
            f"{forward_gate.provider_url}/v1/refunds",
            content=body,
            headers={**headers, "Content-Type": "application/x-www-form-urlencoded"},
        )
    status, _, reverse_body = await forward_gate.gate.send(
        "/fault/v1/refunds", data=body, headers=headers
    )
    assert forwarded.status_code == status == 422
    in_tunnel, reverse = problem(forwarded.content), problem(reverse_body)
    assert in_tunnel["code"] == reverse["code"] == "amount_mismatch"
    assert in_tunnel["operation_id"] == reverse["operation_id"] == op["operation_id"]
    assert fault_provider.requests == []
    assert (await forward_gate.gate.operation(op["operation_id"]))["status"] == "created"


async def raw_connect(
    proxy_url: str, target: str, token: str | None = AGENT_TOKEN
) -> tuple[int, dict[str, str], bytes]:
    """A bare CONNECT; returns the status, headers and body of opgate's answer."""
    host, port = proxy_url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
        if token is not None:
            basic = base64.b64encode(f"agent:{token}".encode()).decode()
            head += f"Proxy-Authorization: Basic {basic}\r\n"
        writer.write((head + "\r\n").encode())
        raw = await reader.read()  # a refused CONNECT is answered and closed
    finally:
        writer.close()
    head_bytes, _, body = raw.partition(b"\r\n\r\n")
    lines = head_bytes.decode().split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), "")
        headers[name.strip().lower()] += (
            "," if headers[name.strip().lower()] else ""
        ) + value.strip()
    return int(lines[0].split()[1]), headers, body


async def test_a_refused_connect_is_on_record_before_it_is_answered(
    forward_gate: ForwardGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A declined CONNECT's record is emitted (numbered, queued) before its refusal is written,
    as the pipeline's answers are, and once."""
    order: list[str] = []
    emit, write_eof = proxy.observe.record_life.emit, web.Response.write_eof

    def emitting(record: AuditRecord) -> None:
        order.append(f"record {record.response_status}")
        emit(record)

    async def writing_eof(self: web.Response, data: bytes = b"") -> None:
        order.append(f"answer {self.status}")
        await write_eof(self, data)

    monkeypatch.setattr(proxy.observe.record_life, "emit", emitting)  # the record's one owner
    monkeypatch.setattr(web.Response, "write_eof", writing_eof)
    target = f"unlisted.test:{forward_gate.tls_port}"
    status, _, _ = await raw_connect(forward_gate.proxy_url, target)
    assert status == 403
    assert order[:2] == ["record 403", "answer 403"]
    assert [entry for entry in order if entry.startswith("record")] == ["record 403"]


async def test_connect_decisions_unlisted_loopback_and_pass_through(
    forward_gate: ForwardGate,
    fault_provider: FaultProvider,
    provider_ca: trustme.CA,  # noqa: F811
) -> None:
    """CONNECT to an unlisted host and to a listed host that resolves to a loopback address
    its policy does not allow are refused; a pass-through host is tunnelled without
    inspection (the client sees the provider's own certificate); each is audited."""
    port = forward_gate.tls_port
    with capture_logs() as logs:
        unlisted = await raw_connect(forward_gate.proxy_url, f"unlisted.test:{port}")
        loopback = await raw_connect(forward_gate.proxy_url, f"blocked.test:{port}")
        literal = await raw_connect(forward_gate.proxy_url, f"127.0.0.1:{port}")
        provider_only = ssl.create_default_context()
        provider_ca.configure_trust(provider_only)  # opgate's CA is NOT trusted here
        async with httpx.AsyncClient(
            proxy=forward_gate.proxy_with(AGENT_TOKEN), verify=provider_only, trust_env=False
        ) as client:
            tunnelled = await client.get(f"https://tunnel.test:{port}/v1/refunds")
        await until(lambda: len(audit_records(logs)) >= 4, "the pass-through record")
    assert (unlisted[0], problem(unlisted[2])["code"]) == (403, "host_not_allowed")
    assert (loopback[0], problem(loopback[2])["code"]) == (403, "destination_not_allowed")
    assert (literal[0], problem(literal[2])["code"]) == (403, "host_not_allowed")
    assert tunnelled.status_code == 200
    # it reached the provider as sent: no opgate credential, no operation id
    [received] = fault_provider.requests
    assert "Authorization" not in received.headers
    records = {r["destination"]: r for r in audit_records(logs)}
    assert records[f"unlisted.test:{port}"]["reason"] == "host_not_allowed"
    assert records[f"blocked.test:{port}"]["reason"] == "destination_not_allowed"
    assert records[f"127.0.0.1:{port}"]["reason"] == "host_not_allowed"
    passed = records[f"tunnel.test:{port}"]
    assert (passed["decision"], passed["tunnel"], passed["method"]) == (
        "allow",
        "pass_through",
        "CONNECT",
    )
    assert passed["agent_id"] == "agent-a"
    assert passed["bytes_from_agent"] > 0
    assert passed["bytes_to_agent"] > 0
    for record in audit_records(logs):
        assert record["listener"] == "forward"


async def test_requests_on_one_kept_alive_tunnel_are_each_decided_and_audited(
    forward_gate: ForwardGate, fault_provider: FaultProvider
) -> None:
    """Three requests on one tunnel: an approved refund, a re-planned one and a read, each
    decided by the pipeline and audited on its own, under a single CONNECT."""
    op = await forward_gate.gate.approve()
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with capture_logs() as logs:
        async with forward_gate.agent_client(limits=limits) as client:
            url = f"{forward_gate.provider_url}/v1/refunds"
            key = {"Idempotency-Key": op["idempotency_key"]}
            first = await client.post(url, data=GOOD_FORM, headers=key)
            replanned = await client.post(url, data={**GOOD_FORM, "amount": "9"}, headers=key)
            read = await client.get(url)
        await until(
            lambda: any(r["method"] == "CONNECT" for r in audit_records(logs)), "the CONNECT"
        )
    assert (first.status_code, replanned.status_code, read.status_code) == (200, 422, 200)
    records = audit_records(logs)
    connects = [r for r in records if r["method"] == "CONNECT"]
    requests_ = [r for r in records if r["method"] != "CONNECT"]
    assert len(connects) == 1
    assert connects[0]["tunnel"] == "inspected"
    assert [(r["method"], r["decision"], r["reason"]) for r in requests_] == [
        ("POST", "allow", None),
        ("POST", "deny", "amount_mismatch"),
        ("GET", "allow", None),
    ]
    assert len({r["request_id"] for r in records}) == 4
    for record in requests_:
        assert (record["listener"], record["agent_id"], record["provider"]) == (
            "forward",
            "agent-a",
            "fault",
        )
        assert record["destination"] == f"provider.test:{forward_gate.tls_port}"
    assert len(fault_provider.effects) == 1


async def test_a_missing_or_wrong_proxy_token_is_answered_407(
    forward_gate: ForwardGate, fault_provider: FaultProvider
) -> None:
    """CONNECT and absolute-form requests without a valid agent token get 407 with
    Proxy-Authenticate, are audited, and nothing reaches the provider."""
    target = f"provider.test:{forward_gate.tls_port}"
    with capture_logs() as logs:
        missing = await raw_connect(forward_gate.proxy_url, target, token=None)
        wrong = await raw_connect(forward_gate.proxy_url, target, token="opg_not_a_token")
        async with httpx.AsyncClient(proxy=forward_gate.proxy_url, trust_env=False) as client:
            plain = await client.post("http://provider.test/v1/refunds", data=GOOD_FORM)
    for status, headers, body in (missing, wrong):
        assert status == 407
        assert 'Basic realm="opgate"' in headers["proxy-authenticate"]
        assert problem(body)["code"] == "proxy_auth_required"
    assert plain.status_code == 407
    assert problem(plain.content)["code"] == "proxy_auth_required"
    reasons = [r["reason"] for r in audit_records(logs)]
    assert reasons == ["proxy_auth_required"] * 3
    assert fault_provider.requests == []


async def test_another_agents_token_in_the_tunnel_is_ambiguous(
    forward_gate: ForwardGate, fault_provider: FaultProvider
) -> None:
    """Inside a tunnel the SDK's api key is replaced, but another agent's token there is
    refused as ambiguous; the agent's own token never reaches the provider."""
    op = await forward_gate.gate.approve()
    url = f"{forward_gate.provider_url}/v1/refunds"
    key = {"Idempotency-Key": op["idempotency_key"]}
    async with forward_gate.agent_client() as client:
        other = await client.post(
            url, data=GOOD_FORM, headers={**key, "Authorization": f"Bearer {OTHER_TENANT_TOKEN}"}
        )
        own = await client.post(
            url, data=GOOD_FORM, headers={**key, "Authorization": f"Bearer {AGENT_TOKEN}"}
        )
    assert (other.status_code, problem(other.content)["code"]) == (400, "ambiguous_request")
    assert own.status_code == 200
    [received] = fault_provider.requests
    assert received.headers["Authorization"] == f"Bearer {PROVIDER_SECRET}"
    assert AGENT_TOKEN not in str(received.headers)


async def tls_in_tunnel(
    fg: ForwardGate, server_name: str, host_header: str
) -> tuple[int, dict[str, Any]]:
    """CONNECT to provider.test, TLS with the given SNI, one GET with the given Host."""
    host, port = fg.proxy_url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        basic = base64.b64encode(f"agent:{AGENT_TOKEN}".encode()).decode()
        target = f"provider.test:{fg.tls_port}"
        writer.write(
            f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
            f"Proxy-Authorization: Basic {basic}\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        context = ssl.create_default_context(cafile=str(fg.ca_file))
        context.check_hostname = False  # the point is to send a name that does not match
        await writer.start_tls(context, server_hostname=server_name)
        writer.write(
            f"GET /v1/refunds HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n".encode()
        )
        raw = await reader.read()
    finally:
        writer.close()
    head_bytes, _, body = raw.partition(b"\r\n\r\n")
    return int(head_bytes.split()[1]), json.loads(body) if body.startswith(b"{") else {}


async def test_host_and_sni_must_name_the_connect_target(
    forward_gate: ForwardGate, fault_provider: FaultProvider
) -> None:
    """Inside a tunnel to provider.test, a request whose Host or SNI names another host is
    answered 421; the same request naming the target reaches the provider."""
    target = f"provider.test:{forward_gate.tls_port}"
    wrong_host = await tls_in_tunnel(forward_gate, "provider.test", "tunnel.test")
    wrong_sni = await tls_in_tunnel(forward_gate, "tunnel.test", target)
    right = await tls_in_tunnel(forward_gate, "provider.test", target)
    assert (wrong_host[0], wrong_host[1]["code"]) == (421, "misdirected_request")
    assert (wrong_sni[0], wrong_sni[1]["code"]) == (421, "misdirected_request")
    assert right[0] == 200
    assert [r.method for r in fault_provider.requests] == ["GET"]


async def test_plain_http_absolute_form_goes_through_the_pipeline(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    tmp_path: Path,
) -> None:
    """HTTP_PROXY and a plain-HTTP provider: absolute-form requests are decided by the same
    pipeline (a re-planned amount refused, the approved one forwarded once), and a Host
    header that names another host is answered 421."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False) + LOOPBACK_ALLOWED)
    async with start_opgate(
        forward_listen="127.0.0.1:0",
        ca_dir=tmp_path / "ca",
        upstream_overrides={"fault": fault_provider.url},
    ) as gate:
        assert gate.running.forward_url is not None
        proxy = gate.running.forward_url.replace("http://", f"http://agent:{AGENT_TOKEN}@")
        op = await gate.approve()
        key = {"Idempotency-Key": op["idempotency_key"]}
        url = f"{fault_provider.url}/v1/refunds"
        with capture_logs() as logs:
            async with httpx.AsyncClient(proxy=proxy, trust_env=False) as client:
                replanned = await client.post(url, data={**GOOD_FORM, "amount": "9"}, headers=key)
                misdirected = await client.post(
                    url, data=GOOD_FORM, headers={**key, "Host": "elsewhere.test"}
                )
                approved = await client.post(url, data=GOOD_FORM, headers=key)
    assert (replanned.status_code, problem(replanned.content)["code"]) == (422, "amount_mismatch")
    assert problem(misdirected.content)["code"] == "misdirected_request"
    assert approved.status_code == 200
    assert approved.headers["X-Operation-Id"] == op["operation_id"]
    [effect] = fault_provider.effects
    assert effect.metadata["operation_id"] == op["operation_id"]
    assert effect.request.headers["Authorization"] == f"Bearer {PROVIDER_SECRET}"
    assert [(r["listener"], r["reason"]) for r in audit_records(logs)] == [
        ("forward", "amount_mismatch"),
        ("forward", "misdirected_request"),
        ("forward", None),
    ]


async def test_one_operation_through_either_mode(
    forward_gate: ForwardGate, fault_provider: FaultProvider
) -> None:
    """Both listeners run at once: an operation refunded through the proxy is replayed, not
    repeated, when the same call comes through the route prefix."""
    op = await forward_gate.gate.approve()
    key = {"Idempotency-Key": op["idempotency_key"]}
    async with forward_gate.agent_client() as client:
        forwarded = await client.post(
            f"{forward_gate.provider_url}/v1/refunds", data=GOOD_FORM, headers=key
        )
    status, headers, _ = await forward_gate.gate.send(
        "/fault/v1/refunds", data="amount=500&currency=usd&charge=ch_1", headers=key
    )
    assert forwarded.status_code == status == 200
    assert headers["Idempotent-Replayed"] == "true"
    assert len(fault_provider.effects) == 1


async def test_an_agent_that_does_not_trust_the_ca_leaves_no_connection_behind(
    forward_gate: ForwardGate,
) -> None:
    """A failed TLS handshake inside a CONNECT is audited, and the listener's connection set
    empties again (the taken-over handler is released)."""
    listener_server = _forward_server(forward_gate.gate)
    with capture_logs() as logs:
        async with httpx.AsyncClient(
            proxy=forward_gate.proxy_with(AGENT_TOKEN), verify=True, trust_env=False
        ) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"{forward_gate.provider_url}/v1/refunds")
        await until(lambda: len(audit_records(logs)) == 1, "the CONNECT record")
    [record] = audit_records(logs)
    assert record["reason"] == "tls_handshake_failed"
    assert record["decision"] == "error"  # nothing was forwarded: not an "allow"
    await until(lambda: len(listener_server.connections) == 0, "connections released")


def _forward_server(gate: Opgate) -> web.Server:
    listener = gate.running.forward_listener
    assert listener is not None
    assert listener.server is not None
    return listener.server


async def test_forward_mode_carries_the_trace_and_times_the_provider(
    forward_gate: ForwardGate, fault_provider: FaultProvider
) -> None:
    """A request through the proxy reaches the provider with a W3C traceparent in the agent's
    trace, as in reverse mode, and its provider call is in the upstream latency histogram."""
    op = await forward_gate.gate.approve()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {
        "Idempotency-Key": op["idempotency_key"],
        "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
    }
    async with forward_gate.agent_client() as client:
        answer = await client.post(
            f"{forward_gate.provider_url}/v1/refunds", data=GOOD_FORM, headers=headers
        )
    assert answer.status_code == 200
    [received] = [r for r in fault_provider.requests if r.method == "POST"]
    version, sent_trace_id, parent_id, _flags = received.headers["traceparent"].split("-")
    assert (version, sent_trace_id) == ("00", trace_id)
    assert len(parent_id) == 16
    assert parent_id != "00f067aa0ba902b7"  # opgate's own span, not the agent's
    async with forward_gate.gate.http.get(f"{forward_gate.gate.ops_url}/metrics") as response:
        metrics = await response.text()
    counts = [
        line for line in metrics.splitlines() if line.startswith("opgate_upstream_seconds_count")
    ]
    assert counts
    assert counts[0].endswith(" 1")


async def test_reverse_mode_and_lookups_reach_a_private_ca_provider_by_its_static_host(
    forward_gate: ForwardGate, fault_provider: FaultProvider
) -> None:
    """The provider is https://provider.test (a static host, a private CA): reverse mode, and
    the reconciliation lookups made with the same client, reach it as forward mode does."""
    op = await forward_gate.gate.approve()
    status, _, body = await forward_gate.gate.send(
        "/fault/v1/refunds",
        data="amount=500&currency=usd&charge=ch_1",
        headers={"X-Operation-Id": op["operation_id"]},
    )
    assert status == 200, body
    assert len(fault_provider.effects) == 1
    client = forward_gate.gate.running.gateway.client  # the reconciliation lookups' client too
    async with client.get(f"{forward_gate.provider_url}/v1/refunds") as answer:
        assert answer.status == 200
