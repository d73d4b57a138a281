"""Stage 1 of a request: identify the provider, rule, agent and operation reference, and read
and parse the body. Everything here either yields facts or a ``Deny``; nothing is forwarded.

The decisions are pure functions of (method, raw path, headers, body bytes): ``identify_request``,
``parse_request_body``, ``request_facts`` and ``operation_reference``. The pipeline wraps them
around a live aiohttp request; ``opgate policy test`` and ``explain`` call the very same ones on
a request written in a file.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, replace

from aiohttp import HttpVersion11, web
from multidict import CIMultiDictProxy

from proxy.gate.bodies import ABSENT, BodyRejected, ParsedBody, parse_body
from proxy.gate.checks import Agent, RequestFacts
from proxy.gate.decision import Deny
from proxy.gate.forwarded import (
    FORWARDED,
    ForwardedRequest,
    forwarded_agent,
    forwarded_route,
)
from proxy.gate.headers import duplicated_header, unreadable_header
from proxy.gate.identity import AgentDirectory, AmbiguousCredentials, presented_agent_token
from proxy.gate.ids import IdKind, id_rule, valid_id
from proxy.gate.reasons import Reason
from proxy.policy.model import BodyKind, OperationRequirement, Provider, Rule
from proxy.policy.paths import is_canonical_path
from proxy.policy.payments import NO_LIMITS, X402Limits
from proxy.policy.set import PolicySet, match_rule
from proxy.store.operation import Operation
from proxy.store.store import Store

CONTINUE = "100-continue"


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
    # Forward-proxy mode: leaves through the client that checks resolved addresses.
    forwarded: bool = False
    # the set's limits on x402 payments, of the set the request is decided by
    x402_limits: X402Limits = NO_LIMITS


def identify(policy: PolicySet, agents: AgentDirectory, request: web.Request) -> Target | Deny:
    forwarded = request.get(FORWARDED)  # set by the forward listener only
    raw_target = forwarded.raw_path if forwarded is not None else request.raw_path
    return identify_request(
        policy, agents, request.method, raw_target, request.headers, forwarded=forwarded
    )


def identify_request(
    policy: PolicySet,
    agents: AgentDirectory,
    method: str,
    raw_target: str,  # the path and query as sent, undecoded
    headers: CIMultiDictProxy[str],
    *,
    forwarded: ForwardedRequest | None = None,
) -> Target | Deny:
    raw_path, _, query = raw_target.partition("?")
    # Reverse mode: the route prefix names the provider. Forward mode: the host the agent
    # addressed did (checked by the forward listener against the provider's upstream).
    if forwarded is None:
        route = policy.route(raw_path)
    else:
        route = forwarded_route(policy, forwarded, raw_path)
    if route is None:
        return Deny(Reason.NO_ROUTE, f"no provider is routed at {raw_path}")
    provider = route.provider
    auth_header = provider.credential.header if provider.credential else None
    # An API-key header (no scheme) carries the agent's token bare, as the SDK's api key.
    raw_auth = provider.credential is not None and provider.credential.scheme is None
    key_header = provider.idempotency.header
    duplicated = duplicated_header(headers, (key_header,) if key_header else ())
    if duplicated is not None:
        return Deny(Reason.AMBIGUOUS_REQUEST, f"{duplicated} is sent more than once")
    unreadable = refuse_unreadable_headers(headers, key_header)
    if unreadable is not None:
        return unreadable
    if forwarded is not None:
        agent_or_deny = forwarded_agent(agents, forwarded, headers, auth_header, raw=raw_auth)
        if isinstance(agent_or_deny, Deny):
            return agent_or_deny
        agent: Agent | None = agent_or_deny
    else:
        try:
            token = presented_agent_token(headers, auth_header, raw=raw_auth)
        except AmbiguousCredentials as exc:
            return Deny(Reason.AMBIGUOUS_REQUEST, str(exc))
        agent = agents.lookup(token) if token else None
    if agent is None:
        return Deny(Reason.AGENT_UNAUTHENTICATED, "no valid agent token was presented")
    unmet = unsupported_expectation(headers)
    if unmet is not None:
        return unmet
    if not is_canonical_path(route.path):
        return Deny(Reason.PATH_NOT_CANONICAL, f"{route.path} is not canonical")
    matched = match_rule(provider, method, route.path)
    if matched is None:
        return Deny(
            Reason.NO_MATCHING_RULE,
            f"no {provider.provider} rule allows {method} {route.path}",
        )
    if query and takes_no_query(matched.rule):
        return Deny(
            Reason.QUERY_NOT_ALLOWED,
            f"rule {matched.rule.name} takes no query string: parameters travel in the path "
            "and the validated body",
        )
    return Target(
        provider=provider,
        rule=matched.rule,
        agent=agent,
        path=route.path,
        query=query,
        path_params=matched.path_params,
        named_operation_id=headers.get("X-Operation-Id"),
        idempotency_key=headers.get(key_header) if key_header else None,
        headers=headers,
        forwarded=forwarded is not None,
        x402_limits=policy.x402_limits,
    )


def takes_no_query(rule: Rule) -> bool:
    """Whether a query string on ``rule`` is refused: on every rule that takes an operation
    (what an approval binds is the path and the validated body; a query would reach the
    provider unchecked, with the real credential, even where the rule takes no body) and on
    every rule that reads a body. Only reads without an operation forward a query."""
    return rule.operation is not OperationRequirement.NONE or rule.body is not BodyKind.NONE


def query_sha256(raw_target: str) -> str | None:
    """The SHA-256 of a request target's raw query (None without one): with the path, what the
    audit record holds of the target. The query itself is not kept, as a body is not: its values
    may be anything (an email, a card fingerprint), and the digest is what a reviewer checks a
    claimed query against. Only reads without an operation forward one (``takes_no_query``)."""
    query = raw_target.partition("#")[0].partition("?")[2]
    return hashlib.sha256(query.encode()).hexdigest() if query else None


def expectations(values: Iterable[str]) -> list[str]:
    """The expectations ``Expect`` header ``values`` list (RFC 9110 10.1.1: a comma-separated
    list), lowered; empty elements are no expectation."""
    return [
        token.strip().lower() for value in values for token in value.split(",") if token.strip()
    ]


def unsupported_expectation(headers: CIMultiDictProxy[str]) -> Deny | None:
    """``100-continue`` is the only expectation opgate meets (``read_body`` sends the 100);
    any other is refused here, in the pipeline, so that it has its record (aiohttp's own
    handler answered 417 before any stage ran)."""
    return unmet_expectation(headers.getall("Expect", []))


def unmet_expectation(values: Iterable[str]) -> Deny | None:
    """A refusal if the ``Expect`` header ``values`` ask for anything but ``100-continue``.
    The detail does not echo the value."""
    if any(token != CONTINUE for token in expectations(values)):
        return Deny(Reason.EXPECTATION_UNSUPPORTED, "only Expect: 100-continue is supported")
    return None


def refuse_unreadable_headers(
    headers: CIMultiDictProxy[str], key_header: str | None
) -> Deny | None:
    """Header values are read (and some looked up, hashed or forwarded) only if they are
    printable ASCII; the operation's names also follow the operation id grammar. The detail
    names the header, never its value (it may be a credential)."""
    operation_id = headers.get("X-Operation-Id")
    if operation_id is not None and not valid_id(operation_id, IdKind.OPERATION):
        return Deny(Reason.OPERATION_ID_INVALID, f"X-Operation-Id: {id_rule(IdKind.OPERATION)}")
    key = headers.get(key_header) if key_header else None
    if key is not None and not valid_id(key, IdKind.IDEMPOTENCY_KEY):
        return Deny(Reason.HEADER_INVALID, f"{key_header}: {id_rule(IdKind.IDEMPOTENCY_KEY)}")
    unreadable = unreadable_header(headers)
    if unreadable is not None:
        return Deny(Reason.HEADER_INVALID, f"the value of {unreadable} is not printable ASCII")
    return None


async def read_body(
    request: web.Request, target: Target, deadline_seconds: float
) -> ParsedBody | Deny:
    """The whole body within ``deadline_seconds``: one deadline over every read together, so a
    client sending a byte at a time cannot hold the request open (each read would be quick)."""
    refused = refuse_before_reading(target, request.content_length)
    if refused is not None:
        return refused
    limit = target.provider.limits.max_request_body_bytes
    try:
        if request.content.is_eof():  # all of it arrived with the headers: nothing to wait for
            raw = await _read_within_limit(request, limit)
        else:
            async with asyncio.timeout(deadline_seconds):
                if _invites_body(request, target):
                    # Everything the headers alone decide has passed (in forward mode the
                    # proxy token and the host too, before the pipeline began): only now is
                    # the body invited.
                    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    request.writer.output_size = 0  # not part of the response aiohttp counts
                raw = await _read_within_limit(request, limit)
    except TimeoutError:
        return Deny(Reason.BODY_TIMEOUT, f"the body did not arrive within {deadline_seconds} s")
    except ConnectionError:  # the agent hung up: nobody reads the answer, the audit record does
        return Deny(Reason.REQUEST_MALFORMED, "the connection closed before the whole body")
    if isinstance(raw, Deny):
        return raw
    return parse_request_body(target, raw)


async def _read_within_limit(request: web.Request, limit: int) -> bytes | Deny:
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(64 * 1024):
        size += len(chunk)
        if size > limit:
            return Deny(Reason.BODY_TOO_LARGE, f"more than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def refuse_before_reading(target: Target, content_length: int | None) -> Deny | None:
    """What the headers alone refuse: an encoded body, a declared length over the limit."""
    limit = target.provider.limits.max_request_body_bytes
    encoding = target.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":
        return Deny(Reason.BODY_INVALID, f"Content-Encoding {encoding} is not accepted")
    if content_length is not None and content_length > limit:
        return Deny(Reason.BODY_TOO_LARGE, f"{content_length} bytes, limit {limit}")
    return None


def parse_request_body(target: Target, raw: bytes) -> ParsedBody | Deny:
    """The whole body, read: parsed strictly as the rule's body kind."""
    try:
        return parse_body(target.rule.body, target.headers.getall("Content-Type", []), raw)
    except BodyRejected as exc:
        reason = Reason.CONTENT_TYPE_MISMATCH if exc.content_type else Reason.BODY_INVALID
        return Deny(reason, str(exc))


def with_body_key(target: Target, body: ParsedBody) -> Target | Deny:
    """``target`` with the idempotency key the body carries, where the provider reads it there
    (Square's ``idempotency_key``): it names the operation as a header key does. A key in both
    places must be the same one, or the request means two operations."""
    field = target.provider.key_field(target.rule)
    if field is None:
        return target
    sent = body.value_at(field)
    if sent is ABSENT:
        return target
    if not isinstance(sent, str) or not valid_id(sent, IdKind.IDEMPOTENCY_KEY):
        return Deny(Reason.BODY_INVALID, f"{field}: {id_rule(IdKind.IDEMPOTENCY_KEY)}")
    if target.idempotency_key is not None and target.idempotency_key != sent:
        header = target.provider.idempotency.header
        return Deny(Reason.AMBIGUOUS_REQUEST, f"{header} and {field} carry different keys")
    return replace(target, idempotency_key=sent)


def request_facts(target: Target, body: ParsedBody) -> RequestFacts:
    """Everything the checks look at."""
    return RequestFacts(
        agent=target.agent,
        provider=target.provider,
        rule=target.rule,
        method=target.rule.method,
        path=target.path,
        path_params=target.path_params,
        body=body,
        named_operation_id=target.named_operation_id,
        idempotency_key=target.idempotency_key,
        injected_field=target.provider.metadata_field(target.rule),
        key_field=target.provider.key_field(target.rule),
    )


@dataclass(frozen=True)
class OperationReference:
    """How the request names its operation: ``X-Operation-Id`` first, else the provider's
    idempotency key (looked up within the provider)."""

    provider: str
    operation_id: str | None
    idempotency_key: str | None

    def names(self, op: Operation) -> bool:
        """Whether ``op`` is the row this reference reads (what the store's lookup returns)."""
        if self.operation_id is not None:
            return op.operation_id == self.operation_id
        return op.provider == self.provider and op.idempotency_key == self.idempotency_key


def operation_reference(target: Target) -> OperationReference | None:
    """None when the rule takes no operation or the request names none."""
    if target.rule.operation is OperationRequirement.NONE:
        return None
    if target.named_operation_id is None and target.idempotency_key is None:
        return None
    return OperationReference(
        target.provider.provider, target.named_operation_id, target.idempotency_key
    )


async def load_operation(store: Store, target: Target) -> Operation | None:
    """The row the request names, read from the primary."""
    reference = operation_reference(target)
    if reference is None:
        return None
    if reference.operation_id is not None:
        return await store.load(reference.operation_id)
    assert reference.idempotency_key is not None
    return await store.load_by_key(reference.provider, reference.idempotency_key)


async def defer_expectation(request: web.Request) -> None:
    """The ``expect_handler`` of the pipeline's routes: it answers nothing, so that ``Expect``
    is decided inside the pipeline (aiohttp's default answers 100 or 417 before any
    middleware: before the forward listener's proxy authentication, and without a record).
    ``unsupported_expectation`` refuses what opgate does not meet; ``read_body`` sends
    ``100 Continue`` once the headers have passed (RFC 9110 10.1.1: a server that refuses on
    the headers answers instead, and the body is never invited)."""


def _invites_body(request: web.Request, target: Target) -> bool:
    """An HTTP/1.1 ``Expect: 100-continue`` with a body (RFC 9110 10.1.1: an HTTP/1.0
    request's expectation is ignored); asked only while the body is still to come."""
    return (
        request.version == HttpVersion11
        and CONTINUE in expectations(target.headers.getall("Expect", []))
        and request.body_exists
    )
