"""The workers of one ``opgate serve --workers N`` share their counters through files.

Each worker counts in its own memory, and a scrape of ``/metrics`` reaches whichever worker the
kernel hands the connection to: alone, each would report its own share, and Prometheus would
read the jumps between workers' values as resets. So every worker writes a snapshot of its
counters into the supervisor's metrics directory (when they changed, at most once a second,
and whenever it answers a scrape), and a scrape sums the latest snapshot of every worker,
including workers that died and were replaced, so that no counter ever goes backwards.

Files, not shared memory: one small JSON file per worker, replaced atomically (write, then
rename), is all a handful of series needs, and a reader never sees half of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import structlog

from proxy.observe.metrics import Counter, Histogram

_log = structlog.get_logger("opgate.metrics")
WRITE_EVERY_SECONDS = 1.0
Series = Counter | Histogram


class SharedCounts:
    def __init__(self, directory: Path, worker: str, series: Sequence[Series]) -> None:
        self._directory = directory
        self._file = directory / (worker.replace("/", "_") + ".json")
        self._series = tuple(series)
        self._written: str | None = None

    def write(self) -> None:
        """This worker's snapshot, if it changed since the last one written."""
        text = json.dumps({s.name: s.snapshot() for s in self._series}, allow_nan=False)
        if text == self._written:
            return
        partial = self._file.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text)
        partial.replace(self._file)
        self._written = text

    def merged(self) -> list[Series]:
        """Every worker's series summed, this worker's as of now."""
        self.write()
        totals = [s.empty_copy() for s in self._series]
        for path in sorted(self._directory.glob("*.json")):
            try:
                snapshot = json.loads(path.read_text())
            except (OSError, ValueError):  # a worker's file being replaced: its next is whole
                continue
            for total in totals:
                total.add(snapshot.get(total.name, []))
        return totals

    async def keep_written(self) -> None:
        """Write the snapshot every second while the worker runs (cancelled at close)."""
        while True:
            await asyncio.sleep(WRITE_EVERY_SECONDS)  # the sharing period, not a synchronisation
            try:
                self.write()
            except OSError as exc:
                _log.warning("metrics_snapshot_failed", error=str(exc))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.write()
