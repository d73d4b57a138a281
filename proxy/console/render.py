"""Pages rendered from the templates, every value escaped by Jinja2's autoescape and made
visible (``visible``: no value can reorder or hide the text around it), and the headers every
console answer carries (a strict Content-Security-Policy: nothing but the console's own
stylesheet and forms that post to itself)."""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

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
# Characters that change how the text around them is drawn without being drawn themselves:
# the bidirectional controls (Unicode UAX #9: embeddings, overrides, isolates, marks; U+202E
# makes "DSU 00.0001" read "1000.00 USD"), and every other format or control character but
# the joiners (U+200C, U+200D: scripts and emoji need them) and line breaks and tabs; and a
# lone surrogate, which no page can encode.
_KEPT_INVISIBLE = frozenset("\u200c\u200d\n\r\t")
# More combining marks in a row than any script stacks on one letter: the rest are counted,
# not drawn (a run of them is one unbreakable cluster that widens the page or paints over the
# lines around it).
MAX_COMBINING_RUN = 4


def visible(text: str) -> str:
    """``text`` as a person may safely read it: each invisible control shown as an escape
    (``<U+202E>``), and a run of combining marks longer than ``MAX_COMBINING_RUN`` cut, with
    how many were left out. Pure; text without such characters is returned unchanged."""
    shown: list[str] = []
    run = 0
    hidden = 0
    for char in text:
        category = unicodedata.category(char)
        if category in ("Mn", "Me"):
            run += 1
            if run > MAX_COMBINING_RUN:
                hidden += 1
                continue
            shown.append(char)
            continue
        if hidden:
            shown.append(f"<+{hidden} combining marks>")
        run = hidden = 0
        if category in ("Cf", "Cc", "Cs", "Zl", "Zp") and char not in _KEPT_INVISIBLE:
            shown.append(f"<U+{ord(char):04X}>")
        else:
            shown.append(char)
    if hidden:
        shown.append(f"<+{hidden} combining marks>")
    return "".join(shown)


def _finalize(value: Any) -> Any:
    """Every ``{{ value }}`` of every template, before it is escaped: text made ``visible``.
    Markup is what a macro rendered, its own values already finalized."""
    if value is None or isinstance(value, Markup | bool | int | float):
        return value
    return visible(value if isinstance(value, str) else str(value))


_templates = Environment(
    loader=PackageLoader("proxy.console", "templates"),
    autoescape=True,  # every value, in every template; nothing is marked safe by hand
    finalize=_finalize,  # and every value visible: nothing reorders or hides what is around it
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
    return human_amount(
        minor_units, currency if isinstance(currency, str) else None, with_minor_units=True
    )


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
