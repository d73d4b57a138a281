"""The named queries of ``queries.sql``, loaded once."""

from __future__ import annotations

import re
from importlib import resources

_NAME_LINE = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)


def load_queries() -> dict[str, str]:
    text = (resources.files("proxy.store") / "queries.sql").read_text("utf-8")
    parts = _NAME_LINE.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"query {name} is defined twice in queries.sql")
        sql = "\n".join(line for line in body.splitlines() if not line.startswith("--")).strip()
        queries[name] = sql.rstrip(";")
    return queries


QUERIES = load_queries()
