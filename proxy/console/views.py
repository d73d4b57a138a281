"""The console's pages and forms, as an aiohttp sub-application mounted at ``/console/``.

Every answer carries the security headers (render.py). Every page but sign-in needs a live
session; every POST needs the session's CSRF token (sign-in: the double-submitted one) and,
but signing out, the admin role, or the approver role for a proposal's approve or decline: a
reviewer's POST is 403 whatever it asks.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, quote

import structlog
from aiohttp import web
from pydantic import ValidationError

from proxy.admin.access import Approver, admin_problem, approver_for
from proxy.console import pages
from proxy.console.render import SECURITY_HEADERS, page, trace_url
from proxy.console.sessions import (
    IDENTITY_MAX,
    LOGIN_CSRF_COOKIE,
    SESSION_COOKIE,
    Role,
    Session,
    close_session,
    load_session,
    open_session,
    role_for,
)
from proxy.errors import StoreUnavailable
from proxy.gate.budgets import budget_standings
from proxy.gate.ids import IdKind, path_id, path_operation_id
from proxy.gate.reasons import REASONS, Reason
from proxy.operations.api import ResolveRequest
from proxy.proposals.proposing import Refusal, approve_proposal, decline_proposal
from proxy.proposals.rules import REASON_MAX
from proxy.runtime import GATEWAY
from proxy.store.operation import Status

PREFIX = "/console"
_log = structlog.get_logger("opgate.console")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SESSION = web.RequestKey("console_session", Session)
CHAIN_STATE = web.AppKey("console_chain_state", pages.ChainState)
_SIGN_IN_PATHS = frozenset({f"{PREFIX}/login"})
_STATIC_PREFIX = f"{PREFIX}/static/"
_STYLESHEET = resources.files("proxy.console").joinpath("static/console.css").read_bytes()
_FORM_MAX = 64 * 1024
# an approver's POSTs: a proposal's page (its decision form) or the decision's own path
_PROPOSAL_DECISION = re.compile(rf"^{PREFIX}/proposals/[^/]+(/approve|/decline)?$")


class FormRejected(Exception):
    """A form the console cannot read one way (repeated field, not UTF-8, NUL, too long)."""


@web.middleware
async def security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # aiohttp's own 404 and 405, as console pages
        response = _error(exc.status, exc.reason, exc.reason, request.get(SESSION))
    except FormRejected as exc:
        response = _error(400, "Bad request", str(exc), None)
    except StoreUnavailable as exc:  # the operations API's answer, with the console's headers
        response = admin_problem(503, Reason.STORE_UNAVAILABLE.value, str(exc))
    response.headers.update(SECURITY_HEADERS)
    return response


@web.middleware
async def signed_in(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in _SIGN_IN_PATHS or request.path.startswith(_STATIC_PREFIX):
        return await handler(request)
    session = await load_session(request.app[GATEWAY].store, request.cookies.get(SESSION_COOKIE))
    if session is None:
        if request.method in ("GET", "HEAD"):
            return redirect(f"{PREFIX}/login")
        return _error(401, "Signed out", "sign in again: the session is over", None)
    request[SESSION] = session
    if request.method == "POST":
        form = await read_form(request)
        if not session.csrf_matches(form.get("csrf_token")):
            _log.warning("console_csrf_refused", path=request.path, identity=session.identity)
            return _error(403, "Refused", "the form's CSRF token is missing or wrong", session)
        if not _may_post(session.role, request.path):
            approver = session.role is Role.APPROVER
            _log.warning(
                "console_approver_refused" if approver else "console_reviewer_refused",
                path=request.path,
                identity=session.identity,
            )
            what = (
                "the approver role decides proposals, nothing else"
                if approver
                else "the reviewer role can see everything, change nothing"
            )
            return _error(403, "Refused", what, session)
    return await handler(request)


def _may_post(role: Role, path: str) -> bool:
    """Every role may sign out; an approver may decide proposals; the admin may do anything."""
    if role is Role.ADMIN or path == f"{PREFIX}/logout":
        return True
    return role is Role.APPROVER and _PROPOSAL_DECISION.match(path) is not None


async def read_form(request: web.Request) -> dict[str, str]:
    """A form body, decoded strictly: one value per name, UTF-8, no NUL."""
    body = await request.read()
    if len(body) > _FORM_MAX:
        raise FormRejected("the form is too long")
    try:
        pairs = parse_qsl(body.decode("ascii"), keep_blank_values=True, errors="strict")
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormRejected("the form is not URL-encoded UTF-8") from exc
    form = dict(pairs)
    if len(form) != len(pairs) or any("\x00" in k or "\x00" in v for k, v in pairs):
        raise FormRejected("a form field is repeated or holds a NUL")
    return form


def redirect(location: str) -> web.Response:
    """303 See Other: after a form, the browser GETs the page (a reload posts nothing)."""
    return web.Response(status=303, headers={"Location": location})


def _error(
    status: int, title: str, detail: str, session: Session | None, back: str | None = None
) -> web.Response:
    return page("error.html", status, title=title, detail=detail, session=session, back=back)


def _context(request: web.Request, **values: Any) -> dict[str, Any]:
    settings = request.app[GATEWAY].settings
    return {
        "session": request.get(SESSION),
        "trace_url": lambda trace_id: trace_url(settings.trace_url_template, trace_id),
        **values,
    }


async def _page(request: web.Request, name: str, status: int = 200, **values: Any) -> web.Response:
    """A signed-in page with the dashboard line atop it."""
    dashboard = await pages.dashboard(request.app[GATEWAY], request.app[CHAIN_STATE])
    return page(name, status, **_context(request, dashboard=dashboard, **values))


async def login_form(request: web.Request) -> web.Response:
    return _login_page(request, None, 200)


def _login_page(request: web.Request, problem: str | None, status: int) -> web.Response:
    csrf = secrets.token_urlsafe(32)
    response = page("login.html", status, session=None, csrf_token=csrf, problem=problem)
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        csrf,
        path=PREFIX,
        httponly=True,
        secure=request.secure,
        samesite="Strict",
        max_age=3600,
    )
    return response


async def login(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    form = await read_form(request)
    expected = request.cookies.get(LOGIN_CSRF_COOKIE)
    presented = form.get("csrf_token", "")
    if not expected or not secrets.compare_digest(expected, presented):
        return _login_page(request, "the sign-in form expired: try again", 403)
    identity = form.get("identity", "").strip()
    if not identity or len(identity) > IDENTITY_MAX or not identity.isprintable():
        return _login_page(request, f"your name: 1 to {IDENTITY_MAX} printable characters", 400)
    role = role_for(form.get("token", ""), gw.settings)
    if role is None:
        _log.warning("console_sign_in_refused", identity=identity)
        return _login_page(request, "that token is not an admin, reviewer or approver token", 401)
    approver = approver_for(form.get("token", ""), gw.settings)
    if role is Role.APPROVER and approver is not None:
        identity = approver.name  # who decides is who the token says: four eyes rests on it
    cookie = await open_session(gw.store, role, identity, gw.settings.console_session_seconds)
    _log.info("console_signed_in", identity=identity, role=role.value)
    response = redirect(f"{PREFIX}/operations")
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        path=PREFIX,
        httponly=True,
        secure=request.secure,
        samesite="Strict",
        max_age=int(gw.settings.console_session_seconds),
    )
    response.del_cookie(LOGIN_CSRF_COOKIE, path=PREFIX)
    return response


async def logout(request: web.Request) -> web.Response:
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        await close_session(request.app[GATEWAY].store, cookie)
    response = redirect(f"{PREFIX}/login")
    response.del_cookie(SESSION_COOKIE, path=PREFIX)
    return response


async def home(request: web.Request) -> web.Response:
    return redirect(f"{PREFIX}/operations")


def _filters(request: web.Request) -> pages.Filters:
    query = request.query
    status = query.get("status", "unsettled")
    age = query.get("age", "")
    if status not in pages.STATUS_FILTERS or age not in pages.AGE_FILTERS:
        raise FormRejected("unknown status or age filter")
    tenant = query.get("tenant", "").strip() or None
    provider = query.get("provider", "").strip() or None
    if any(v is not None and ("\x00" in v or len(v) > 255) for v in (tenant, provider)):
        raise FormRejected("a filter holds a NUL or is too long")
    return pages.Filters(status, tenant, provider, age)


async def operations(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    filters = _filters(request)
    rows = await pages.operations(gw, filters)
    return await _page(
        request,
        "operations.html",
        rows=rows,
        filters=filters,
        statuses=list(pages.STATUS_FILTERS),
        ages=list(pages.AGE_FILTERS),
        providers=sorted(p.provider for p in gw.policy.providers),
    )


async def operation(request: web.Request) -> web.Response:
    return await _operation_page(request, path_operation_id(request))


async def _operation_page(
    request: web.Request,
    operation_id: str | None,
    *,
    status: int = 200,
    error: str | None = None,
    form: dict[str, str] | None = None,
) -> web.Response:
    """The operation's page; after a refused verdict, with the reason and the form as it was
    filled in (``error``, ``form``)."""
    found = (
        None if operation_id is None else await pages.timeline(request.app[GATEWAY], operation_id)
    )
    if found is None:
        return _error(404, "Not found", "no such operation", request[SESSION])
    kept = {"object_id": "", "note": "", **(form or {})}
    return await _page(request, "operation.html", status, error=error, form=kept, **found)


async def escalations(request: web.Request) -> web.Response:
    rows = await pages.escalations(request.app[GATEWAY])
    return await _page(request, "escalations.html", rows=rows)


async def budgets(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    found = await budget_standings(gw.store, list(gw.policy.providers))
    return await _page(request, "budgets.html", rows=[s.to_public() for s in found])


async def resolve(request: web.Request) -> web.Response:
    """A human verdict on an escalated operation, recorded under the signed-in identity."""
    gw = request.app[GATEWAY]
    session = request[SESSION]
    operation_id = path_operation_id(request)
    if operation_id is None:
        return _error(400, "Bad request", "not an operation id", session)
    form = await read_form(request)
    try:
        verdict = ResolveRequest(
            verdict=form.get("verdict", ""),  # type: ignore[arg-type]
            object_id=form.get("object_id", "").strip() or None,
            note=form.get("note", "").strip(),
            decided_by=session.identity,
        )
    except ValidationError as exc:
        fields = ", ".join(
            _FIELD_WORDS.get(str(e["loc"][0]), str(e["loc"][0])) for e in exc.errors() if e["loc"]
        )
        return await _not_resolved(request, operation_id, 400, f"check {fields}", form)
    if verdict.verdict == "confirmed" and verdict.object_id is None:
        return await _not_resolved(
            request,
            operation_id,
            400,
            "to say it happened, give the provider object's id (what you found at the provider)",
            form,
        )
    resolved = await gw.store.resolve(
        operation_id, Status(verdict.verdict), verdict.object_id, verdict.note, actor=session.actor
    )
    if resolved is None:
        existing = await gw.store.load(operation_id)
        if existing is None:
            return _error(404, "Not found", "no such operation", session)
        detail = f"it is {existing.status.value}"
        if existing.lease_is_live():
            detail += " with an attempt in flight: wait for its outcome"
        return await _not_resolved(request, operation_id, 409, detail, form)
    _log.info(
        "operation_resolved", operation_id=operation_id, verdict=verdict.verdict, by=session.actor
    )
    return redirect(f"{PREFIX}/operations/{quote(operation_id, safe='')}")


async def proposals(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    rows = await pages.pending_proposals(gw)
    withdrawn = await pages.withdrawn_proposals(gw)
    return await _page(request, "proposals.html", rows=rows, withdrawn=withdrawn)


async def decide(request: web.Request) -> web.Response:
    """Approve or decline a proposal, as the signed-in human; an approval opens the operation
    it created."""
    gw = request.app[GATEWAY]
    session = request[SESSION]
    proposal_id = path_id(request, IdKind.PROPOSAL, "proposal_id")
    if proposal_id is None:
        return _error(400, "Bad request", "not a proposal id", session)
    form = await read_form(request)
    note = form.get("note", "").strip() or None
    verdict = request.match_info.get("verdict") or form.get("decision", "")
    if verdict not in ("approve", "decline"):
        return await _proposal_page(
            request,
            proposal_id,
            status=400,
            error="Not decided: choose Approve or Decline",
            form=form,
        )
    if note is not None and len(note) > REASON_MAX:
        why = f"Not decided: a note is at most {REASON_MAX} characters"
        return await _proposal_page(request, proposal_id, status=400, error=why, form=form)
    approver = Approver(session.identity, session.role.value)
    if verdict == "approve":
        created = await approve_proposal(gw, proposal_id, approver, note)
        if isinstance(created, Refusal):
            why = f"Not approved. {_refusal_text(created)}"
            return await _proposal_page(
                request, proposal_id, status=created.status, error=why, form=form
            )
        return redirect(f"{PREFIX}/operations/{quote(created.operation_id, safe='')}")
    declined = await decline_proposal(gw, proposal_id, approver, note)
    if isinstance(declined, Refusal):
        why = f"Not declined. {_refusal_text(declined)}"
        return await _proposal_page(
            request, proposal_id, status=declined.status, error=why, form=form
        )
    return redirect(f"{PREFIX}/proposals")


async def proposal(request: web.Request) -> web.Response:
    return await _proposal_page(request, path_id(request, IdKind.PROPOSAL, "proposal_id"))


async def _proposal_page(
    request: web.Request,
    proposal_id: str | None,
    *,
    status: int = 200,
    error: str | None = None,
    form: dict[str, str] | None = None,
) -> web.Response:
    """The proposal's page; after a refused decision, with the reason and the note kept."""
    found = None if proposal_id is None else await pages.proposal(request.app[GATEWAY], proposal_id)
    if found is None:
        return _error(
            404, "Not found", "no such proposal", request[SESSION], back=f"{PREFIX}/proposals"
        )
    kept = {"note": (form or {}).get("note", "")}
    return await _page(request, "proposal.html", status, error=error, form=kept, **found)


def _refusal_text(refusal: Refusal) -> str:
    """A refusal in words: what it is, then the detail, then its stable code."""
    try:
        title = REASONS[Reason(refusal.code)].title
    except (ValueError, KeyError):
        title = refusal.code.replace("_", " ").capitalize()
    return f"{title}: {refusal.detail} ({refusal.code})"


# form fields as the page names them, for a refusal that lists them
_FIELD_WORDS = {"verdict": "the verdict", "object_id": "the provider object id", "note": "the note"}


async def _not_resolved(
    request: web.Request, operation_id: str, status: int, why: str, form: dict[str, str]
) -> web.Response:
    kept = {k: form.get(k, "") for k in ("object_id", "note")}
    return await _operation_page(
        request, operation_id, status=status, error=f"Not resolved: {why}", form=kept
    )


async def audit(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    state = request.app[CHAIN_STATE]
    if request.query.get("verify") == "1":  # a read: any role may run it
        await pages.run_verification(gw, state)
    return await _page(request, "audit.html", **await pages.chain(gw, state))


async def stylesheet(request: web.Request) -> web.Response:
    return web.Response(body=_STYLESHEET, content_type="text/css", charset="utf-8")


def console_app() -> web.Application:
    app = web.Application(middlewares=[security_headers, signed_in])
    app[CHAIN_STATE] = pages.ChainState()
    app.router.add_get("/", home)
    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)
    app.router.add_get("/operations", operations)
    app.router.add_get("/operations/{operation_id}", operation)
    app.router.add_post("/operations/{operation_id}", resolve)
    app.router.add_post("/operations/{operation_id}/resolve", resolve)
    app.router.add_get("/escalations", escalations)
    app.router.add_get("/budgets", budgets)
    app.router.add_get("/proposals", proposals)
    app.router.add_get("/proposals/{proposal_id}", proposal)
    app.router.add_post("/proposals/{proposal_id}", decide)
    app.router.add_post("/proposals/{proposal_id}/{verdict:approve|decline}", decide)
    app.router.add_get("/audit", audit)
    app.router.add_get("/static/console.css", stylesheet)
    return app
