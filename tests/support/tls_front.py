"""A provider's own TLS, for forward-mode tests: a test CA (trustme) and a TLS front.

``tls_front`` terminates TLS on 127.0.0.1 port 0 with a certificate for test host names
(``provider.test``...) issued by the session's test CA, and relays the bytes to a plain-HTTP
server on loopback (the fault provider, localstripe). opgate is told to trust the test CA
(``upstream_ca_file``) and to resolve the names to 127.0.0.1 (``forward_static_hosts``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

TEST_HOSTS = ("provider.test", "stripe.test", "tunnel.test", "blocked.test")


@pytest.fixture(scope="session")
def provider_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def provider_ca_file(provider_ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("provider-ca") / "provider-ca.pem"
    provider_ca.cert_pem.write_to_path(str(path))
    return path


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def tls_front(ca: trustme.CA, upstream_port: int) -> AsyncIterator[int]:
    """Serve TLS for every name in TEST_HOSTS, relaying to 127.0.0.1:upstream_port."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*TEST_HOSTS).configure_cert(context)
    relays: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        relays.add(task)
        writers.append(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
            writers.append(up_writer)
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
        finally:
            relays.discard(task)

    server = await asyncio.start_server(relay, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in writers:
            writer.close()
        for task in list(relays):
            task.cancel()
        await asyncio.gather(*relays, return_exceptions=True)
        await server.wait_closed()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])
