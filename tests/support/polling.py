"""What tests wait with when there is no event to await, and a clock they move by hand."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def until(condition: Callable[[], T | Awaitable[T]], what: str, seconds: float = 5.0) -> T:
    """Poll ``condition`` on the loop, bounded, and answer its first truthy result: for state
    that nothing signals when it changes (a log list, a counter, a pool's queue), or, with a
    coroutine function, state only a query or a request can read (a row a background loop
    settles)."""
    try:
        async with asyncio.timeout(seconds):
            while True:
                result = condition()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return result
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"not within {seconds} s: {what}") from None


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
