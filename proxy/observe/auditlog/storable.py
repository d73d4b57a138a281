"""What PostgreSQL can store, and how much of a path is worth storing. Pure.

A record's strings come partly from the request (its path, a CONNECT authority). PostgreSQL's
jsonb refuses the escape ``\\u0000`` and text refuses NUL; a lone surrogate (what a pure-Python
HTTP parser makes of bytes that are not UTF-8) is not UTF-8 at all. One such string used to make
the whole batch fail, forever. ``storable`` replaces each of these characters, in every string
value and key of a record, by U+FFFD (the Unicode replacement character), so what is stored
says that something was there. The log line passes through the same function, so both say the
same thing.

A path longer than ``PATH_LIMIT_BYTES`` is recorded as its first bytes plus the SHA-256 of the
whole path: anyone can send an 8 kB path, and each stored byte lands on the primary's disk.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

REPLACEMENT = "\ufffd"
_SCALARS = frozenset({int, float, bool})
PATH_LIMIT_BYTES = 512
_FLAT_TYPES = frozenset({type(None), str, *_SCALARS})


def _unstorable(char: str) -> bool:
    return char == "\x00" or "\ud800" <= char <= "\udfff"


def storable_text(value: str) -> str:
    """``value`` with NUL and lone surrogates replaced; the same object when there are none."""
    if value.isascii():
        return value.replace("\x00", REPLACEMENT) if "\x00" in value else value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(REPLACEMENT if _unstorable(c) else c for c in value)
    return value.replace("\x00", REPLACEMENT) if "\x00" in value else value


def storable(value: Any) -> Any:
    """Every string in ``value`` (dicts, with their keys, lists, tuples) made storable."""
    if value is None or type(value) in _SCALARS:  # most of a record: no ABC check
        return value
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, Mapping):
        if _flat_and_clean(value):
            return dict(value)
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    return value


def _flat_and_clean(mapping: Mapping[Any, Any]) -> bool:
    """Whether every key is a string and every value a scalar, None or a string, and all those
    strings are ASCII without NUL: a request record's usual shape, for which storable changes
    nothing. Checked by a few C calls instead of a Python call per key and per value (this
    runs for every request's record, and again where it is stored)."""
    values = mapping.values()
    if not _FLAT_TYPES.issuperset(map(type, values)):
        return False
    try:
        texts = "".join(mapping) + "".join([v for v in values if type(v) is str])
    except TypeError:  # a key that is not a string
        return False
    return texts.isascii() and "\x00" not in texts


def text_digest(value: str) -> str:
    """SHA-256 of a string's UTF-8 bytes (lone surrogates kept as their own bytes)."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def bounded_path(path: str) -> tuple[str, str | None]:
    """(the path as recorded, the SHA-256 of the whole path when it had to be cut, else None)."""
    if len(path) <= PATH_LIMIT_BYTES and (path.isascii() or _utf8_size(path) <= PATH_LIMIT_BYTES):
        return path, None
    if path.isascii():
        return path[:PATH_LIMIT_BYTES], text_digest(path)
    kept, size = [], 0
    for char in path:
        size += _utf8_size(char)
        if size > PATH_LIMIT_BYTES:
            break
        kept.append(char)
    return "".join(kept), text_digest(path)


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def record_digest(record: Mapping[str, Any]) -> str:
    """SHA-256 of a record's canonical JSON (sorted keys, compact, ASCII): what a placeholder
    names an unstorable record by."""
    try:
        canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    except (ValueError, TypeError, RecursionError):  # circular, or keys that cannot be sorted
        canonical = ascii(record)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()
