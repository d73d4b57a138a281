"""Policies with preconditions, and the provider requests they make."""

from __future__ import annotations

from typing import Any

import asyncpg

from tests.support.fault_provider import FaultProvider
from tests.support.opgate import (
    fault_policy,
)

# The fault provider lists every refund it made: none may exist before ours.
NOT_YET_REFUNDED = """
    preconditions:
      recheck_after_seconds: {recheck}
      lookups:
        - path: /v1/refunds
          query: {{charge: "{{charge}}"}}
          require: ['/object == "list"', "/data == []"]"""


def policy_with_preconditions(
    recheck: float = 0, mode: str | None = None, *, deduplicates: bool = False, **kw: Any
) -> str:
    """The suite's fault policy, its refund rule asking the provider first."""
    text = fault_policy(deduplicates=deduplicates, **kw)
    marker = "\n  - name: refund.cancel"
    text = text.replace(marker, NOT_YET_REFUNDED.format(recheck=recheck) + marker, 1)
    if mode is not None:
        text = text.replace("provider: fault\n", f"provider: fault\nmode: {mode}\n")
    return text


def posts(provider: FaultProvider) -> int:
    return sum(1 for r in provider.requests if r.method == "POST")


def gets(provider: FaultProvider) -> list[str]:
    return [r.query_string for r in provider.requests if r.method == "GET"]


async def age_approval(database_url: str, operation_id: str, minutes: int) -> None:
    """The approval was given ``minutes`` ago (past the rule's recheck_after_seconds)."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE operations SET created_at = now() - make_interval(mins => $2) "
            "WHERE operation_id = $1",
            operation_id,
            minutes,
        )
    finally:
        await conn.close()
