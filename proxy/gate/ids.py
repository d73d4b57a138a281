"""The one grammar of every id an operator or an agent names, checked before any store call.

Every entry point reads its ids here: the operations, explain, proposals, mandates and recovery
APIs, the console, the MCP tools, resources and tasks, the gate's ``X-Operation-Id`` and
idempotency key, and the CLI. An id outside its kind's grammar names nothing opgate can have
stored, so it is refused where it enters (each entry point with its own code: 400
``operation_id_invalid`` on the operations API, ``proposal_unknown`` to an agent, ...), never
sent to a query: a NUL makes PostgreSQL raise (a 500), an undecodable byte or odd Unicode could
be read two ways, and an id longer than any stored one can only miss.

    operation, idempotency key, task   1-255 printable ASCII characters (no space)
    proposal                           ``prop_`` and then printable ASCII, 255 at most
    mandate (its digest)               43 base64url characters (a SHA-256)
    nonce                              1-256 base64url characters (opgate issues 43)
    audit stream                       1-512 printable ASCII characters

An operation id an operator chooses at creation is stricter (``NEW_OPERATION_ID``) and may not
start with a prefix reserved for another kind (``RESERVED_PREFIXES``): a reader of the id,
human or program, must not take an operation for a proposal or a mandate's operation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from typing import TypeGuard
from urllib.parse import unquote_to_bytes

from aiohttp import web

# A proposal's id starts so; opgate mints them (proxy/proposals/rules.py). Defined in the store
# (it reads it to tell a proposal's operation), stated here as part of the grammar.
from proxy.store.proposal import PROPOSAL_ID_PREFIX

# Printable ASCII without space: no NUL (PostgreSQL text refuses it), no byte aiohttp decoded
# with surrogateescape, nothing a provider or a log could read two ways.
_PRINTABLE = r"[\x21-\x7e]"
_BASE64URL = r"[A-Za-z0-9_-]"


class IdKind(StrEnum):
    OPERATION = "operation id"
    IDEMPOTENCY_KEY = "idempotency key"
    TASK = "task id"  # an operation's or a proposal's: which one, the store says
    PROPOSAL = "proposal id"
    MANDATE = "mandate digest"
    NONCE = "nonce"
    AUDIT_STREAM = "audit stream"  # an operation id, requests/<instance> or policy


_GRAMMAR: dict[IdKind, re.Pattern[str]] = {
    IdKind.OPERATION: re.compile(_PRINTABLE + "{1,255}"),
    IdKind.IDEMPOTENCY_KEY: re.compile(_PRINTABLE + "{1,255}"),
    IdKind.TASK: re.compile(_PRINTABLE + "{1,255}"),
    IdKind.PROPOSAL: re.compile(
        re.escape(PROPOSAL_ID_PREFIX) + _PRINTABLE + f"{{1,{255 - len(PROPOSAL_ID_PREFIX)}}}"
    ),
    IdKind.MANDATE: re.compile(_BASE64URL + "{43}"),
    IdKind.NONCE: re.compile(_BASE64URL + "{1,256}"),
    IdKind.AUDIT_STREAM: re.compile(_PRINTABLE + "{1,512}"),
}
# What each kind is, said without the value (it may be anything an agent typed).
_SAID: dict[IdKind, str] = {
    IdKind.OPERATION: "an operation id is 1-255 printable ASCII characters",
    IdKind.IDEMPOTENCY_KEY: "an idempotency key is 1-255 printable ASCII characters",
    IdKind.TASK: "a task id is 1-255 printable ASCII characters",
    IdKind.PROPOSAL: f"a proposal id is {PROPOSAL_ID_PREFIX} and printable ASCII, 255 at most",
    IdKind.MANDATE: "a mandate digest is 43 base64url characters",
    IdKind.NONCE: "a nonce is 1-256 base64url characters",
    IdKind.AUDIT_STREAM: "an audit stream is 1-512 printable ASCII characters",
}

# The ids an operator may choose for a new operation (``POST /v1/operations``): a strict subset
# of what an operation id may be.
NEW_OPERATION_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
# Prefixes of ids opgate mints for other kinds, which no operator-chosen operation id may take
# (compared without case). ``prop_``: a proposal (an MCP task id of that spelling would
# otherwise name two things); ``ap2_``: the operation a mandate created, whose id is derived
# from the mandate's digest (proxy/operations/mandates_api.py).
RESERVED_PREFIXES: dict[str, str] = {
    PROPOSAL_ID_PREFIX: "a proposal's",
    "ap2_": "the operation of a mandate's",
}


def valid_id(value: object, kind: IdKind) -> TypeGuard[str]:
    """Whether ``value`` can be an id of ``kind`` (a str in its grammar)."""
    return isinstance(value, str) and _GRAMMAR[kind].fullmatch(value) is not None


def valid_operation_id(value: object) -> TypeGuard[str]:
    """Whether ``value`` can be an operation id or an idempotency key: 1-255 printable ASCII."""
    return valid_id(value, IdKind.OPERATION)


def id_rule(kind: IdKind) -> str:
    """The grammar of ``kind`` in a sentence, for a refusal's detail (never the value)."""
    return _SAID[kind]


def reserved_prefix(operation_id: str) -> str | None:
    """The sentence a new operation id is refused with if it starts with a prefix reserved for
    another kind of id, else None."""
    lowered = operation_id.lower()
    for prefix, owner in RESERVED_PREFIXES.items():
        if lowered.startswith(prefix):
            return f"the prefix {prefix} is reserved for {owner} ids"
    return None


def path_id(request: web.Request, kind: IdKind, name: str) -> str | None:
    """The id a route's ``{name}`` segment carries, percent-decoded strictly, or None if it is
    not one of ``kind``. Not ``match_info``: it keeps an undecodable escape as text
    (``%C3%28`` arrives as ``%C3(``) and decodes ``%00`` to a NUL."""
    resource = request.match_info.route.resource
    if resource is None:
        return None
    template = resource.canonical.split("/")
    raw = request.raw_path.partition("?")[0].split("/")
    placeholder = "{" + name + "}"
    if placeholder not in template or len(raw) != len(template):
        return None
    try:
        value = unquote_to_bytes(raw[template.index(placeholder)]).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return value if valid_id(value, kind) else None


def path_operation_id(request: web.Request, name: str = "operation_id") -> str | None:
    """The operation id of the route's ``{name}`` segment (``path_id``), or None."""
    return path_id(request, IdKind.OPERATION, name)


def id_argument(kind: IdKind) -> Callable[[str], str]:
    """An argparse ``type`` for an id of ``kind`` on the command line: the value, or ValueError
    (argparse's "invalid operation id value", exit 2) before anything is sent."""

    def read(value: str) -> str:
        if not valid_id(value, kind):
            raise ValueError(id_rule(kind))
        return value

    read.__name__ = kind.value  # argparse names the type so
    return read
