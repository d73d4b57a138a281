"""The forward listener: where agents configured with HTTP_PROXY/HTTPS_PROXY arrive.

One middleware, ``forward_front``, sees every request before the router:

- ``CONNECT host:port``: the agent is authenticated (``Proxy-Authorization``, else 407), the
  target decided (an inspected provider, a pass-through host, or 403) and its resolved
  addresses checked; then the tunnel is taken over (connect.py). One audit record per CONNECT.
- a request inside an inspected tunnel: its ``Host`` and the TLS SNI must name the CONNECT
  target (421 otherwise); then it goes to the pipeline, which audits it.
- an absolute-form request (``POST http://host/path``): authenticated, decided and checked the
  same way, ``Host`` must agree with the URI; then the pipeline.

The pipeline learns about forward mode from ``request[FORWARDED]`` only (intake.identify).
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import ThreadedResolver
from aiohttp.typedefs import Handler
from yarl import URL

from proxy.forward import connect
from proxy.forward.ca import CertificateAuthority, requested_server_name
from proxy.forward.destinations import (
    AddressClass,
    CheckedResolver,
    is_ip_literal,
    refused_address,
    resolve,
)
from proxy.forward.targets import (
    Inspect,
    PassThrough,
    allowed_classes,
    allowed_classes_for_host,
    decide_absolute,
    decide_connect,
    host_header_agrees,
    upstream_base_path,
)
from proxy.gate.checks import Agent
from proxy.gate.decision import Deny
from proxy.gate.forwarded import FORWARDED, ForwardedRequest, Origin
from proxy.gate.framing import CONNECT_EXPECTATIONS
from proxy.gate.identity import credential_from
from proxy.gate.intake import defer_expectation, query_sha256, unmet_expectation
from proxy.gate.pipeline import handle_agent_request
from proxy.gate.problem import PROBLEM, problem_response
from proxy.gate.reasons import Reason
from proxy.gate.upstream import new_client_session
from proxy.observe.audit import AuditRecord, Decision, request_path
from proxy.observe.observer import observe_agent_request
from proxy.observe.record_life import RecordLife
from proxy.runtime import Gateway, serve_with
from proxy.settings import Settings


@dataclass(frozen=True)
class Tunnel:
    """An inspected CONNECT tunnel: the agent the CONNECT authenticated, and its target."""

    agent: Agent
    origin: Origin
    provider: str


# Set by the CONNECT handler before the tunnel's request handler starts: every request task
# of that handler inherits it, and no other connection sees it.
CURRENT_TUNNEL: contextvars.ContextVar[Tunnel | None] = contextvars.ContextVar(
    "opgate_tunnel", default=None
)

PROXY_CHALLENGES = ('Basic realm="opgate"', 'Bearer realm="opgate"')
PASS_THROUGH_CONNECT_TIMEOUT = 10.0


@dataclass
class ForwardListener:
    gateway: Gateway
    ca: CertificateAuthority
    resolver: AbstractResolver
    handshake_timeout: float
    server: web.Server | None = None  # set once the listener's runner is set up
    url: str | None = None
    # CONNECT handlers that hold a tunnel, so shutdown can wait for them
    tunnels: set[asyncio.Task[Any]] = field(default_factory=set)

    @property
    def overrides(self) -> Mapping[str, str]:
        return self.gateway.settings.upstream_overrides

    @property
    def static_hosts(self) -> Mapping[str, str]:
        return {k.lower(): v for k, v in self.gateway.settings.forward_static_hosts.items()}


FORWARD_LISTENER = web.AppKey("forward_listener", ForwardListener)


def new_forward_client(gateway: Gateway, settings: Settings) -> aiohttp.ClientSession:
    """Forward-mode egress: verified TLS (system CAs plus ``upstream_ca_file``), and a
    resolver that refuses addresses the policies naming the host do not allow."""
    context = ssl.create_default_context()
    if settings.upstream_ca_file is not None:
        context.load_verify_locations(cafile=str(settings.upstream_ca_file))
    resolver = CheckedResolver(
        settings.forward_static_hosts,
        lambda host: allowed_classes_for_host(gateway.policy, settings.upstream_overrides, host),
    )
    observability = gateway.observability
    # the same CLIENT span, traceparent and latency histogram as reverse mode (instrument)
    session = new_client_session(
        connector=aiohttp.TCPConnector(
            limit=0, ssl=context, resolver=resolver, use_dns_cache=False
        ),
    )
    return observability.instrument(session) if observability is not None else session


def forward_app(listener: ForwardListener) -> web.Application:
    # observe first: CONNECTs and every request inside a tunnel get a span, and their audit
    # records reach the PostgreSQL audit log like the agent listener's
    app = web.Application(client_max_size=0, middlewares=[observe_agent_request, forward_front])
    serve_with(app, listener.gateway)
    app[FORWARD_LISTENER] = listener
    app.on_shutdown.append(_close_tunnels)
    # Expect is the pipeline's to decide, after forward_front has authenticated the agent and
    # decided the host (aiohttp's default handler would answer before any middleware).
    app.router.add_route("*", "/{tail:.*}", handle_agent_request, expect_handler=defer_expectation)
    return app


StartListener = Callable[[web.Application], Awaitable[tuple[str, web.AppRunner]]]


async def start_forward_listener(gateway: Gateway, start: StartListener) -> ForwardListener:
    """Create (or load) the CA, then serve the forward listener."""
    settings = gateway.settings
    ca = await asyncio.to_thread(CertificateAuthority.load_or_create, settings.forward_ca_dir)
    listener = ForwardListener(
        gateway=gateway,
        ca=ca,
        resolver=ThreadedResolver(),
        handshake_timeout=settings.forward_tls_handshake_timeout_seconds,
    )
    listener.url, runner = await start(forward_app(listener))
    listener.server = runner.server
    return listener


async def _close_tunnels(app: web.Application) -> None:
    listener = app[FORWARD_LISTENER]
    for task in list(listener.tunnels):
        task.cancel()
    await asyncio.gather(*listener.tunnels, return_exceptions=True)
    await listener.resolver.close()


@web.middleware
async def forward_front(request: web.Request, handler: Handler) -> web.StreamResponse:
    listener = request.app[FORWARD_LISTENER]
    if request.method == "CONNECT":
        return await _connect(listener, request)
    tunnel = CURRENT_TUNNEL.get()
    if tunnel is not None:
        return await _inside_tunnel(listener, request, handler, tunnel)
    return await _absolute_form(listener, request, handler)


# --- CONNECT ---


async def _connect(listener: ForwardListener, request: web.Request) -> web.StreamResponse:
    """One record per CONNECT: a refusal's is on record before the refusal is written (as the
    pipeline's answers are); a tunnel's when the tunnel ends, since it counts its bytes."""
    record = _record(request, listener)
    record.method = "CONNECT"
    with RecordLife(record) as life:  # a tunnel's leaves when the block ends
        response = await _decide_and_tunnel(listener, request, record)
        if response.get(PROBLEM) is not None:  # refused: nothing tunnelled
            life.leave()
            await _write_refusal(request, response)
        return response


async def _decide_and_tunnel(
    listener: ForwardListener, request: web.Request, record: AuditRecord
) -> web.StreamResponse:
    authority = _connect_authority(request.raw_path)
    if authority is None:
        return _refuse_connect(
            record,
            Deny(Reason.PROXY_REQUEST_INVALID, "CONNECT needs host:port"),
        )
    host, port = authority
    record.destination = Origin("https", host, port).authority
    agent = _proxy_agent(listener, request, record)
    if isinstance(agent, Deny):
        return _refuse_connect(record, agent)
    # A CONNECT has no body to invite: 100-continue is ignored, anything else refused
    # (proxy/gate/framing.py took the header aside before aiohttp could answer it).
    unmet = unmet_expectation(request.get(CONNECT_EXPECTATIONS, ()))
    if unmet is not None:
        return _refuse_connect(record, unmet)
    target = decide_connect(listener.gateway.policy, listener.overrides, host, port)
    if isinstance(target, Deny):
        return _refuse_connect(record, target)
    record.provider = target.provider.provider
    checked = await _checked_addresses(listener, host, port, allowed_classes(target.provider))
    if isinstance(checked, Deny):
        return _refuse_connect(record, checked)
    if isinstance(target, PassThrough):
        return await _pass_through(request, record, checked[0], port)
    return await _inspect(listener, request, record, agent, target)


async def _inspect(
    listener: ForwardListener,
    request: web.Request,
    record: AuditRecord,
    agent: Agent,
    target: Inspect,
) -> web.StreamResponse:
    assert listener.server is not None, "the forward listener is not started"
    context = await asyncio.to_thread(listener.ca.server_context, target.origin.host)
    record.decision, record.tunnel = Decision.ALLOW, "inspected"
    await connect.establish(request)
    record.response_status = 200
    # Set before the tunnel's handler exists: its tasks inherit it, no other connection sees it.
    token = CURRENT_TUNNEL.set(Tunnel(agent, target.origin, target.provider.provider))
    task = asyncio.current_task()
    if task is not None:
        listener.tunnels.add(task)
    try:
        served = await connect.serve_inspected(
            request, listener.server, context, listener.handshake_timeout
        )
        if not served:  # allowed, but nothing went through: not counted as an "allow"
            record.decision, record.reason = Decision.ERROR, "tls_handshake_failed"
    finally:
        CURRENT_TUNNEL.reset(token)
        if task is not None:
            listener.tunnels.discard(task)
        connect.release(request)
    return _closed_response()


async def _pass_through(
    request: web.Request, record: AuditRecord, address: str, port: int
) -> web.StreamResponse:
    try:
        upstream, upstream_side, closed = await connect.open_pass_through(
            address, port, PASS_THROUGH_CONNECT_TIMEOUT
        )
    except (OSError, TimeoutError) as exc:
        return _refuse_connect(record, Deny(Reason.UPSTREAM_UNAVAILABLE, f"cannot connect: {exc}"))
    record.decision, record.tunnel = Decision.ALLOW, "pass_through"
    await connect.establish(request)
    record.response_status = 200
    try:
        await connect.serve_pass_through(request, upstream, upstream_side, closed, record)
    finally:
        connect.release(request)
    return _closed_response()


def _closed_response() -> web.StreamResponse:
    """What the CONNECT handler returns once its tunnel is over: the head went out long ago
    and the connection is gone; aiohttp only needs a prepared-looking response object."""
    response = web.StreamResponse(status=200, reason=connect.TUNNEL_ESTABLISHED)
    response.force_close()
    return response


def _refuse_connect(record: AuditRecord, deny: Deny) -> web.Response:
    """A declined CONNECT's answer (problem+json), written by ``_connect`` once on record."""
    response = _refusal(record, deny)
    response.force_close()
    return response


async def _write_refusal(request: web.Request, response: web.StreamResponse) -> None:
    """Answer, then close, or the bytes that follow a declined CONNECT would be read as a body
    (aiohttp's pure-Python parser) and the connection would hang."""
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()


def _connect_authority(raw: str) -> tuple[str, int] | None:
    """``host:port`` of a CONNECT, strictly: a port is required, nothing else is allowed."""
    if raw.startswith("["):
        host, sep, rest = raw[1:].partition("]")
        if not sep or not rest.startswith(":"):
            return None
        port_text = rest[1:]
    else:
        host, sep, port_text = raw.partition(":")
        if not sep or ":" in port_text:
            return None
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    if any(c in host for c in "/@?#%\\ "):
        return None
    return host.lower(), int(port_text)


# --- requests inside a tunnel, and absolute-form requests ---


async def _inside_tunnel(
    listener: ForwardListener, request: web.Request, handler: Handler, tunnel: Tunnel
) -> web.StreamResponse:
    origin = tunnel.origin
    server_name = _server_name(request)
    if not request.raw_path.startswith("/"):
        return _refuse_request(
            request,
            listener,
            origin,
            tunnel.agent,
            Deny(Reason.PROXY_REQUEST_INVALID, "inside a tunnel, send origin-form requests"),
        )
    host_header = request.headers.getall("Host", [])
    sni_agrees = server_name == origin.host or (server_name is None and is_ip_literal(origin.host))
    if len(host_header) != 1 or not host_header_agrees(host_header[0], origin) or not sni_agrees:
        return _refuse_request(
            request,
            listener,
            origin,
            tunnel.agent,
            Deny(
                Reason.MISDIRECTED_REQUEST,
                f"the tunnel is to {origin.authority}: Host and SNI must name it",
            ),
        )
    return await _to_pipeline(
        listener, request, handler, tunnel.agent, origin, tunnel.provider, request.raw_path
    )


async def _absolute_form(
    listener: ForwardListener, request: web.Request, handler: Handler
) -> web.StreamResponse:
    raw = request.raw_path
    origin = None if raw.startswith("/") else Origin.of(raw)
    if origin is None:
        return _refuse_request(
            request,
            listener,
            None,
            None,
            Deny(
                Reason.PROXY_REQUEST_INVALID,
                "the forward listener takes CONNECT and absolute-form requests only",
            ),
        )
    record_agent = _proxy_agent(listener, request, None)
    if isinstance(record_agent, Deny):
        return _refuse_request(request, listener, origin, None, record_agent)
    agent = record_agent
    host_header = request.headers.getall("Host", [])
    if len(host_header) > 1 or (host_header and not host_header_agrees(host_header[0], origin)):
        return _refuse_request(
            request,
            listener,
            origin,
            agent,
            Deny(Reason.MISDIRECTED_REQUEST, f"the Host header does not name {origin.authority}"),
        )
    target = decide_absolute(listener.gateway.policy, listener.overrides, origin)
    if isinstance(target, Deny):
        return _refuse_request(request, listener, origin, agent, target)
    checked = await _checked_addresses(
        listener, origin.host, origin.port, allowed_classes(target.provider)
    )
    if isinstance(checked, Deny):
        return _refuse_request(request, listener, origin, agent, checked)
    path = URL(raw, encoded=True).raw_path_qs
    return await _to_pipeline(
        listener, request, handler, agent, origin, target.provider.provider, path
    )


async def _to_pipeline(
    listener: ForwardListener,
    request: web.Request,
    handler: Handler,
    agent: Agent,
    origin: Origin,
    provider_name: str,
    raw_path: str,
) -> web.StreamResponse:
    provider = listener.gateway.policy.provider_named(provider_name)
    base = upstream_base_path(provider, listener.overrides) if provider else ""
    request[FORWARDED] = ForwardedRequest(
        agent=agent, origin=origin, provider=provider_name, base_path=base, raw_path=raw_path
    )
    return await handler(request)


def _server_name(request: web.Request) -> str | None:
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    return requested_server_name(ssl_object) if ssl_object is not None else None


# --- shared ---


def _proxy_agent(
    listener: ForwardListener, request: web.Request, record: AuditRecord | None
) -> Agent | Deny:
    values = request.headers.getall("Proxy-Authorization", [])
    if len(values) > 1:
        return Deny(Reason.AMBIGUOUS_REQUEST, "Proxy-Authorization is sent more than once")
    token = credential_from(values[0]) if values else None
    agent = listener.gateway.agents.lookup(token) if token else None
    if agent is None:
        return Deny(Reason.PROXY_AUTH_REQUIRED, "no valid agent token in Proxy-Authorization")
    if record is not None:
        record.agent_id, record.tenant = agent.agent_id, agent.tenant
    return agent


async def _checked_addresses(
    listener: ForwardListener, host: str, port: int, allowed: frozenset[AddressClass]
) -> list[str] | Deny:
    try:
        results = await resolve(listener.resolver, listener.static_hosts, host, port)
    except (OSError, socket.gaierror) as exc:
        return Deny(Reason.UPSTREAM_UNAVAILABLE, f"{host} does not resolve: {exc}")
    addresses = [r["host"] for r in results]
    refused = refused_address(addresses, allowed)
    if refused is not None:
        address, kind = refused
        return Deny(Reason.DESTINATION_NOT_ALLOWED, f"{host} resolves to {address} ({kind})")
    return addresses


def _record(request: web.Request, listener: ForwardListener) -> AuditRecord:
    return AuditRecord(
        listener="forward",
        source=request.remote,
        method=request.method,
        path=None,
        policy_version=listener.gateway.policy.version,
    )


def _refusal(record: AuditRecord, deny: Deny) -> web.Response:
    record.decision, record.reason = Decision.DENY, deny.reason.value
    response = problem_response(deny.reason, deny.detail)
    if deny.reason is Reason.PROXY_AUTH_REQUIRED:
        for challenge in PROXY_CHALLENGES:
            response.headers.add("Proxy-Authenticate", challenge)
    record.response_status = response.status
    return response


def _refuse_request(
    request: web.Request,
    listener: ForwardListener,
    origin: Origin | None,
    agent: Agent | None,
    deny: Deny,
) -> web.Response:
    """A forward-mode request refused before the pipeline: audited here, once."""
    record = _record(request, listener)
    record.path = request_path(request.raw_path)  # as sent, never decoded
    record.query_sha256 = query_sha256(request.raw_path)
    record.destination = origin.authority if origin else None
    if agent is not None:
        record.agent_id, record.tenant = agent.agent_id, agent.tenant
    response = _refusal(record, deny)
    RecordLife(record).leave()
    return response
