"""The named queries of ``queries.sql``, loaded once, and the calls that run them by name.

A query takes named parameters, ``%(name)s`` (procrastinate's style), translated once at load
into asyncpg's ``$1``..``$n`` with the names in their order: a name used twice keeps its
number, so its value is passed once. A call binds keyword arguments to those names and fails
loudly (``TypeError``) on a name missing or not the query's: a value can never land in
another parameter's place. Placeholders count only in SQL itself: string literals, quoted
identifiers, comments and dollar-quoted bodies are copied unread, so ``'requests/%'`` and
``format('%I', ...)`` stay literal. Outside them any other ``%``, and a positional ``$n``,
refuse to load: every query is named, and an ambiguous placeholder is never guessed.

Stdlib only at run time (bench/run.py loads it without the proxy's dependencies).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncpg

_NAME_LINE = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"%\(([a-z_][a-z0-9_]*)\)s")
_DOLLAR_QUOTE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_POSITIONAL = re.compile(r"\$[0-9]")
# The calls' own keyword: a parameter of that name could never be bound through them.
_RESERVED = frozenset({"timeout"})


@dataclass(frozen=True)
class Query:
    """One statement of ``queries.sql``: ``sql`` as asyncpg takes it (``$n``) and
    ``parameters``, the name of ``$1``, ``$2``, ... in order."""

    name: str
    sql: str
    parameters: tuple[str, ...]
    _names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_names", frozenset(self.parameters))

    def arguments(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """``values`` in the order of ``$1``..``$n``; TypeError unless they name exactly the
        query's parameters."""
        if values.keys() != self._names:
            missing = sorted(self._names - values.keys())
            extra = sorted(values.keys() - self._names)
            raise TypeError(
                f"query {self.name}: missing parameters {missing}, unknown parameters {extra}"
            )
        return tuple(values[name] for name in self.parameters)


def translate(text: str) -> tuple[str, tuple[str, ...]]:
    """``text`` with each ``%(name)s`` outside literals and comments replaced by ``$n``, and
    the names in the order of their numbers. ValueError on any other ``%`` or a ``$n`` there,
    and on a literal, identifier or comment left open."""
    numbers: dict[str, int] = {}
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        after_word = i > 0 and _is_word(text[i - 1])
        if c == "%":
            match = _PLACEHOLDER.match(text, i)
            if match is None:
                raise ValueError(
                    f"a % that is not a %(name)s placeholder at {i}: {text[i : i + 20]!r}"
                )
            number = numbers.setdefault(match.group(1), len(numbers) + 1)
            out.append(f"${number}")
            i = match.end()
            continue
        if c == "'":
            # E'...' takes backslash escapes; every literal takes '' for a quote
            escapes = i > 0 and text[i - 1] in "Ee" and not (i > 1 and _is_word(text[i - 2]))
            end = _literal_end(text, i + 1, "'", backslash=escapes)
        elif c == '"':
            end = _literal_end(text, i + 1, '"', backslash=False)
        elif text.startswith("--", i):
            newline = text.find("\n", i)
            end = n if newline < 0 else newline
        elif text.startswith("/*", i):
            end = _block_comment_end(text, i)
        elif c == "$" and not after_word:
            if _POSITIONAL.match(text, i):
                raise ValueError(f"a positional parameter at {i}: {text[i : i + 20]!r}; name it")
            quote = _DOLLAR_QUOTE.match(text, i)
            if quote is None:
                raise ValueError(f"a $ that opens nothing at {i}: {text[i : i + 20]!r}")
            close = text.find(quote.group(0), quote.end())
            if close < 0:
                raise ValueError(f"dollar quote {quote.group(0)} left open at {i}")
            end = close + len(quote.group(0))
        else:
            end = i + 1
        out.append(text[i:end])
        i = end
    return "".join(out), tuple(numbers)


def _is_word(c: str) -> bool:
    return c.isalnum() or c in "_$"


def _literal_end(text: str, i: int, quote: str, *, backslash: bool) -> int:
    """Just past the quote that closes the literal whose body starts at ``i``."""
    while i < len(text):
        c = text[i]
        if backslash and c == "\\":
            i += 2
        elif c == quote:
            if text.startswith(quote, i + 1):  # a doubled quote is one quote character
                i += 2
            else:
                return i + 1
        else:
            i += 1
    raise ValueError(f"a {quote} literal left open")


def _block_comment_end(text: str, i: int) -> int:
    """Just past the ``*/`` that closes the comment at ``i`` (PostgreSQL's nest)."""
    depth = 0
    while i < len(text):
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    raise ValueError("a /* comment left open")


def load_queries(text: str | None = None) -> dict[str, Query]:
    """Every query of ``queries.sql`` (or of ``text``), translated."""
    if text is None:
        text = (resources.files("proxy.store") / "queries.sql").read_text("utf-8")
    parts = _NAME_LINE.split(text)
    queries: dict[str, Query] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"query {name} is defined twice in queries.sql")
        sql = "\n".join(line for line in body.splitlines() if not line.startswith("--")).strip()
        try:
            translated, parameters = translate(sql.rstrip(";"))
        except ValueError as exc:
            raise RuntimeError(f"query {name} in queries.sql: {exc}") from exc
        reserved = _RESERVED.intersection(parameters)
        if reserved:
            raise RuntimeError(f"query {name}: parameter name {sorted(reserved)} is reserved")
        queries[name] = Query(name, translated, parameters)
    return queries


QUERIES = load_queries()


# The calls: queries.sql's statement ``name`` on ``conn``, its parameters bound by keyword
# (``timeout``, the one keyword of the calls' own, is reserved: _RESERVED).


async def execute(conn: asyncpg.Connection, name: str, /, **values: Any) -> str:
    query = QUERIES[name]
    status: str = await conn.execute(query.sql, *query.arguments(values))
    return status


async def fetch(conn: asyncpg.Connection, name: str, /, **values: Any) -> list[asyncpg.Record]:
    query = QUERIES[name]
    rows: list[asyncpg.Record] = await conn.fetch(query.sql, *query.arguments(values))
    return rows


async def fetchrow(conn: asyncpg.Connection, name: str, /, **values: Any) -> asyncpg.Record | None:
    query = QUERIES[name]
    row: asyncpg.Record | None = await conn.fetchrow(query.sql, *query.arguments(values))
    return row


async def fetchval(
    conn: asyncpg.Connection,
    name: str,
    /,
    *,
    timeout: float | None = None,  # noqa: ASYNC109 (asyncpg's: it cancels the statement too)
    **values: Any,
) -> Any:
    """``timeout``: asyncpg's, in seconds (a statement still running is cancelled on the
    server)."""
    query = QUERIES[name]
    return await conn.fetchval(query.sql, *query.arguments(values), timeout=timeout)


def cursor(conn: asyncpg.Connection, name: str, /, **values: Any) -> Any:
    """An asyncpg cursor factory (``async for``, in the caller's transaction)."""
    query = QUERIES[name]
    return conn.cursor(query.sql, *query.arguments(values))
