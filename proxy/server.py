"""Assemble and run opgate: open the resources, serve both listeners, close them in order.

``running(settings)`` is what ``opgate serve`` and the tests both use, so the tests run the
same wiring as production.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import signal
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import structlog
from aiohttp import web

from proxy.admin.access import admin_malformed_answer
from proxy.authoring.explain_api import add_explain_routes
from proxy.console.views import PREFIX as CONSOLE_PREFIX
from proxy.console.views import console_app
from proxy.errors import (
    ConfigurationError,
    ListenFailed,
    ReplicationNotDurable,
    StoreUnavailable,
)
from proxy.forward.destinations import AddressClass, CheckedResolver
from proxy.forward.listener import (
    ForwardListener,
    new_forward_client,
    start_forward_listener,
)
from proxy.gate.checks import Agent
from proxy.gate.credentials import CredentialSource
from proxy.gate.framing import (
    MalformedAnswer,
    ProblemAppRunner,
    agent_malformed_answer,
)
from proxy.gate.identity import AgentDirectory
from proxy.gate.intake import defer_expectation
from proxy.gate.key_directory import DIRECTORY_PATH, serve_directory
from proxy.gate.pipeline import handle_agent_request
from proxy.gate.signatures import AgentKey
from proxy.gate.upstream import new_client_session
from proxy.mcp.endpoint import add_mcp_route
from proxy.observe.observer import (
    Observability,
    add_metrics_route,
    observe_agent_request,
)
from proxy.operations.api import (
    add_routes,
    bad_input,
    body_in_time,
    require_admin,
    store_errors,
)
from proxy.operations.mandates_api import add_agent_mandate_routes, add_ops_mandate_routes
from proxy.policy.reload import PolicyReloader, load_validated_policy, reloading
from proxy.proposals.api import add_agent_proposal_routes, add_ops_proposal_routes
from proxy.recovery.api import add_recovery_routes
from proxy.recovery.background import run_background
from proxy.runtime import Gateway, serve_with
from proxy.settings import Settings, split_host_port
from proxy.store.embedded import database_dsn
from proxy.store.migrate import migrate
from proxy.store.replication import Durability, Verdict, judge
from proxy.store.store import Store

_log = structlog.get_logger("opgate.server")


@dataclass(frozen=True)
class Running:
    gateway: Gateway
    agent_url: str
    ops_url: str
    reloader: PolicyReloader | None = None  # policy hot reload (SIGHUP, file changes)
    forward_url: str | None = None  # forward-proxy listener (HTTPS_PROXY), when enabled
    forward_listener: ForwardListener | None = None


def agent_directory(settings: Settings) -> AgentDirectory:
    return AgentDirectory(
        {a.token_sha256: Agent(agent_id=a.id, tenant=a.tenant) for a in settings.agents}
    )


def agent_signing_keys(settings: Settings) -> dict[str, AgentKey]:
    """The agents' signing keys, read once at start (a bad file stops the start, named)."""
    keys: dict[str, AgentKey] = {}
    for agent in settings.agents:
        if agent.signing_key_file is None:
            continue
        try:
            jwk = json.loads(agent.signing_key_file.read_text("utf-8"))
            keys[agent.id] = AgentKey.from_jwk(jwk)
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"agents[{agent.id}].signing_key_file {agent.signing_key_file}: {exc}"
            ) from exc
    return keys


def reverse_connector(settings: Settings) -> aiohttp.TCPConnector:
    """Reverse mode, and the reconciliation lookups made with the same client, reach providers
    as forward mode does: the operator's ``upstream_ca_file`` is trusted and
    ``forward_static_hosts`` resolve. Otherwise a lookup for an operation sent in forward mode
    could not reach its provider, and the operation would be escalated for nothing. Every
    address class is allowed: reverse-mode upstreams are the operator's own configuration."""
    context = ssl.create_default_context()
    if settings.upstream_ca_file is not None:
        context.load_verify_locations(cafile=str(settings.upstream_ca_file))
    resolver = CheckedResolver(settings.forward_static_hosts, lambda _host: tuple(AddressClass))
    return aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, ssl=context, resolver=resolver)


def agent_app(gateway: Gateway) -> web.Application:
    app = web.Application(client_max_size=0, middlewares=[observe_agent_request])
    serve_with(app, gateway)
    add_recovery_routes(app)  # /_opgate/...: opgate's own, never a provider's route prefix
    add_agent_proposal_routes(app)  # /_opgate/v1/proposals: agents ask a human to approve
    # /_opgate/v1/mandates: a person's signed mandate approves; /.well-known/jwks.json
    add_agent_mandate_routes(app, gateway.settings)
    add_mcp_route(app)  # /_opgate/mcp: the same operations as MCP tools
    # Web Bot Auth's key directory: the public keys opgate signs as the agents with
    app.router.add_get(DIRECTORY_PATH, serve_directory)
    # Every other method and path reaches the pipeline; routing is the policy's job, deny by
    # default.
    app.router.add_route("*", "/{tail:.*}", handle_agent_request, expect_handler=defer_expectation)
    return app


def ops_app(gateway: Gateway) -> web.Application:
    # the admin token first: an unauthenticated request's body is never read
    app = web.Application(middlewares=[require_admin, body_in_time, store_errors, bad_input])
    serve_with(app, gateway)
    add_routes(app)
    add_ops_proposal_routes(app)  # /v1/proposals: the admin or an approver decides
    add_ops_mandate_routes(app)  # /v1/mandates/{digest}/revoke
    add_metrics_route(app)  # GET /metrics (Prometheus text; no token: docs/audit.md)
    add_explain_routes(app)  # POST /v1/explain (policy authoring)
    console = console_app()  # /console/: humans, signed in by session (proxy/console/)
    serve_with(console, gateway)
    app.add_subapp(CONSOLE_PREFIX + "/", console)
    return app


@contextlib.asynccontextmanager
async def running(
    settings: Settings, sockets: dict[str, socket.socket] | None = None
) -> AsyncIterator[Running]:
    """opgate serving on its listeners until the block exits. ``sockets`` are listening sockets
    bound by a parent process (``--workers``), by listener name: agent, ops, forward."""
    inherited = dict(sockets or {})
    policy = load_validated_policy(settings.policy_dir)  # the same validation as a reload
    async with database_dsn(settings.database_url, settings.data_dir) as dsn:
        await migrate(dsn)
        store = await Store.open(
            dsn,
            min_size=min(settings.pool_min_size, settings.pool_max_size),
            max_size=settings.pool_max_size,
            acquire_timeout=settings.pool_acquire_timeout_seconds,
            statement_timeout_ms=settings.statement_timeout_ms,
            instance_id=settings.instance_id,
            statement_cache_size=settings.database_statement_cache_size,
            prove_promotions=not settings.accept_async_replication,
        )
        try:
            started_with = await _judge_replication(store, settings)
        except BaseException:
            await store.close()
            raise
        credentials = CredentialSource(settings.secrets_dir)
        observability = Observability(settings, policy, credentials)
        client = observability.instrument(new_client_session(connector=reverse_connector(settings)))
        gateway = Gateway(
            settings=settings,
            policy=policy,
            store=store,
            client=client,
            agents=agent_directory(settings),
            credentials=credentials,
            observability=observability,
            signing_keys=agent_signing_keys(settings),
        )
        runners: list[web.AppRunner] = []
        try:
            await observability.start(store)  # audit writers; the policy load on record
            agent_url = await _start(
                runners,
                agent_app(gateway),
                settings.agent_listen,
                settings,
                agent_malformed_answer(gateway, "agent"),
                inherited.get("agent"),
                setting="agent_listen",
            )
            ops_url = await _start(
                runners,
                ops_app(gateway),
                settings.ops_listen,
                settings,
                admin_malformed_answer,
                inherited.get("ops"),
                setting="ops_listen",
            )
            forward_url, forward_listener = None, None
            if settings.forward_listen:  # forward-proxy mode: proxy/forward/
                forward_listen = settings.forward_listen

                async def start_forward(app: web.Application) -> tuple[str, web.AppRunner]:
                    url = await _start(
                        runners,
                        app,
                        forward_listen,
                        settings,
                        agent_malformed_answer(gateway, "forward"),
                        inherited.get("forward"),
                        setting="forward_listen",
                    )
                    return url, runners[-1]

                gateway.forward_client = new_forward_client(gateway, settings)
                forward_listener = await start_forward_listener(gateway, start_forward)
                forward_url = forward_listener.url
            _log.info(
                "opgate_started",
                agent_url=agent_url,
                ops_url=ops_url,
                forward_url=forward_url,
                policy_version=policy.version,
                providers=[p.provider for p in policy.providers],
                event_loop=type(asyncio.get_running_loop()).__module__.partition(".")[0],
            )
            stop_background = asyncio.Event()
            background = asyncio.create_task(run_background(gateway, stop_background))
            watching = asyncio.create_task(
                _watch_replication(store, settings, started_with, stop_background)
            )
            try:
                async with reloading(
                    gateway, settings.policy_dir, settings.policy_reload_interval_seconds
                ) as reloader:
                    yield Running(
                        gateway, agent_url, ops_url, reloader, forward_url, forward_listener
                    )
            finally:
                stop_background.set()
                await asyncio.gather(background, watching)
        finally:
            # Stop accepting everywhere at once, then let in-flight requests finish up to the
            # drain deadline. A request cut off there leaves its row dispatched (unknown), never
            # failed: the forward-and-record stage only ever settles from a provider answer.
            await asyncio.gather(*(runner.cleanup() for runner in reversed(runners)))
            await gateway.cut_off.close()
            if gateway.forward_client is not None:
                await gateway.forward_client.close()
            await observability.close()
            await client.close()
            await store.close()


async def check_replication(dsn: str, settings: Settings) -> None:
    """The start-up verdict on the database's replication, for the worker supervisor, before it
    forks: workers refused one by one would only be replaced."""
    store = await Store.open(
        dsn,
        min_size=1,
        max_size=1,
        instance_id=settings.instance_id,
        statement_cache_size=settings.database_statement_cache_size,  # PgBouncer: 0
    )
    try:
        await _judge_replication(store, settings)
    finally:
        await store.close()


async def _judge_replication(store: Store, settings: Settings) -> Verdict:
    """Said once at start: whether a claim's commit survives a failover. Asynchronous standbys
    refuse the start unless accepted (proxy/store/replication.py)."""
    verdict = judge(await store.replication_facts(), accept_async=settings.accept_async_replication)
    if verdict.refuse_start:
        raise ReplicationNotDurable(verdict.note)
    if verdict.durability is Durability.SYNCHRONOUS:
        _log.info("opgate_replication", durability=verdict.durability.value, note=verdict.note)
    else:
        _log.warning("opgate_replication", durability=verdict.durability.value, note=verdict.note)
    return verdict


async def _watch_replication(
    store: Store, settings: Settings, started_with: Verdict, stop: asyncio.Event
) -> None:
    """The replication judged again every ``replication_check_seconds`` until ``stop``: made
    asynchronous under the running process (and not accepted), claims are refused and
    ``/readyz`` is 503 until it is synchronous again (the store keeps the verdict). Each
    change is said once in the log; a database that does not answer changes nothing here
    (every claim fails on its own then)."""
    said = (started_with.durability, started_with.refuses_claims)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(settings.replication_check_seconds):
                await stop.wait()
        if stop.is_set():
            return
        try:
            verdict = await store.judge_replication(
                accept_async=settings.accept_async_replication,
                budget_seconds=settings.readiness_budget_seconds,
            )
        except StoreUnavailable:
            continue
        if (verdict.durability, verdict.refuses_claims) == said:
            continue
        said = (verdict.durability, verdict.refuses_claims)
        if verdict.refuses_claims:
            _log.error(
                "opgate_replication_changed",
                durability=verdict.durability.value,
                claims_refused=True,
                note=verdict.note,
            )
        else:
            _log.warning(
                "opgate_replication_changed",
                durability=verdict.durability.value,
                claims_refused=False,
                note=verdict.note,
            )


async def _start(
    runners: list[web.AppRunner],
    app: web.Application,
    listen: str,
    settings: Settings,
    answer_malformed: MalformedAnswer,
    sock: socket.socket | None = None,
    *,
    setting: str,
) -> str:
    # Requests aiohttp's parser refuses get problem+json and, on agent listeners, a record.
    runner = ProblemAppRunner(
        app,
        answer=answer_malformed,
        auto_decompress=False,  # bodies are validated as sent, never un-gzipped behind our back
        keepalive_timeout=settings.keepalive_timeout_seconds,
        shutdown_timeout=settings.drain_seconds,
        access_log=None,  # the audit record is the access log
    )
    await runner.setup()
    runners.append(runner)
    if sock is None:
        sock = bind_listener(setting, listen)
    await web.SockSite(runner, sock).start()
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return f"http://{shown}:{bound_port}"


def bind_listener(setting: str, listen: str) -> socket.socket:
    """The listening socket of the setting ``setting`` (``agent_listen``...), whose value is
    ``listen``; ListenFailed naming both if it cannot be bound."""
    host, port = split_host_port(listen)
    try:
        return bind_socket(host, port)
    except OSError as exc:
        raise ListenFailed(listen, setting, exc) from exc


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket we own, so port 0 works and the bound port is known."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def _relay_hangups(hangup: asyncio.Event, run: Running) -> None:
    while True:
        await hangup.wait()
        hangup.clear()
        if run.reloader is not None:
            run.reloader.request_reload()


def freeze_what_started() -> None:
    """Keep what opgate made to start (modules, the policy set, pools, apps: ~130,000 objects
    the cycle collector tracks) out of every later collection. Each full collection walked
    them all: ~80 ms on a 2-core machine, every few seconds under load (bench/README.md),
    a pause every request in flight waits out. Startup's own garbage is collected first. What
    is frozen is still freed once nothing refers to it, only never searched for cycles: the
    policy set loaded at start, if a reload replaces it, is freed unless it holds a cycle."""
    gc.collect()
    gc.freeze()
    _log.info("opgate_startup_frozen", objects=gc.get_freeze_count())


def run_server(settings: Settings, sockets: dict[str, socket.socket] | None = None) -> None:
    """``serve`` on the event loop ``settings.event_loop`` names, until it returns."""
    with asyncio.Runner(loop_factory=event_loop_factory(settings.event_loop)) as runner:
        runner.run(serve(settings, sockets))


def event_loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """A new event loop of the kind the ``event_loop`` setting names (the tests' loop too)."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


async def serve(settings: Settings, sockets: dict[str, socket.socket] | None = None) -> None:
    """Run until SIGINT or SIGTERM; SIGHUP reloads the policy set."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Installed before anything listens: a SIGHUP that arrives while opgate is still starting
    # must queue a reload, not kill the process (SIGHUP's default action).
    hangup = asyncio.Event()
    loop.add_signal_handler(signal.SIGHUP, hangup.set)
    async with running(settings, sockets) as run:
        freeze_what_started()
        relay = asyncio.create_task(_relay_hangups(hangup, run))
        try:
            await stop.wait()
        finally:
            relay.cancel()
            _log.info("opgate_draining", drain_seconds=settings.drain_seconds)
    _log.info("opgate_stopped")
