"""How a rule names body fields, and what ``*`` means in them. Pure.

A JSON rule names fields by JSON pointer (RFC 6901: ``/amount/value``), a form rule by form key
as sent (``metadata[order]``). ``*`` has one meaning per place, and the same one at runtime and
in ``policy check``:

- in ``params`` it stands for every index of an array, and nothing else: on a JSON rule a whole
  token (``/items/*/sku``), on a form rule a whole bracket group (``items[*][sku]``). The
  approved value is then the list of every element's value, in order, so an element added,
  removed, reordered or changed is a mismatch;
- in ``free`` it stands for any run of characters: on a JSON rule within one token
  (``/metadata/*`` is any key of ``metadata``, ``/items/*/note`` any element's note), on a form
  rule anywhere (``metadata[*]``, as before). A free JSON field also covers the items of an
  array it holds (``/assignees`` lets ``["a", "b"]`` through): a list of values is one value
  to set, but an object's keys are not (``/metadata/*`` does not cover ``/metadata/a/b``).

``never_matches`` says why a field could never match any request, for ``policy check``.
"""

from __future__ import annotations

import re
from functools import lru_cache

_POINTER = re.compile(r"(/([^/~]|~[01])*)+")
_FORM_INDEX_GROUP = "[*]"
# A canonical array index in a form key: what a bracket parser reads as position n, one way.
_INDEX = r"(0|[1-9][0-9]*)"


def is_json_pointer(text: str) -> bool:
    return _POINTER.fullmatch(text) is not None


def is_pattern(field: str) -> bool:
    return "*" in field


@lru_cache(maxsize=1024)
def free_matcher(field: str, *, json: bool) -> re.Pattern[str]:
    """The regex a ``free`` entry matches leaf names with (whole name)."""
    if not json:
        return re.compile(".*".join(re.escape(part) for part in field.split("*")), re.DOTALL)
    tokens = field.split("/")[1:]
    named = "".join("/" + "[^/]*".join(re.escape(part) for part in t.split("*")) for t in tokens)
    return re.compile(named + f"(/{_INDEX})*", re.DOTALL)  # and an array's items, if it is one


@lru_cache(maxsize=1024)
def param_matcher(field: str, *, json: bool) -> re.Pattern[str]:
    """The regex for leaf names a ``params`` entry covers: the field itself, anything below it
    (an approved object or list holds leaves), each ``*`` one canonical array index."""
    if json:
        body = "".join("/" + (_INDEX if t == "*" else re.escape(t)) for t in field.split("/")[1:])
        return re.compile(body + r"(/.*)?", re.DOTALL)
    parts = form_param_parts(field)
    if parts is None:
        return re.compile(re.escape(field), re.DOTALL)
    before, after = parts
    return re.compile(re.escape(before) + r"\[" + _INDEX + r"\]" + re.escape(after), re.DOTALL)


def form_param_parts(field: str) -> tuple[str, str] | None:
    """``items[*][sku]`` -> (``items``, ``[sku]``): the key before and after its one ``[*]``."""
    if field.count("*") != 1 or field.count(_FORM_INDEX_GROUP) != 1:
        return None
    before, _, after = field.partition(_FORM_INDEX_GROUP)
    return before, after


def never_matches(field: str, *, json: bool, role: str) -> str | None:
    """Why ``field`` (in ``role``: amount, currency, params, free, idempotency.body_field) can
    never match a request of its rule's body kind; None if it can."""
    if json:
        if not is_json_pointer(field):
            return (
                f"{field!r} is not a JSON pointer: on a JSON rule every field is one "
                "(e.g. /amount/value)"
            )
        if is_pattern(field):
            if role != "params" and role != "free":
                return f"{field!r}: '*' is only read in params and free"
            if role == "params" and any("*" in t and t != "*" for t in field.split("/")[1:]):
                return f"{field!r}: in params '*' must be a whole token (an array index)"
        return None
    if field.startswith("/"):
        return f"{field!r} is a JSON pointer, but this rule takes a form body (name form keys)"
    if is_pattern(field):
        if role != "params" and role != "free":
            return f"{field!r}: '*' is only read in params and free"
        if role == "params" and form_param_parts(field) is None:
            return f"{field!r}: in form params '*' must be one whole bracket group, [*]"
    return None
