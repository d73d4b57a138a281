"""Appending agent-request records to the audit log off the request path, in batches.

A request's decision never waits for, or fails because of, this write: ``admit`` numbers a
record (or counts it into a ``denials`` record, denials.py) and ``submit`` queues it, before
any other sink sees it (audit.emit): the canonical record then goes to stdout (the JSON log
line, with the same number), so a record lost here is still in the log stream, and a log sink
that fails costs no record here. State transitions never go through here: they are chained
in their own statement.

What can go wrong, and what the writer does about it:

- The database refuses one record (a data error, a value over a limit: SQLSTATE classes 22,
  23, 54). The batch is split in halves until the refused record is alone, and a placeholder
  is stored in its place: its number, request id, the SHA-256 of its canonical JSON and the
  error class. One bad record never holds up the others. If the placeholder is refused too,
  the fault was not the record's: that counts as the next case.
- The database refuses everything or does not answer. Records wait, in order, and are retried
  with backoff; once nothing has been stored for ``stall_seconds`` while records wait, the
  writer is ``stalled``: a log line (``audit_writer_stalled``), the metrics, and the ops
  listener's readiness say so. Past ``max_pending`` waiting records, new ones are dropped; their
  numbers go into a ``dropped`` record as soon as there is room, so that ``opgate audit
  verify`` reports them as dropped rather than missing.
- A batch's statement raises though its transaction committed (the answer lost with the
  connection in a failover; a synchronous standby's wait cancelled by the statement timeout).
  It is sent again like any other failure, and the database stores only the records no earlier
  attempt stored (migration 0015: each record's position in the run's queue says which): the
  batch is stored once, and counted in ``already_stored``.

Each run of the writer begins its stream's numbering with a ``started`` record (naming the
run by a random ``run_id``): numbers are 1, 2, 3... from there (``verify`` checks them run by
run). A SIGKILL loses what is still queued, at the tail, where the stored numbers cannot show
it; so each run leaves a trace in ``audit_instance_runs`` (migration 0012): the highest number
it had given out and the highest stored, written by the statement that stores each batch, by
a heartbeat every ``heartbeat_seconds`` while nothing else was written, and at a clean stop.
``verify`` names a run that ended without one, and what it had numbered and not stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import structlog

from proxy.errors import StoreUnavailable
from proxy.observe.audit import AUDIT_SCHEMA_VERSION
from proxy.observe.auditlog import records
from proxy.observe.auditlog.denials import DenialCounter, aggregable
from proxy.observe.auditlog.periodic import Periodic
from proxy.observe.auditlog.storable import record_digest
from proxy.store.store import Store

_log = structlog.get_logger("opgate.audit_writer")
_FIRST_BACKOFF_SECONDS = 0.05
_MAX_BACKOFF_SECONDS = 5.0
STALL_SECONDS = 5.0
# How often a run leaves a trace (audit_instance_runs) at the least, while it stores nothing:
# verify tells a running instance from one that ended by it (verify.MISSED_HEARTBEATS).
HEARTBEAT_SECONDS = 10.0
# How long a few waiting records wait for others to join them while records keep coming (the
# last batch was stored less than this long ago): a batch of records.MANY_RECORDS or more is
# chained by PostgreSQL in one statement, at a fraction of the CPU of a commit per record or
# two (bench/README.md). Nobody waits on this write (the log line has gone out); a quiet
# writer's record is stored at once.
LINGER_SECONDS = 0.02
# SQLSTATE classes one record can cause: data exception (22: NUL, bad escapes, a value out of
# range), integrity constraint violation (23), program limit exceeded (54: an index row too
# large). Anything else (connection, timeout, lock, read-only standby...) is the database's
# state, retried as it is.
_RECORD_FAULT_CLASSES = frozenset({"22", "23", "54"})
_MAX_PLACEHOLDER_ID = 64


def may_be_the_records_fault(exc: BaseException) -> bool:
    sqlstate = getattr(exc, "sqlstate", None)
    return (
        isinstance(exc, asyncpg.PostgresError)
        and isinstance(sqlstate, str)
        and sqlstate[:2] in _RECORD_FAULT_CLASSES
    )


def _now() -> str:
    return datetime.now(UTC).isoformat()


def placeholder(record: dict[str, Any], error: BaseException) -> dict[str, Any]:
    """What is stored instead of a record the database refused."""
    request_id = record.get("request_id")
    return {
        "schema_version": AUDIT_SCHEMA_VERSION,
        "record_type": "unstorable",
        "time": _now(),
        "instance_seq": record.get("instance_seq"),
        "request_id": str(request_id)[:_MAX_PLACEHOLDER_ID] if request_id is not None else None,
        "record_sha256": record_digest(record),
        "error": type(error).__name__,
        "sqlstate": getattr(error, "sqlstate", None),
    }


@dataclass
class _Pending:
    since: float  # when it was queued (monotonic)
    record: dict[str, Any]
    position: int  # its place in the order the run queues (and stores) records: 1, 2, 3...
    text: str | None = None  # the JSON it is stored as, once prepared
    stands_in: bool = False  # text is a placeholder for the record

    def prepare(self) -> None:
        if self.text is not None:
            return
        try:
            self.text = records.record_text(self.record)
        except (ValueError, TypeError, RecursionError) as exc:  # JSON cannot hold it
            self.text, self.stands_in = records.record_text(placeholder(self.record, exc)), True


class RequestRecordWriter:
    def __init__(
        self,
        store: Store,
        stream: str,
        *,
        max_pending: int = 10_000,
        batch_size: int = 500,
        stall_seconds: float = STALL_SECONDS,
        linger_seconds: float = LINGER_SECONDS,
        redact: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        denials: DenialCounter | None = None,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
    ) -> None:
        self._store = store
        self._stream = stream
        self.run_id = secrets.token_hex(8)
        self._heartbeat_seconds = heartbeat_seconds
        self._traced: float | None = None  # event loop time the run's trace was last written
        self._beating: asyncio.Task[None] | None = None
        self._stored_seq = 0  # the highest number stored or declared dropped
        self.max_pending = max_pending
        self._batch_size = batch_size
        self.stall_seconds = stall_seconds
        self._linger_seconds = linger_seconds
        self._flushes = 0  # flushes waiting: the writer does not linger for them
        self._last_stored: float | None = None  # event loop time a batch was last stored
        self._redact = redact or (lambda record: record)
        self._denials = denials or DenialCounter()
        self._clock = clock
        self._pending: deque[_Pending] = deque()
        self._wakeup = asyncio.Event()
        # How many waiting records end the writer's wait: one while it waits for work, a
        # batch's worth while it lingers. A record below that does not wake the writer task
        # (which would only find it still has to wait) on every request.
        self._wake_at = 1
        self._closing = False
        self._idle = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_seq = 0
        self._queued = 0  # records this run has queued: the last one's position
        self._dropped_seqs: list[list[int]] = []  # [first, last] ranges not yet on record
        self._dropped_unrecorded = 0
        self._waiting_since: float | None = None  # records wait and nothing was stored since
        self._stall_reported = False
        self.written = 0
        self.dropped = 0
        self.unstorable = 0
        self.aggregated = 0
        self.failures = 0
        self.already_stored = 0  # records a retried batch found stored (its commit's ack lost)
        started = {
            "schema_version": AUDIT_SCHEMA_VERSION,
            "record_type": "started",
            "time": _now(),
            "run_id": self.run_id,
        }
        self._enqueue(started)

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def oldest_pending_seconds(self) -> float:
        return self._clock() - self._pending[0].since if self._pending else 0.0

    @property
    def stalled(self) -> bool:
        """Records wait and nothing has been stored for ``stall_seconds``."""
        since = self._waiting_since
        return since is not None and self._clock() - since >= self.stall_seconds

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="audit-request-writer")
        self._beating = asyncio.create_task(self._beat(), name="audit-run-heartbeat")

    def run_trace(self, stored_seq: int | None = None, *, stopped: bool = False) -> dict[str, Any]:
        """This run's row of ``audit_instance_runs`` as it stands (migration 0012)."""
        return {
            "run_id": self.run_id,
            "instance_id": self._stream.removeprefix(records.REQUEST_STREAM_PREFIX),
            "stream": self._stream,
            "numbered_seq": self._last_seq,
            "stored_seq": self._stored_seq if stored_seq is None else stored_seq,
            "heartbeat_seconds": self._heartbeat_seconds,
            "stopped": stopped,
        }

    def admit(self, fields: dict[str, Any]) -> None:
        """First: give the record its number, or count it (``aggregated``)."""
        now = self._clock()
        self._close_window_if_due(now)
        if aggregable(fields) and self._denials.fold(self._redact(fields), now):
            fields["aggregated"] = True
            self.aggregated += 1
            return
        fields["instance_seq"] = self._number()

    def submit(
        self, record: dict[str, Any], *, redacted: bool = False, text: str | None = None
    ) -> None:
        """Before the log line: queue the record (redacted, unless it was already; ``text``:
        its ``records.record_text``, when already made), unless it was counted."""
        if record.get("aggregated"):
            return
        self._enqueue(record if redacted else self._redact(record), text if redacted else None)

    async def flush(self) -> None:
        """End the open denial window and wait until every record so far is stored."""
        self._close_window()
        self._flushes += 1
        self._wakeup.set()
        try:
            while self._pending:
                await self._idle.wait()
        finally:
            self._flushes -= 1

    async def close(self, grace_seconds: float = 5.0) -> None:
        """Write what is queued (for at most ``grace_seconds``), then stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), grace_seconds)
        # The loop also stops by itself at its next turn: a cancellation alone can be lost
        # (Python 3.11's wait_for swallows one that arrives as its inner wait completes).
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), grace_seconds)
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beating
        while self._pending:
            self._note_dropped(self._pending.popleft().record)
        if self._dropped_unrecorded:
            _log.error(
                "audit_records_dropped",
                dropped=self.dropped,
                stream=self._stream,
                instance_seqs=self._dropped_seqs,
            )
        # The clean stop, on record: verify then names no unclean end (and counts what was
        # numbered and not stored, if anything was dropped above).
        try:
            await self._store.run(lambda conn: records.run_seen(conn, self.run_trace(stopped=True)))
        except Exception as exc:  # a stop must finish: verify will call it unclean, rightly
            _log.error("audit_run_stop_unrecorded", stream=self._stream, error=str(exc))

    # --- queueing ---

    def _number(self) -> int:
        self._last_seq += 1
        return self._last_seq

    def _close_window_if_due(self, now: float) -> None:
        if self._denials.due(now):
            self._close_window()

    def _close_window(self) -> None:
        for counted in self._denials.close():
            counted["instance_seq"] = self._number()
            self._enqueue(counted)

    def _enqueue(self, record: dict[str, Any], text: str | None = None) -> None:
        self._record_drops_if_room()
        if len(self._pending) >= self.max_pending:
            self._note_dropped(record)
            if self.dropped == 1 or self.dropped % 1000 == 0:
                _log.error("audit_records_dropped", dropped=self.dropped, stream=self._stream)
            return
        self._append(record, text)

    def _append(self, record: dict[str, Any], text: str | None = None) -> None:
        now = self._clock()
        if self._waiting_since is None:
            self._waiting_since = now
        self._queued += 1
        self._pending.append(_Pending(now, record, self._queued, text))
        self._idle.clear()
        if len(self._pending) >= self._wake_at:
            self._wakeup.set()

    def _note_dropped(self, record: dict[str, Any]) -> None:
        self.dropped += 1
        self._dropped_unrecorded += 1
        seq = record.get("instance_seq")
        if not isinstance(seq, int):
            return
        if self._dropped_seqs and self._dropped_seqs[-1][1] == seq - 1:
            self._dropped_seqs[-1][1] = seq
        else:
            self._dropped_seqs.append([seq, seq])

    def _record_drops_if_room(self) -> None:
        """Put the drops so far on record, as soon as the queue has room for it."""
        if not self._dropped_unrecorded or len(self._pending) >= self.max_pending:
            return
        self._append(
            {
                "schema_version": AUDIT_SCHEMA_VERSION,
                "record_type": "dropped",
                "time": _now(),
                "dropped": self._dropped_seqs,
                "count": self._dropped_unrecorded,
            }
        )
        self._dropped_seqs, self._dropped_unrecorded = [], 0

    # --- writing ---

    async def _run(self) -> None:
        backoff = _FIRST_BACKOFF_SECONDS
        while not self._closing:
            self._close_window_if_due(self._clock())
            if not self._pending:
                self._idle.set()
                await self._wait_for_work()
                continue
            await self._linger()
            batch = list(itertools.islice(self._pending, self._batch_size))
            try:
                for entry in batch:
                    entry.prepare()
                await self._store_entries(batch)
            except Exception as exc:
                self._failed(exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)
            else:
                backoff = _FIRST_BACKOFF_SECONDS

    async def _linger(self) -> None:
        """While fewer than records.MANY_RECORDS wait, wait up to ``linger_seconds`` for more
        if records keep coming (not for a flush, nor when closing)."""
        last = self._last_stored
        if last is None or asyncio.get_running_loop().time() - last >= self._linger_seconds:
            return
        self._wake_at = records.MANY_RECORDS  # a flush and closing wake it as well
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._linger_seconds):
                    while (
                        len(self._pending) < records.MANY_RECORDS
                        and not self._flushes
                        and not self._closing
                    ):
                        self._wakeup.clear()
                        await self._wakeup.wait()
        finally:
            self._wake_at = 1

    async def _wait_for_work(self) -> None:
        # asyncio.timeout, not wait_for: a cancellation arriving as the wait ends is not lost
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._denials.seconds_left(self._clock())):
                await self._wakeup.wait()
        self._wakeup.clear()

    async def _append_texts(self, entries: list[_Pending]) -> None:
        """Store ``entries`` (in order, the front of the queue). The database skips those an
        earlier attempt stored (migration 0015): a commit can happen and its answer be lost
        (the connection cut in a failover, a synchronous standby's wait cancelled), so a batch
        sent again may be stored already; that is stored, not an error."""
        texts = [entry.text or "" for entry in entries]
        trace = self.run_trace(max(self._stored_seq, _highest_seq(entries)))
        trace["batch_first"] = entries[0].position
        trace["stored_records"] = entries[-1].position
        skipped = await self._store.run(
            lambda conn: records.append_requests(conn, self._stream, texts, trace)
        )
        if skipped:
            self.already_stored += skipped
            _log.warning(
                "audit_batch_already_stored",
                stream=self._stream,
                records=skipped,
                of=len(entries),
                first_position=entries[0].position,
            )

    async def _beat(self) -> None:
        """The run's trace every ``heartbeat_seconds`` in which nothing else wrote it (a
        stored batch carries it): how verify tells a running instance from an ended one, and
        how far one that ends unclean had numbered."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._heartbeat_seconds)  # a period, not a synchronization
            traced = self._traced
            if traced is not None and loop.time() - traced < self._heartbeat_seconds:
                continue
            try:
                await self._store.run(lambda conn: records.run_seen(conn, self.run_trace()))
            except Exception as exc:  # the next beat tries again; the writer is not held up
                _log.warning("audit_run_heartbeat_failed", error=str(exc))
            else:
                self._traced = loop.time()

    async def _store_entries(self, entries: list[_Pending]) -> None:
        """Store ``entries`` (the front of the queue), isolating a record the database
        refuses; raises when the fault is not one record's."""
        try:
            await self._append_texts(entries)
        except Exception as exc:
            if not may_be_the_records_fault(exc):
                raise
            if len(entries) > 1:
                middle = len(entries) // 2
                await self._store_entries(entries[:middle])
                await self._store_entries(entries[middle:])
                return
            await self._store_placeholder(entries[0], exc)
            return
        self._stored(entries)

    async def _store_placeholder(self, entry: _Pending, refused: Exception) -> None:
        if entry.stands_in:  # a placeholder refused: not the record's fault
            raise refused
        original = entry.text
        entry.text = records.record_text(placeholder(entry.record, refused))
        entry.stands_in = True
        try:
            await self._append_texts([entry])
        except Exception:
            entry.text, entry.stands_in = original, False
            raise refused from None
        _log.error(
            "audit_record_unstorable",
            stream=self._stream,
            instance_seq=entry.record.get("instance_seq"),
            request_id=entry.record.get("request_id"),
            record_sha256=record_digest(entry.record),
            error=type(refused).__name__,
            detail=str(refused),
        )
        self._stored([entry])

    def _stored(self, entries: list[_Pending]) -> None:
        for entry in entries:
            self._pending.popleft()
            if entry.stands_in:
                self.unstorable += 1
        self.written += len(entries)
        self._stored_seq = max(self._stored_seq, _highest_seq(entries))
        self._last_stored = self._traced = asyncio.get_running_loop().time()
        if self._stall_reported:
            self._stall_reported = False
            _log.info("audit_writer_recovered", stream=self._stream, pending=len(self._pending))
        self._waiting_since = self._clock() if self._pending else None
        self._record_drops_if_room()
        if not self._pending:
            self._idle.set()

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        error = str(exc) or type(exc).__name__
        _log.warning("audit_write_retry", error=error, pending=len(self._pending))
        if self.stalled and not self._stall_reported:
            self._stall_reported = True
            _log.error(
                "audit_writer_stalled",
                stream=self._stream,
                pending=len(self._pending),
                oldest_pending_seconds=round(self.oldest_pending_seconds, 3),
                dropped=self.dropped,
                error=error,
            )


def _highest_seq(entries: list[_Pending]) -> int:
    """The highest number the entries store or declare dropped (0 when none)."""
    highest = 0
    for entry in entries:
        seq = entry.record.get("instance_seq")
        if isinstance(seq, int):
            highest = max(highest, seq)
        for span in entry.record.get("dropped") or ():
            if isinstance(span, list) and span and isinstance(span[-1], int):
                highest = max(highest, span[-1])
    return highest


class Checkpointer:
    """Signs the moved chain heads every ``interval`` seconds, and once more on close."""

    def __init__(self, store: Store, key: bytes, writer: str, interval: float) -> None:
        self._store = store
        self._key = key
        self._writer = writer
        self._rounds = Periodic(
            "audit-checkpointer",
            interval,
            self.checkpoint,
            (StoreUnavailable, asyncpg.PostgresError),
            "audit_checkpoint_failed",
        )

    def start(self) -> None:
        self._rounds.start()

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
        await self._rounds.close()
