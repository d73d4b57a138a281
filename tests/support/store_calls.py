"""Counting the store calls one request makes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.support.opgate import Opgate


def count_store_calls(gate: Opgate, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often the gate's store is asked to load a row (by id or key) and to claim one."""
    store, calls = gate.running.gateway.store, Counter[str]()
    for name in ("load", "load_by_key", "claim", "claim_within_budgets"):
        real: Callable[..., Awaitable[Any]] = getattr(store, name)

        async def counted(*args: Any, _name: str = name, _real: Any = real, **kw: Any) -> Any:
            calls[_name] += 1
            return await _real(*args, **kw)

        monkeypatch.setattr(store, name, counted)
    return calls
