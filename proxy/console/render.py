"""Pages rendered from the templates, every value escaped by Jinja2's autoescape, and the
headers every console answer carries (a strict Content-Security-Policy: nothing but the
console's own stylesheet and forms that post to itself)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from jinja2 import Environment, PackageLoader, StrictUndefined

from proxy.policy.amounts import human_amount

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # pages name operations, tenants and approvers: never kept by a shared cache or the browser
    "Cache-Control": "no-store",
}
_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")

_templates = Environment(
    loader=PackageLoader("proxy.console", "templates"),
    autoescape=True,  # every value, in every template; nothing is marked safe by hand
    undefined=StrictUndefined,  # a misspelt name is an error in the tests, not a blank
    trim_blocks=True,
    lstrip_blocks=True,
)


def age(seconds: float | None) -> str:
    """A duration as a human reads it at a glance: 45s, 12m, 3h, 2d."""
    if seconds is None:
        return ""
    whole = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def moment(value: datetime | str | None) -> str:
    """A time as a person reads it, to the second, in UTC: 2026-12-03 12:05:51Z."""
    if value is None:
        return ""
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    if when.tzinfo is not None:
        when = when.astimezone(UTC)
    return when.replace(microsecond=0, tzinfo=None).isoformat(sep=" ") + "Z"


def trace_url(template: str | None, trace_id: Any) -> str | None:
    """The trace's URL from the configured template; None if there is no template or the id
    is not a W3C trace id (an id is put in a URL only once it is known to be 32 hex digits)."""
    if template is None or not isinstance(trace_id, str) or not _TRACE_ID.match(trace_id):
        return None
    return template.replace("{trace_id}", trace_id)


def money(minor_units: Any, currency: Any) -> str:
    """An amount as the product shows it to a person (``human_amount``); nothing for a value
    that is no amount."""
    if not isinstance(minor_units, int) or isinstance(minor_units, bool):
        return ""
    return human_amount(minor_units, currency if isinstance(currency, str) else None)


def pretty(value: Any) -> str:
    """A JSON value for a person: indented, its characters as they are (``&``, not
    ``\\u0026``: the page is escaped by Jinja2's autoescape, not by the JSON)."""
    return json.dumps(value, indent=2, ensure_ascii=False)


_templates.filters["age"] = age
_templates.filters["moment"] = moment
_templates.filters["money"] = money
_templates.filters["pretty"] = pretty


def page(name: str, status: int = 200, **context: Any) -> web.Response:
    html = _templates.get_template(name).render(**context)
    return web.Response(status=status, text=html, content_type="text/html", charset="utf-8")
