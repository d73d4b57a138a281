"""Assemble and run opgate: open the resources, serve both listeners, close them in order.

``running(settings)`` is what ``opgate serve`` and the tests both use, so the tests run the
same wiring as production.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import structlog
from aiohttp import web

from proxy.checks import Agent
from proxy.credentials import CredentialSource
from proxy.gateway import GATEWAY, Gateway
from proxy.identity import AgentDirectory
from proxy.ops_api import add_routes, require_admin, store_errors
from proxy.pipeline import handle_agent_request
from proxy.policy.load import load_policy_dir
from proxy.settings import Settings, split_host_port
from proxy.store.migrate import migrate
from proxy.store.store import Store
from proxy.upstream import new_client_session

_log = structlog.get_logger("opgate.server")


@dataclass(frozen=True)
class Running:
    gateway: Gateway
    agent_url: str
    ops_url: str


def agent_directory(settings: Settings) -> AgentDirectory:
    return AgentDirectory(
        {a.token_sha256: Agent(agent_id=a.id, tenant=a.tenant) for a in settings.agents}
    )


@contextlib.asynccontextmanager
async def database_dsn(settings: Settings) -> AsyncIterator[str]:
    """The primary's URL, or an embedded PostgreSQL in the data directory when none is given."""
    if settings.database_url:
        yield settings.database_url
        return
    from proxy.store.embedded import start_embedded  # the embedded server is optional at runtime

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    embedded = await asyncio.to_thread(start_embedded, settings.data_dir)
    _log.info("embedded_postgres_started", data_dir=str(settings.data_dir))
    try:
        yield embedded.dsn
    finally:
        await asyncio.to_thread(embedded.stop)


def agent_app(gateway: Gateway) -> web.Application:
    app = web.Application(client_max_size=0)
    app[GATEWAY] = gateway
    # Every method and path reaches the pipeline; routing is the policy's job, deny by default.
    app.router.add_route("*", "/{tail:.*}", handle_agent_request)
    return app


def ops_app(gateway: Gateway) -> web.Application:
    app = web.Application(middlewares=[require_admin, store_errors])
    app[GATEWAY] = gateway
    add_routes(app)
    return app


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Running]:
    """opgate serving on both listeners until the block exits."""
    policy = load_policy_dir(settings.policy_dir)
    async with database_dsn(settings) as dsn:
        await migrate(dsn)
        store = await Store.open(
            dsn,
            min_size=min(settings.pool_min_size, settings.pool_max_size),
            max_size=settings.pool_max_size,
            acquire_timeout=settings.pool_acquire_timeout_seconds,
            statement_timeout_ms=settings.statement_timeout_ms,
        )
        client = new_client_session()
        gateway = Gateway(
            settings=settings,
            policy=policy,
            store=store,
            client=client,
            agents=agent_directory(settings),
            credentials=CredentialSource(settings.secrets_dir),
        )
        runners: list[web.AppRunner] = []
        try:
            agent_url = await _start(runners, agent_app(gateway), settings.agent_listen, settings)
            ops_url = await _start(runners, ops_app(gateway), settings.ops_listen, settings)
            _log.info(
                "opgate_started",
                agent_url=agent_url,
                ops_url=ops_url,
                policy_version=policy.version,
                providers=[p.provider for p in policy.providers],
            )
            yield Running(gateway, agent_url, ops_url)
        finally:
            for runner in reversed(runners):
                await runner.cleanup()
            await client.close()
            await store.close()


async def _start(
    runners: list[web.AppRunner], app: web.Application, listen: str, settings: Settings
) -> str:
    runner = web.AppRunner(
        app,
        auto_decompress=False,  # bodies are validated as sent, never un-gzipped behind our back
        keepalive_timeout=settings.keepalive_timeout_seconds,
        access_log=None,  # the audit record is the access log
    )
    await runner.setup()
    runners.append(runner)
    host, port = split_host_port(listen)
    sock = bind_socket(host, port)
    await web.SockSite(runner, sock).start()
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return f"http://{shown}:{bound_port}"


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket we own, so port 0 works and the bound port is known."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def serve(settings: Settings) -> None:
    """Run until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with running(settings):
        await stop.wait()
    _log.info("opgate_stopped")
