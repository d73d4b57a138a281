"""Who is signed in to the console: a token exchanged for a server-side session.

The token decides the role (the admin token, the reviewer token, or an approver's: all
configured by their SHA-256); the name typed at sign-in is the identity recorded on what the
human does, but for an approver, who is the name configured with their token (four eyes
depends on it). The
session's cookie value is random and only its SHA-256 is stored (``proxy/store/console.py``);
each session has its own CSRF token, required on every form.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import StrEnum

from proxy.admin.access import admin_token_matches
from proxy.settings import Settings
from proxy.store.console import ConsoleStore
from proxy.store.store import Store

SESSION_COOKIE = "opgate_console"
# Before sign-in there is no session to hold a CSRF token: the sign-in form's token is
# double-submitted (this cookie and the form field must match).
LOGIN_CSRF_COOKIE = "opgate_console_login"
IDENTITY_MAX = 200


class Role(StrEnum):
    ADMIN = "admin"  # sees everything, resolves escalations
    REVIEWER = "reviewer"  # sees everything, changes nothing
    APPROVER = "approver"  # sees everything, decides proposals


@dataclass(frozen=True)
class Session:
    role: Role
    identity: str
    csrf_token: str

    @property
    def actor(self) -> str:
        """How what this human does is recorded (an operation event's actor)."""
        return f"human:{self.identity} ({self.role.value})"

    def csrf_matches(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented, self.csrf_token)


def role_for(token: str, settings: Settings) -> Role | None:
    """The role a presented token signs in as, or None. An empty token is no token."""
    if not token:
        return None
    if admin_token_matches(token, settings.admin_token_sha256):
        return Role.ADMIN
    if admin_token_matches(token, settings.reviewer_token_sha256):
        return Role.REVIEWER
    if any(admin_token_matches(token, a.token_sha256) for a in settings.approvers):
        return Role.APPROVER
    return None


def _digest(cookie: str) -> str:
    return hashlib.sha256(cookie.encode("utf-8")).hexdigest()


async def open_session(store: Store, role: Role, identity: str, seconds: float) -> str:
    """A new session; returns the cookie value (never stored)."""
    cookie = secrets.token_urlsafe(32)
    csrf = secrets.token_urlsafe(32)
    await ConsoleStore(store).create_session(_digest(cookie), role.value, identity, csrf, seconds)
    return cookie


async def load_session(store: Store, cookie: str | None) -> Session | None:
    if not cookie:
        return None
    stored = await ConsoleStore(store).session(_digest(cookie))
    if stored is None:
        return None
    return Session(Role(stored.role), stored.identity, stored.csrf_token)


async def close_session(store: Store, cookie: str) -> None:
    await ConsoleStore(store).delete_session(_digest(cookie))
