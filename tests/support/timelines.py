"""Making a database look as if it had been promoted from a lower timeline."""

from __future__ import annotations

import asyncpg

from proxy.store.store import see_timeline


async def pretend_the_last_timeline_was_lower(database_url: str) -> int:
    """The recorded history ends one timeline below the server's: the next connection sees
    a switch. Returns the server's timeline."""
    conn = await asyncpg.connect(database_url)
    try:
        current = (await see_timeline(conn)).current
        assert current is not None
        await conn.execute("DELETE FROM timelines")
        await conn.execute("INSERT INTO timelines (timeline_id) VALUES ($1)", current - 1)
        return current
    finally:
        await conn.close()
