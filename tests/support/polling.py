"""What tests wait with when there is no event to await, and a clock they move by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool], what: str, seconds: float = 5.0) -> None:
    """Poll ``condition`` on the loop, bounded: for state (a log list, a counter, a pool's
    queue) that nothing signals when it changes."""
    try:
        async with asyncio.timeout(seconds):
            while not condition():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"not within {seconds} s: {what}") from None


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
