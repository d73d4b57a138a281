"""Stage 1 of a request: identify the provider, rule, agent and operation reference, and read
and parse the body. Everything here either yields facts or a ``Deny``; nothing is forwarded."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDictProxy

from proxy.bodies import BodyRejected, ParsedBody, parse_body
from proxy.checks import Agent
from proxy.decision import Deny
from proxy.headers import duplicated_header
from proxy.identity import AgentDirectory, AmbiguousCredentials, presented_agent_token
from proxy.policy.model import BodyKind, Provider, Rule
from proxy.policy.paths import is_canonical_path
from proxy.policy.set import PolicySet, match_rule
from proxy.reasons import Reason


@dataclass(frozen=True)
class Target:
    provider: Provider
    rule: Rule
    agent: Agent
    path: str  # below the route prefix
    query: str
    path_params: dict[str, str]
    named_operation_id: str | None
    idempotency_key: str | None
    headers: CIMultiDictProxy[str]


def identify(policy: PolicySet, agents: AgentDirectory, request: web.Request) -> Target | Deny:
    raw_path, _, query = request.raw_path.partition("?")
    route = policy.route(raw_path)
    if route is None:
        return Deny(Reason.NO_ROUTE, f"no provider is routed at {raw_path}")
    provider = route.provider
    auth_header = provider.credential.header if provider.credential else None
    duplicated = duplicated_header(request.headers, (provider.idempotency.header,))
    if duplicated is not None:
        return Deny(Reason.AMBIGUOUS_REQUEST, f"{duplicated} is sent more than once")
    try:
        token = presented_agent_token(request.headers, auth_header)
    except AmbiguousCredentials as exc:
        return Deny(Reason.AMBIGUOUS_REQUEST, str(exc))
    agent = agents.lookup(token) if token else None
    if agent is None:
        return Deny(Reason.AGENT_UNAUTHENTICATED, "no valid agent token was presented")
    if not is_canonical_path(route.path):
        return Deny(Reason.PATH_NOT_CANONICAL, f"{route.path} is not canonical")
    matched = match_rule(provider, request.method, route.path)
    if matched is None:
        return Deny(
            Reason.NO_MATCHING_RULE,
            f"no {provider.provider} rule allows {request.method} {route.path}",
        )
    if query and matched.rule.body is not BodyKind.NONE:
        return Deny(Reason.QUERY_NOT_ALLOWED, "parameters must travel in the validated body")
    return Target(
        provider=provider,
        rule=matched.rule,
        agent=agent,
        path=route.path,
        query=query,
        path_params=matched.path_params,
        named_operation_id=request.headers.get("X-Operation-Id"),
        idempotency_key=request.headers.get(provider.idempotency.header),
        headers=request.headers,
    )


async def read_body(request: web.Request, target: Target) -> ParsedBody | Deny:
    limit = target.provider.limits.max_request_body_bytes
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":
        return Deny(Reason.BODY_INVALID, f"Content-Encoding {encoding} is not accepted")
    if request.content_length is not None and request.content_length > limit:
        return Deny(Reason.BODY_TOO_LARGE, f"{request.content_length} bytes, limit {limit}")
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(64 * 1024):
        size += len(chunk)
        if size > limit:
            return Deny(Reason.BODY_TOO_LARGE, f"more than {limit} bytes")
        chunks.append(chunk)
    try:
        return parse_body(
            target.rule.body, request.headers.getall("Content-Type", []), b"".join(chunks)
        )
    except BodyRejected as exc:
        reason = Reason.CONTENT_TYPE_MISMATCH if exc.content_type else Reason.BODY_INVALID
        return Deny(reason, str(exc))
