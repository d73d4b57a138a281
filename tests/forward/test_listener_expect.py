"""``Expect`` on the forward listener (absolute-form, HTTP_PROXY): ``100 Continue`` only once the
agent is authenticated and the host decided, and any other expectation refused by the pipeline
as a problem with its audit record. Raw sockets: the interim answer is what is tested."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest_asyncio
from structlog.testing import capture_logs

from tests.support.audit_logs import audits
from tests.support.fault_provider import FaultProvider
from tests.support.forward import LOOPBACK_ALLOWED
from tests.support.opgate import AGENT_TOKEN, Opgate, StartOpgate, fault_policy
from tests.support.raw_http import READ_SECONDS

BODY = b"amount=500&currency=usd&charge=ch_1"
PROXY_AUTH = "Basic " + base64.b64encode(f"agent:{AGENT_TOKEN}".encode()).decode()


@pytest_asyncio.fixture(loop_scope="session")
async def forward_only(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, tmp_path: Path
) -> AsyncIterator[Opgate]:
    """opgate with its forward listener, in front of the plain-HTTP fault provider."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False) + LOOPBACK_ALLOWED)
    async with start_opgate(
        forward_listen="127.0.0.1:0",
        ca_dir=tmp_path / "ca",
        upstream_overrides={"fault": fault_provider.url},
    ) as gate:
        yield gate


async def send_head(
    gate: Opgate, url: str, headers: dict[str, str]
) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter]:
    """The head of ``POST url`` (absolute-form) with ``Expect: 100-continue`` and no body yet;
    the first status line the proxy answers with."""
    assert gate.running.forward_url is not None
    proxy = urlsplit(gate.running.forward_url)
    reader, writer = await asyncio.open_connection(proxy.hostname, proxy.port)
    lines = [
        f"POST {url} HTTP/1.1",
        f"Host: {urlsplit(url).netloc}",
        "Content-Type: application/x-www-form-urlencoded",
        f"Content-Length: {len(BODY)}",
        "Expect: 100-continue",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await writer.drain()
    status = (await asyncio.wait_for(reader.readline(), READ_SECONDS)).decode().strip()
    return status, reader, writer


async def test_no_invitation_before_proxy_authentication_or_for_a_refused_host(
    forward_only: Opgate, fault_provider: FaultProvider
) -> None:
    """No Proxy-Authorization: 407, not 100 Continue; an authenticated agent addressing a host
    no policy names: 403, not 100 Continue. Both are on record; nothing reaches the provider."""
    with capture_logs() as logs:
        status, _, writer = await send_head(forward_only, f"{fault_provider.url}/v1/refunds", {})
        writer.close()
        assert status == "HTTP/1.1 407 Proxy Authentication Required"
        status, _, writer = await send_head(
            forward_only, "http://unlisted.test/v1/refunds", {"Proxy-Authorization": PROXY_AUTH}
        )
        writer.close()
        assert status == "HTTP/1.1 403 Forbidden"
    assert [r["reason"] for r in audits(logs)] == ["proxy_auth_required", "host_not_allowed"]
    assert fault_provider.requests == []


async def test_an_authenticated_request_to_a_decided_host_is_invited(
    forward_only: Opgate, fault_provider: FaultProvider
) -> None:
    """Authenticated, the host decided and the headers passing: 100 Continue, then the body,
    then the provider's answer, forwarded once without ``Expect``."""
    op = await forward_only.approve()
    status, reader, writer = await send_head(
        forward_only,
        f"{fault_provider.url}/v1/refunds",
        {"Proxy-Authorization": PROXY_AUTH, "X-Operation-Id": op["operation_id"]},
    )
    try:
        assert status == "HTTP/1.1 100 Continue"
        await reader.readline()  # the blank line that ends the interim answer
        writer.write(BODY)
        await writer.drain()
        final = (await asyncio.wait_for(reader.readline(), READ_SECONDS)).decode().strip()
    finally:
        writer.close()
    assert final == "HTTP/1.1 200 OK"
    [sent] = fault_provider.requests
    assert "Expect" not in sent.headers


async def test_an_unknown_expectation_on_the_forward_listener_is_a_problem_on_record(
    forward_only: Opgate, fault_provider: FaultProvider
) -> None:
    """``Expect: something-else`` through the proxy: 417 problem+json from the pipeline, with
    its audit record (aiohttp's own 417 had neither)."""
    op = await forward_only.approve()
    assert forward_only.running.forward_url is not None
    proxy = urlsplit(forward_only.running.forward_url)
    url = f"{fault_provider.url}/v1/refunds"
    head = "\r\n".join(
        [
            f"POST {url} HTTP/1.1",
            f"Host: {urlsplit(url).netloc}",
            "Connection: close",
            "Content-Type: application/x-www-form-urlencoded",
            f"Content-Length: {len(BODY)}",
            "Expect: something-else",
            f"Proxy-Authorization: {PROXY_AUTH}",
            f"X-Operation-Id: {op['operation_id']}",
        ]
    )
    with capture_logs() as logs:
        reader, writer = await asyncio.open_connection(proxy.hostname, proxy.port)
        try:
            writer.write(head.encode() + b"\r\n\r\n" + BODY)
            await writer.drain()
            raw = await asyncio.wait_for(reader.read(), READ_SECONDS)
        finally:
            writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 417 Expectation Failed"
    assert b"application/problem+json" in rest.partition(b"\r\n\r\n")[0]
    assert b'"expectation_unsupported"' in rest
    [record] = audits(logs)
    assert (record["listener"], record["reason"]) == ("forward", "expectation_unsupported")
    assert fault_provider.requests == []


async def connect_first_line(gate: Opgate, target: str, headers: dict[str, str]) -> str:
    """The first status line the proxy answers ``CONNECT target`` with."""
    assert gate.running.forward_url is not None
    proxy = urlsplit(gate.running.forward_url)
    reader, writer = await asyncio.open_connection(proxy.hostname, proxy.port)
    try:
        lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        return (await asyncio.wait_for(reader.readline(), READ_SECONDS)).decode().strip()
    finally:
        writer.close()


async def test_a_connect_gets_no_invitation_and_an_unknown_expectation_is_on_record(
    forward_only: Opgate, fault_provider: FaultProvider
) -> None:
    """CONNECT with ``Expect: 100-continue``: no 100 (a CONNECT has no body to invite), the
    407 or the host decision instead; with another expectation, once authenticated: 417
    ``expectation_unsupported`` on record. Nothing reaches the provider."""
    target = urlsplit(fault_provider.url).netloc
    continuing = {"Expect": "100-continue"}
    with capture_logs() as logs:
        unauthenticated = await connect_first_line(forward_only, target, continuing)
        authenticated = await connect_first_line(
            forward_only, target, {**continuing, "Proxy-Authorization": PROXY_AUTH}
        )
        unknown = await connect_first_line(
            forward_only, target, {"Expect": "x-other", "Proxy-Authorization": PROXY_AUTH}
        )
    assert unauthenticated == "HTTP/1.1 407 Proxy Authentication Required"
    assert authenticated == "HTTP/1.1 403 Forbidden"  # a plain-HTTP provider is not tunnelled
    assert unknown == "HTTP/1.1 417 Expectation Failed"
    assert [(r["method"], r["reason"]) for r in audits(logs)] == [
        ("CONNECT", "proxy_auth_required"),
        ("CONNECT", "host_not_allowed"),
        ("CONNECT", "expectation_unsupported"),
    ]
    assert fault_provider.requests == []
