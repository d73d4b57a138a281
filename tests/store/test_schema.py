"""proxy/store/schema.sql is the schema the migrations build, and the dump sees a change."""

from __future__ import annotations

import difflib
import uuid

import asyncpg

from proxy.store.schema import REGENERATE, SCHEMA_FILE, dump_schema, schema_of_migrations
from tests.support.postgres import dsn_for_database


def _difference(committed: str, built: str) -> str:
    """The unified diff from the committed file to what the migrations build (at most 80
    lines), or "" when they agree."""
    lines = difflib.unified_diff(
        committed.splitlines(),
        built.splitlines(),
        "proxy/store/schema.sql (committed)",
        "the migrations (built now)",
        lineterm="",
    )
    return "\n".join(list(lines)[:80])


async def test_schema_sql_is_what_the_migrations_build(pg_server_dsn: str) -> None:
    """A database built from every migration dumps to exactly the committed schema.sql."""
    built = await schema_of_migrations(pg_server_dsn)
    difference = _difference(SCHEMA_FILE.read_text("utf-8"), built)
    assert not difference, (
        f"proxy/store/schema.sql differs from what the migrations build; run\n    {REGENERATE}\n"
        f"and commit the result (review the diff: it is what your migration changed).\n"
        f"{difference}"
    )


async def test_the_dump_shows_a_change_to_the_schema(pg_server_dsn: str, pg_template: str) -> None:
    """An index, a column and a function body added after the migrations each show in the diff,
    so a migration's change cannot pass the check above unnoticed."""
    name = f"opgate_schema_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
        conn = await asyncpg.connect(dsn_for_database(pg_server_dsn, name))
        try:
            before = await dump_schema(conn)
            await conn.execute("CREATE INDEX timelines_by_marked ON timelines (marked)")
            await conn.execute("ALTER TABLE timelines ADD COLUMN note text")
            await conn.execute(
                "CREATE OR REPLACE FUNCTION opgate_unsettled(status text) RETURNS boolean"
                " LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT $1 = 'created' $$"
            )
            after = await dump_schema(conn)
        finally:
            await conn.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    difference = _difference(before, after)
    added = {line for line in difference.splitlines() if line.startswith("+")}
    assert "+CREATE INDEX timelines_by_marked ON timelines USING btree (marked);" in added
    assert "+    note text," in added
    assert "+AS $function$ SELECT $1 = 'created' $function$;" in added
    assert before == SCHEMA_FILE.read_text("utf-8")
