"""Which of this process's audit sinks are failing: the log lines on stdout (``log``) and the
request's span and counters (``span``).

A sink that fails must never cost an audit record, an answer or the process: the record is
queued for the PostgreSQL audit log before any sink sees it (audit.emit), every sink's write is
guarded here, and a failure is counted (``opgate_audit_sink_failures_total{sink}``) and fails
readiness until the sink writes again (observer.audit_writer_problem). A dead log shipper
(stdout a pipe whose reader has gone: EPIPE) and a full disk (ENOSPC) are the cases seen.

Process-wide, as stdout is: every opgate in a process shares one ``SINKS``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any

LOG = "log"  # the JSON log lines (stdout)
SPAN = "span"  # the request's server span and its counters
SINK_NAMES = (LOG, SPAN)
_DESCRIBED = {LOG: "stdout: the log lines", SPAN: "the request spans and counters"}


@dataclass
class _Failing:
    since: datetime
    error: str


@dataclass
class SinkHealth:
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SINK_NAMES, 0))
    _failing: dict[str, _Failing] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def failed(self, sink: str, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self.failures[sink] = self.failures.get(sink, 0) + 1
            first = sink not in self._failing
            if first:
                self._failing[sink] = _Failing(datetime.now(UTC), error)
        if first:  # once per outage, where an operator still looks: the sink itself cannot say
            described = _DESCRIBED.get(sink, sink)
            _to_stderr(f"opgate: audit sink {sink!r} ({described}) failing: {error}")

    def wrote(self, sink: str) -> None:
        if sink in self._failing:
            with self._lock:
                gone = self._failing.pop(sink, None)
            if gone is not None:
                _to_stderr(f"opgate: audit sink {sink!r} writes again")

    def problem(self) -> str | None:
        """Why readiness fails because of a sink, or None."""
        with self._lock:
            failing = sorted(self._failing.items())
        if not failing:
            return None
        return "; ".join(
            f'audit sink "{sink}" ({_DESCRIBED.get(sink, sink)}) failing since'
            f" {state.since.isoformat(timespec='seconds')}: {state.error}"
            for sink, state in failing
        )


SINKS = SinkHealth()


def _to_stderr(line: str) -> None:
    # stderr gone as well: the metric and readiness still say it
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


class GuardedStream:
    """A text stream (stdout) whose write errors are counted against ``sink`` instead of
    raised: structlog's ``PrintLogger`` writes a line and flushes it, and either may fail."""

    def __init__(self, stream: IO[str], sink: str = LOG) -> None:
        self._stream = stream
        self._sink = sink
        self._line_failed = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError) as exc:  # ValueError: the stream was closed
            if not self._line_failed:  # one failure per line, however many writes it took
                SINKS.failed(self._sink, exc)
            self._line_failed = True
            return 0

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError) as exc:
            if not self._line_failed:
                SINKS.failed(self._sink, exc)
        else:
            if not self._line_failed:
                SINKS.wrote(self._sink)
        self._line_failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
