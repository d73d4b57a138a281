"""The agents' public signing keys where Web Bot Auth verifiers look for them: an HTTP Message
Signatures Directory (draft-meunier-webbotauth-httpsig-directory) at
``/.well-known/http-message-signatures-directory`` on the agent listener, served as
``application/http-message-signatures-directory+json``.

The body is a JWKS of the Ed25519 keys opgate signs as each agent with (``signatures.py``;
``agents[].signing_key_file``), each named by its RFC 7638 thumbprint as ``kid``, the ``keyid``
of every request signed with it; no agent id is published. The response carries one RFC 9421
signature per key, as the draft recommends: over ``"@authority";req`` (the authority the
verifier asked) and ``content-digest``, with ``created``, ``expires``, ``keyid`` and the tag
``http-message-signatures-directory``. They prove possession of each key and bind the set to
the authority it was fetched from. The draft requires HTTPS for the directory: opgate's agent
listener is behind the operator's TLS, as for every agent call.

The authority signed over is the request's ``Host``, and only one that names an authority
(RFC 9110 7.2: ``uri-host [":" port]``; a reg-name of letters, digits, ``-._~``, an IPv4
address or a bracketed IPv6 address, and a port 1-65535): any other is refused 400
``request_malformed`` on record, before anything is signed.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from aiohttp import web
from http_message_signatures import HTTPMessageSigner, algorithms
from http_message_signatures.resolvers import MappingKeyResolver
from multidict import CIMultiDict

from proxy.gate.problem import problem_response
from proxy.gate.reasons import Reason
from proxy.gate.signatures import AgentKey
from proxy.observe.audit import AuditRecord
from proxy.observe.record_life import RecordLife
from proxy.runtime import GATEWAY

DIRECTORY_PATH = "/.well-known/http-message-signatures-directory"
MEDIA_TYPE = "application/http-message-signatures-directory+json"
TAG = "http-message-signatures-directory"
COVERED = ('"@authority";req', "content-digest")
# How long a verifier may keep the directory, and each response signature's life: the draft's
# cache lifetime bounds how long a key removed from the settings keeps verifying elsewhere.
LIFETIME = timedelta(minutes=5)


@dataclass
class _Request:
    method: str
    url: str
    headers: CIMultiDict[str]


@dataclass
class _Response:
    """What the library reads of a response: its status, headers, and the request it answers
    (``req`` components are read from the request)."""

    status_code: int
    headers: CIMultiDict[str]
    request: _Request


def directory_body(keys: Sequence[AgentKey]) -> bytes:
    """The JWKS, each key once (two agents may share one), in a stable order."""
    unique = {key.key_id: key for key in keys}
    entries = [{**unique[kid].public_jwk, "kid": kid, "use": "sig"} for kid in sorted(unique)]
    return json.dumps({"keys": entries}, sort_keys=True).encode()


def signed_directory(
    keys: Sequence[AgentKey], url: str, now: datetime
) -> tuple[bytes, CIMultiDict[str]]:
    """The directory's body and its response headers, signed once per key for the request
    made to ``url`` (its authority is what each signature covers)."""
    body = directory_body(keys)
    response = _Response(
        200,
        CIMultiDict(
            {
                "Content-Type": MEDIA_TYPE,
                "Cache-Control": f"max-age={int(LIFETIME.total_seconds())}",
            }
        ),
        _Request("GET", url, CIMultiDict()),
    )
    unique = {key.key_id: key for key in keys}
    for index, kid in enumerate(sorted(unique)):
        signer = HTTPMessageSigner(
            signature_algorithm=algorithms.ED25519,
            key_resolver=MappingKeyResolver(
                public_keys={}, private_keys={kid: unique[kid].private}
            ),
        )
        signer.sign(
            response,
            key_id=kid,
            created=now,
            expires=now + LIFETIME,
            label=f"sig{index + 1}",
            tag=TAG,
            covered_component_ids=COVERED,
            body=body,
            append_if_signature_exists=True,
            use_existing_digest=index > 0,
        )
    return body, response.headers


_REG_NAME = re.compile(r"[A-Za-z0-9._~-]{1,253}")
_PORT = re.compile(r"[0-9]{1,5}")


def public_authority(host_values: list[str]) -> str | None:
    """The authority one ``Host`` value names, lowered; None for no value, several, or one
    that names none (empty, a space, a userinfo, a path, a stray colon or bracket, a port out
    of range). Pure."""
    if len(host_values) != 1:
        return None
    value = host_values[0]
    if value.startswith("["):
        literal, bracket, rest = value[1:].partition("]")
        try:
            if not bracket or ipaddress.ip_address(literal).version != 6:
                return None
        except ValueError:
            return None
        host, port = f"[{literal}]", rest.removeprefix(":") if rest else None
        if rest and not rest.startswith(":"):
            return None
    else:
        name, colon, port_text = value.partition(":")
        if _REG_NAME.fullmatch(name) is None:
            return None
        host, port = name, port_text if colon else None
    if port is not None and (_PORT.fullmatch(port) is None or not 0 < int(port) < 65536):
        return None
    return (host if port is None else f"{host}:{port}").lower()


async def serve_directory(request: web.Request) -> web.Response:
    """``GET /.well-known/http-message-signatures-directory``: public, as a JWKS is; an opgate
    holding no agent key answers an empty directory."""
    authority = public_authority(request.headers.getall("Host", []))
    if authority is None:
        return _refused(request)
    keys = list(request.app[GATEWAY].signing_keys.values())
    now = datetime.now(UTC)
    url = f"{request.scheme}://{authority}{DIRECTORY_PATH}"
    body, headers = signed_directory(keys, url, now)
    return web.Response(body=body, headers=headers)


def _refused(request: web.Request) -> web.Response:
    """400 ``request_malformed``, its record emitted before it is answered. The detail does not
    echo the Host sent."""
    response = problem_response(
        Reason.REQUEST_MALFORMED, "the Host header must name one authority (host[:port])"
    )
    record = AuditRecord(
        source=request.remote,
        method=request.method,
        path=DIRECTORY_PATH,
        policy_version=request.app[GATEWAY].policy.version,
        rule="key_directory",
        reason=Reason.REQUEST_MALFORMED.value,
        response_status=response.status,
    )
    RecordLife(record).leave()
    return response
