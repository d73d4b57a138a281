"""JSON pointers (RFC 6901), read one way everywhere a policy's pointer meets a document: the
object id of a provider's answer, a lookup's list and match, a precondition's expression, a
body's fields. Pure.

A token is unescaped ``~1`` first, then ``~0`` (``~01`` is ``~1``, never ``/``). It indexes an
array only as RFC 6901's ``array-index``: ``0`` or ASCII digits without a leading zero. Any
other token (``01``, ``+1``, ``1.0``, a superscript or a non-ASCII digit: ``str.isdigit`` and
``int`` accept some of these) names nothing in an array, as a missing key names nothing in an
object.
"""

from __future__ import annotations

import re
from typing import Any

_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")  # [0-9]: ASCII only, unlike \d


class _Missing:
    """What a pointer that names nothing in the document resolves to (distinct from null)."""

    def __repr__(self) -> str:
        return "missing"


MISSING: Any = _Missing()


def escape(key: str) -> str:
    """A key as one reference token (``a/b`` is ``a~1b``, ``m~n`` is ``m~0n``)."""
    return key.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    """One reference token as the key it names (``a~1b`` is ``a/b``, ``m~0n`` is ``m~n``)."""
    return token.replace("~1", "/").replace("~0", "~")


def tokens(pointer: str) -> list[str]:
    """The unescaped tokens of a pointer (``/a~1b/c`` is ``["a/b", "c"]``; ``""``: none)."""
    return [unescape(t) for t in pointer.split("/")[1:]]


def array_index(token: str) -> int | None:
    """The array position an unescaped token names, or None if it names none."""
    return int(token) if _ARRAY_INDEX.fullmatch(token) else None


def step(node: Any, token: str) -> Any:
    """What one unescaped token names below ``node`` (MISSING: nothing)."""
    if isinstance(node, dict):
        return node.get(token, MISSING)
    if isinstance(node, list):
        position = array_index(token)
        if position is not None and position < len(node):
            return node[position]
    return MISSING


def resolve(document: Any, pointer: str | list[str] | tuple[str, ...]) -> Any:
    """What ``pointer`` (its text, or its unescaped tokens) names in ``document`` (MISSING:
    nothing)."""
    node = document
    for token in tokens(pointer) if isinstance(pointer, str) else pointer:
        node = step(node, token)
        if node is MISSING:
            return MISSING
    return node
