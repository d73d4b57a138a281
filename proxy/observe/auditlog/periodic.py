"""A job run every ``interval`` seconds in a task of its own, and once more on close: the
checkpointer and the integrator. A failure the job expects (the store down) is logged and the
job runs again at its next time; close waits for a running round, then runs the last one, whose
expected failure is left unsaid (the process is stopping; the next start catches up)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

_log = structlog.get_logger("opgate.audit")


class Periodic:
    """Runs ``job`` every ``interval`` seconds until closed, then once more."""

    def __init__(
        self,
        name: str,
        interval: float,
        job: Callable[[], Awaitable[object]],
        expected: tuple[type[Exception], ...],
        failed_event: str,
    ) -> None:
        self._name = name  # the task's
        self._failed_event = failed_event  # the log event of an expected failure
        self._interval = interval
        self._job = job
        self._expected = expected
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        with contextlib.suppress(*self._expected):
            await self._job()

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._interval)
            if self._stop.is_set():
                return
            try:
                await self._job()
            except self._expected as exc:
                _log.warning(self._failed_event, error=str(exc))
