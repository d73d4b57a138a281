"""Appending agent-request records to the audit log off the request path, in batches.

A request's decision never waits for, or fails because of, this write: ``submit`` only queues.
The canonical record has already gone to stdout (the JSON log line) when it is queued, so a
record lost here (the process killed before a flush, or the queue full during a long database
outage) is still in the log stream; losses are counted (``opgate_audit_records_dropped_total``).
State transitions never go through here: they are chained in their own statement.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg
import structlog

from proxy.errors import StoreUnavailable
from proxy.observe.auditlog import records
from proxy.store.store import Store

_log = structlog.get_logger("opgate.audit_writer")
_MAX_BACKOFF_SECONDS = 5.0


class RequestRecordWriter:
    def __init__(
        self,
        store: Store,
        stream: str,
        *,
        max_pending: int = 10_000,
        batch_size: int = 500,
    ) -> None:
        self._store = store
        self._stream = stream
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(max_pending)
        self._batch_size = batch_size
        self._task: asyncio.Task[None] | None = None
        self.written = 0
        self.dropped = 0

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="audit-request-writer")

    def submit(self, record: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                _log.error("audit_records_dropped", dropped=self.dropped, stream=self._stream)

    async def flush(self) -> None:
        """Wait until every record submitted so far is written (tests, shutdown)."""
        await self._queue.join()

    async def close(self, grace_seconds: float = 5.0) -> None:
        """Write what is queued (for at most ``grace_seconds``), then stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), grace_seconds)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        lost = self._queue.qsize()
        if lost:
            self.dropped += lost
            _log.error("audit_records_dropped", dropped=self.dropped, stream=self._stream)

    async def _write(self, batch: list[dict[str, Any]]) -> None:
        await self._store.run(
            lambda conn: records.append_batch(conn, self._stream, "request", batch)
        )

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            while True:
                try:
                    await self._write(batch)
                    break
                except (StoreUnavailable, asyncpg.PostgresError) as exc:
                    _log.warning("audit_write_retry", error=str(exc), records=len(batch))
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)
            backoff = 0.05
            self.written += len(batch)
            for _ in batch:
                self._queue.task_done()


class Checkpointer:
    """Signs the moved chain heads every ``interval`` seconds, and once more on close."""

    def __init__(self, store: Store, key: bytes, writer: str, interval: float) -> None:
        self._store = store
        self._key = key
        self._writer = writer
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="audit-checkpointer")

    async def checkpoint(self) -> int | None:
        written = await self._store.run(
            lambda conn: records.write_checkpoint(conn, self._key, self._writer)
        )
        if written is None:
            return None
        checkpoint_id, mac = written
        # The MAC in the log stream is the copy outside the database that makes deleting the
        # latest checkpoints detectable (docs/audit.md).
        _log.info("audit_checkpoint", checkpoint_id=checkpoint_id, mac=mac.hex())
        return checkpoint_id

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        with contextlib.suppress(StoreUnavailable, asyncpg.PostgresError):
            await self.checkpoint()

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._interval)
            if self._stop.is_set():
                return
            try:
                await self.checkpoint()
            except (StoreUnavailable, asyncpg.PostgresError) as exc:
                _log.warning("audit_checkpoint_failed", error=str(exc))
