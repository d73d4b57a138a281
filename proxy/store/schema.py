"""The current schema as one readable file, written from a database the migrations built.

``proxy/store/schema.sql`` is what migrations 0001..n leave behind: its tables (columns,
defaults, constraints), sequences, indexes, views, functions and triggers, each kind in its own
section and sorted by name, so that the file changes exactly where a migration changed
something. It is generated, never edited, and never run: the migrations stay the only way a
database changes. tests/store/test_schema.py builds a database from the migrations and fails,
naming the difference, when the file no longer matches them. To rewrite it::

    .venv/bin/python -m proxy.store.schema

It reads the catalogs through asyncpg rather than running pg_dump, so that it needs no client
binary and prints the same text from PostgreSQL 15 (Debian's) and 16 (the embedded pgserver).
Owners and grants are left out: they depend on who installs opgate, not on the migrations.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

from proxy.store.embedded import start_embedded
from proxy.store.migrate import load_migrations, migrate

SCHEMA_FILE = Path(__file__).with_name("schema.sql")
REGENERATE = ".venv/bin/python -m proxy.store.schema"

_TABLES = """
SELECT c.oid, c.relname, c.relpersistence
  FROM pg_class c
 WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
 ORDER BY c.relname
"""
_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull,
       a.attidentity, a.attgenerated, pg_get_expr(d.adbin, d.adrelid) AS default_expr
  FROM pg_attribute a
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum
"""
# contype orders primary key, unique, foreign keys and checks the same way on every server
_CONSTRAINTS = """
SELECT conname, pg_get_constraintdef(oid) AS definition
  FROM pg_constraint
 WHERE conrelid = $1
 ORDER BY array_position(ARRAY['p', 'u', 'f', 'c', 'x']::"char"[], contype), conname
"""
_SEQUENCES = """
SELECT c.relname, format_type(s.seqtypid, NULL) AS type, s.seqstart, s.seqincrement,
       s.seqmin, s.seqmax, s.seqcache, s.seqcycle,
       (SELECT t.relname || '.' || a.attname
          FROM pg_depend dep
          JOIN pg_class t ON t.oid = dep.refobjid
          JOIN pg_attribute a ON a.attrelid = dep.refobjid AND a.attnum = dep.refobjsubid
         WHERE dep.classid = 'pg_class'::regclass AND dep.objid = c.oid
           AND dep.deptype IN ('a', 'i')) AS owned_by
  FROM pg_class c
  JOIN pg_sequence s ON s.seqrelid = c.oid
 WHERE c.relnamespace = current_schema()::regnamespace
 ORDER BY c.relname
"""
# indexes that back a constraint are shown with the constraint
_INDEXES = """
SELECT i.relname, pg_get_indexdef(i.oid) AS definition
  FROM pg_index x
  JOIN pg_class i ON i.oid = x.indexrelid
  JOIN pg_class t ON t.oid = x.indrelid
 WHERE t.relnamespace = current_schema()::regnamespace
   AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.oid)
 ORDER BY t.relname, i.relname
"""
_VIEWS = """
SELECT c.relname, pg_get_viewdef(c.oid, true) AS definition
  FROM pg_class c
 WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('v', 'm')
 ORDER BY c.relname
"""
_FUNCTIONS = """
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS arguments,
       pg_get_functiondef(p.oid) AS definition
  FROM pg_proc p
 WHERE p.pronamespace = current_schema()::regnamespace
   AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
 ORDER BY p.proname, arguments
"""
_TRIGGERS = """
SELECT t.tgname, c.relname, pg_get_triggerdef(t.oid) AS definition
  FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relnamespace = current_schema()::regnamespace AND NOT t.tgisinternal
 ORDER BY c.relname, t.tgname
"""


async def dump_schema(conn: asyncpg.Connection) -> str:
    """The schema of ``conn``'s database (its current schema) as the text of schema.sql."""
    numbers = await conn.fetch("SELECT number, name FROM opgate_migrations ORDER BY number")
    last = numbers[-1]["name"] if numbers else "none"
    out = [
        "-- opgate's current schema: what the migrations in proxy/store/migrations/ build, up",
        f"-- to {last}. GENERATED, do not edit; it is never run. Rewrite it with",
        f"--     {REGENERATE}",
        "-- (tests/store/test_schema.py fails when it differs from what the migrations build).",
    ]
    out += _section("tables")
    for table in await conn.fetch(_TABLES):
        out.append(await _table(conn, table) + "\n")
    out += _section("sequences")
    for seq in await conn.fetch(_SEQUENCES):
        out.append(_sequence(seq))
    out += _section("indexes")
    out += [row["definition"].replace(" public.", " ") + ";" for row in await conn.fetch(_INDEXES)]
    out += _section("views")
    for view in await conn.fetch(_VIEWS):
        out.append(f"CREATE VIEW {view['relname']} AS\n{_indent(view['definition'])}\n")
    out += _section("functions")
    for function in await conn.fetch(_FUNCTIONS):
        body = function["definition"].replace("FUNCTION public.", "FUNCTION ").rstrip()
        out.append(body + ";\n")
    out += _section("triggers")
    for trigger in await conn.fetch(_TRIGGERS):
        out.append(_unqualified(trigger["definition"]) + ";")
    return "\n".join(out).rstrip() + "\n"


def _section(title: str) -> list[str]:
    return ["", f"-- {'-' * (94 - len(title))} {title}", ""]


def _indent(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.rstrip().rstrip(";").splitlines()) + ";"


def _unqualified(definition: str) -> str:
    return definition.replace(" public.", " ")


async def _table(conn: asyncpg.Connection, table: asyncpg.Record) -> str:
    lines = []
    for col in await conn.fetch(_COLUMNS, table["oid"]):
        line = f"    {col['attname']} {col['type']}"
        if col["attidentity"] in ("a", "d"):
            line += " GENERATED " + ("ALWAYS" if col["attidentity"] == "a" else "BY DEFAULT")
            line += " AS IDENTITY"
        elif col["attgenerated"] == "s":
            line += f" GENERATED ALWAYS AS ({col['default_expr']}) STORED"
        elif col["default_expr"] is not None:
            line += f" DEFAULT {col['default_expr']}"
        if col["attnotnull"]:
            line += " NOT NULL"
        lines.append(line)
    for con in await conn.fetch(_CONSTRAINTS, table["oid"]):
        lines.append(f"    CONSTRAINT {con['conname']} {_unqualified(con['definition'])}")
    unlogged = "UNLOGGED " if table["relpersistence"] == "u" else ""
    return f"CREATE {unlogged}TABLE {table['relname']} (\n" + ",\n".join(lines) + "\n);"


def _sequence(seq: asyncpg.Record) -> str:
    text = (
        f"CREATE SEQUENCE {seq['relname']} AS {seq['type']} START {seq['seqstart']}"
        f" INCREMENT {seq['seqincrement']} MINVALUE {seq['seqmin']} MAXVALUE {seq['seqmax']}"
        f" CACHE {seq['seqcache']}{' CYCLE' if seq['seqcycle'] else ''}"
    )
    if seq["owned_by"] is not None:
        text += f"\n    OWNED BY {seq['owned_by']}"
    return text + ";"


@contextlib.asynccontextmanager
async def migrated_scratch_database(
    server_dsn: str, prefix: str = "opgate_schema"
) -> AsyncIterator[asyncpg.Connection]:
    """A connection to a scratch database on ``server_dsn``'s server, built from every
    migration, dropped on the way out. The role must be allowed to create databases."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            dsn = urlunsplit(urlsplit(server_dsn)._replace(path="/" + quote(name, safe="")))
            await migrate(dsn)
            conn = await asyncpg.connect(dsn)
            try:
                yield conn
            finally:
                await conn.close()
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def schema_of_migrations(server_dsn: str) -> str:
    """Build a scratch database on ``server_dsn``'s server from every migration, dump it, drop
    it."""
    async with migrated_scratch_database(server_dsn) as conn:
        return await dump_schema(conn)


def _generate(server_dsn: str | None) -> str:
    if server_dsn is not None:
        return asyncio.run(schema_of_migrations(server_dsn))
    workdir = Path(tempfile.mkdtemp(prefix="opgate-schema-"))
    workdir.chmod(0o755)  # the embedded server's own user reads it when run as root
    server = start_embedded(workdir)
    try:
        return asyncio.run(schema_of_migrations(server.dsn))
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proxy.store.schema",
        description="Rewrite proxy/store/schema.sql from a database built by the migrations.",
    )
    parser.add_argument(
        "--server-url",
        help="a PostgreSQL server to build the scratch database on (a role that may create "
        "databases); without it, the embedded server in a temporary directory",
    )
    parser.add_argument("--check", action="store_true", help="only say whether the file is current")
    args = parser.parse_args(argv)
    text = _generate(args.server_url)
    current = SCHEMA_FILE.read_text("utf-8") if SCHEMA_FILE.exists() else ""
    if args.check:
        print("schema.sql is current" if text == current else f"schema.sql is stale: {REGENERATE}")
        return 0 if text == current else 1
    if text != current:
        SCHEMA_FILE.write_text(text, "utf-8")
    print(f"wrote {SCHEMA_FILE} ({len(load_migrations())} migrations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
