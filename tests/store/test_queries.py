"""The loader of queries.sql: named parameters translated once into asyncpg's numbered ones,
literals and comments left as written, and calls bound by name or refused."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st

from proxy.store import queries
from proxy.store.queries import QUERIES, Query, load_queries, translate


@pytest.mark.parametrize(
    ("scenario", "sql", "expected", "parameters"),
    [
        ("in order", "SELECT %(b)s, %(a)s", "SELECT $1, $2", ("b", "a")),
        (
            "a repeated name keeps its number",
            "x = %(o)s OR y = %(p)s OR z = %(o)s",
            "x = $1 OR y = $2 OR z = $1",
            ("o", "p"),
        ),
        (
            "casts",
            "%(a)s::jsonb->>'k', x::text, %(b)s::float8",
            "$1::jsonb->>'k', x::text, $2::float8",
            ("a", "b"),
        ),
        (
            "a LIKE pattern",
            "stream LIKE 'requests/%' AND s = %(s)s",
            "stream LIKE 'requests/%' AND s = $1",
            ("s",),
        ),
        (
            "format's directives",
            "format('%I TO %1$I', %(role)s)",
            "format('%I TO %1$I', $1)",
            ("role",),
        ),
        (
            "a placeholder in a literal is text",
            "SELECT '%(a)s', %(b)s",
            "SELECT '%(a)s', $1",
            ("b",),
        ),
        ("a doubled quote", "SELECT 'it''s %(a)s', %(b)s", "SELECT 'it''s %(a)s', $1", ("b",)),
        ("an escape string", r"SELECT E'\' %(a)s', %(b)s", r"SELECT E'\' %(a)s', $1", ("b",)),
        ("a quoted identifier", 'SELECT "x%(a)s""y", %(b)s', 'SELECT "x%(a)s""y", $1', ("b",)),
        (
            "a line comment",
            "SELECT 1 -- %(a)s $1 50%\n, %(b)s",
            "SELECT 1 -- %(a)s $1 50%\n, $1",
            ("b",),
        ),
        (
            "a nested block comment",
            "/* a /* %(a)s */ $1 */ %(b)s",
            "/* a /* %(a)s */ $1 */ $1",
            ("b",),
        ),
        (
            "a dollar quote",
            "$$ %(a)s $1 $$, $f$ % $f$, %(b)s",
            "$$ %(a)s $1 $$, $f$ % $f$, $1",
            ("b",),
        ),
        ("a dollar in an identifier", "SELECT a$1, %(b)s", "SELECT a$1, $1", ("b",)),
        ("nothing to bind", "SELECT now()", "SELECT now()", ()),
    ],
)
def test_translate(scenario: str, sql: str, expected: str, parameters: tuple[str, ...]) -> None:
    """Each placeholder in SQL becomes its number; literals, identifiers and comments stay."""
    assert translate(sql) == (expected, parameters), scenario


@pytest.mark.parametrize(
    ("scenario", "sql", "message"),
    [
        ("a modulo", "SELECT 7 % 2", "not a %"),
        ("a name in capitals", "SELECT %(Name)s", "not a %"),
        ("no conversion", "SELECT %(a)", "not a %"),
        ("a positional parameter", "SELECT $1", "positional"),
        ("psycopg's escaped percent", "SELECT 7 %% 2", "not a %"),
        ("a literal left open", "SELECT 'abc", "left open"),
        ("an identifier left open", 'SELECT "abc', "left open"),
        ("a comment left open", "SELECT /* /* */ 1", "left open"),
        ("a dollar quote left open", "SELECT $q$ 1", "left open"),
        ("a stray dollar", "SELECT $", "opens nothing"),
    ],
)
def test_translate_refuses(scenario: str, sql: str, message: str) -> None:
    """A placeholder that is not exactly %(name)s, or a numbered one, is refused, not guessed."""
    with pytest.raises(ValueError, match=message):
        translate(sql)


_NAMES = st.sampled_from(["a", "owner", "seconds", "request_json"])
_TEXT = st.text(alphabet=st.sampled_from(list("ab%()$s'\"\\-*/ \n:")), max_size=12)
_TOKENS = st.lists(
    st.one_of(
        st.tuples(st.just("parameter"), _NAMES),
        st.tuples(st.just("literal"), _TEXT),
        st.tuples(st.just("identifier"), _TEXT),
        st.tuples(st.just("comment"), _TEXT.map(lambda t: t.replace("\n", " "))),
        st.tuples(st.just("sql"), st.sampled_from(["x", "::jsonb", " = ", ", ", "(", ")", "->>"])),
    ),
    max_size=20,
)


@given(_TOKENS)
def test_translate_numbers_each_name_once_and_copies_the_rest(
    tokens: list[tuple[str, str]],
) -> None:
    """Any SQL made of placeholders, literals, identifiers, comments and code translates to the
    same pieces with each name's first-use number in its place."""
    written, expected, numbers = [], [], {}
    for kind, value in tokens:
        if kind == "parameter":
            written.append(f"%({value})s")
            expected.append(f"${numbers.setdefault(value, len(numbers) + 1)}")
            continue
        piece = {
            "literal": "'" + value.replace("'", "''") + "'",
            "identifier": '"' + value.replace('"', '""') + '"',
            # no / or * inside: `/*/*/` opens a nested comment, in PostgreSQL too
            "comment": "/*" + value.replace("/", "").replace("*", "") + "*/",
            "sql": value,
        }[kind]
        # a space keeps each piece whole: `x` then a literal is not E'...' nor one word
        written.append(f" {piece} ")
        expected.append(f" {piece} ")
    assert translate("".join(written)) == ("".join(expected), tuple(numbers))


def test_every_query_in_queries_sql_is_named() -> None:
    """queries.sql loads: no query keeps a numbered parameter or a stray %."""
    loaded = load_queries()
    assert loaded.keys() == QUERIES.keys()


def test_a_repeated_definition_or_a_reserved_name_does_not_load() -> None:
    """Two queries of one name, or a parameter the calls keep for themselves, are refused."""
    with pytest.raises(RuntimeError, match="twice"):
        load_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")
    with pytest.raises(RuntimeError, match="reserved"):
        load_queries("-- name: a\nSELECT %(timeout)s;\n")
    with pytest.raises(RuntimeError, match="query b"):
        load_queries("-- name: b\nSELECT $1;\n")


def test_arguments_are_bound_by_name_in_the_numbers_order() -> None:
    """Keyword values come out in the order of $1..$n, whatever order they were given in."""
    query = Query("q", "SELECT $1, $2", ("owner", "seconds"))
    assert query.arguments({"seconds": 30.0, "owner": "me"}) == ("me", 30.0)


@pytest.mark.parametrize(
    ("scenario", "values", "message"),
    [
        ("missing", {"owner": "me"}, r"missing parameters \['seconds'\], unknown parameters \[\]"),
        ("extra", {"owner": "me", "seconds": 1, "ownr": "x"}, r"unknown parameters \['ownr'\]"),
        ("misspelt", {"owner": "me", "secs": 1}, r"\['seconds'\].*\['secs'\]"),
    ],
)
def test_arguments_refuse_a_missing_or_unknown_name(
    scenario: str, values: dict[str, object], message: str
) -> None:
    """A name missing or not the query's raises TypeError naming both, never binds."""
    query = Query("q", "SELECT $1, $2", ("owner", "seconds"))
    with pytest.raises(TypeError, match=message):
        query.arguments(values)


@pytest_asyncio.fixture(loop_scope="session")
async def connection(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    try:
        yield conn
    finally:
        await conn.close()


async def test_calls_run_a_query_by_name_and_refuse_a_wrong_name(
    connection: asyncpg.Connection,
) -> None:
    """The calls bind keywords against PostgreSQL, and a misspelt name fails before sending."""
    assert await queries.fetchrow(connection, "load_operation", operation_id="none") is None
    with pytest.raises(TypeError, match="operation_id"):
        await queries.fetchrow(connection, "load_operation", operation=None)
    assert await queries.fetchval(connection, "ping") is False


async def test_every_query_prepares_with_as_many_parameters_as_names(
    connection: asyncpg.Connection,
) -> None:
    """PostgreSQL itself sees exactly the parameters the loader named, for every query."""
    for query in QUERIES.values():
        statement = await connection.prepare(query.sql)
        assert len(statement.get_parameters()) == len(query.parameters), query.name
