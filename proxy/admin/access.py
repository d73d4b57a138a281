"""Who may use the operations listener, and how it refuses.

Sign-in: the admin token and the approvers' tokens, configured by their SHA-256 and compared in
constant time (``admin_token_matches``); ``approver_for`` says which approver a token names.
Answers: the listener's problem+json shape (``admin_problem``), including for requests aiohttp's
parser refuses before any handler runs (``admin_malformed_answer``). The agent listener's
refusals are the gate's (proxy/gate/problem.py), with a ``Reason`` and an audit record.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy.gate.identity import token_digest
from proxy.gate.problem import PROBLEM_TYPE_BASE
from proxy.gate.reasons import Reason
from proxy.settings import Settings


def admin_token_matches(presented: str | None, expected_digest: str | None) -> bool:
    if presented is None or expected_digest is None:
        return False
    return hmac.compare_digest(token_digest(presented), expected_digest)


@dataclass(frozen=True)
class Approver:
    """Who decides a proposal: the admin (a name it gives, "admin" if none) or a configured
    approver (its configured name: the token says who it is)."""

    name: str
    role: str  # admin | approver

    @property
    def actor(self) -> str:
        return f"human:{self.name} ({self.role})"


def approver_for(token: str | None, settings: Settings) -> Approver | None:
    """The approver a presented token names: a configured approver, by its name, or the admin
    (named ``admin`` until it says who decides). None for any other token."""
    if not token:
        return None
    for approver in settings.approvers:
        if admin_token_matches(token, approver.token_sha256):
            return Approver(approver.name, "approver")
    if admin_token_matches(token, settings.admin_token_sha256):
        return Approver("admin", "admin")
    return None


def admin_problem(status: int, code: str, detail: str, **extra: Any) -> web.Response:
    """A problem answer of the operations API (codes: docs/reference/codes.md)."""
    body = {
        "type": PROBLEM_TYPE_BASE + code,
        "title": code.replace("_", " "),
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }
    return web.Response(
        status=status,
        body=json.dumps(body, allow_nan=False).encode("utf-8"),
        content_type="application/problem+json",
    )


def admin_malformed_answer(reason: str) -> web.Response:
    """The operations API's answer: its problem shape, no agent audit record."""
    return admin_problem(400, Reason.REQUEST_MALFORMED.value, reason)
