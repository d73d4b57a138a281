"""A failing audit sink (stdout gone, a span that raises) is counted and fails readiness, and
never costs the stored record nor raises into the request."""

from __future__ import annotations

import errno
import io
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from typing import Any

import pytest
import structlog

from proxy.observe import audit, logs, sinks
from proxy.observe.audit import AuditRecord, emit
from proxy.observe.sinks import LOG, SPAN, GuardedStream, SinkHealth


class BrokenStdout(io.StringIO):
    """stdout whose writes and flushes fail like a pipe whose reader is gone, until healed."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = True

    def flush(self) -> None:
        if self.broken:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")


@pytest.fixture
def health(monkeypatch: pytest.MonkeyPatch) -> SinkHealth:
    fresh = SinkHealth()
    monkeypatch.setattr(sinks, "SINKS", fresh)
    monkeypatch.setattr(audit, "SINKS", fresh)
    return fresh


@contextmanager
def logging_to(stream: io.StringIO) -> Iterator[None]:
    saved = structlog.get_config()
    try:
        with redirect_stdout(stream):
            logs.configure_logging("info")
            yield
    finally:
        structlog.configure(**saved)


def test_a_failing_line_is_counted_once_and_readiness_names_the_sink(health: SinkHealth) -> None:
    """Each line that cannot be written counts one failure of sink ``log``; the problem names
    it until a line is written again."""
    out = BrokenStdout()
    stream = GuardedStream(out)
    for _ in range(2):
        print("a line", file=stream, flush=True)
    assert health.failures[LOG] == 2
    problem = health.problem()
    assert problem is not None
    assert 'audit sink "log" (stdout' in problem
    assert "BrokenPipeError" in problem
    out.broken = False
    print("a line", file=stream, flush=True)
    assert health.problem() is None
    assert health.failures[LOG] == 2


def test_emit_queues_the_record_whatever_stdout_and_the_span_do(health: SinkHealth) -> None:
    """With stdout broken and the span sink raising, emit neither raises nor loses the record:
    it was queued first."""
    queued: list[dict[str, Any]] = []

    class Observer:
        def admit(self, fields: dict[str, Any]) -> None:
            fields["instance_seq"] = 1

        def observe(self, fields: dict[str, Any], stored_json: str | None) -> None:
            queued.append(fields)  # the queue, then the span, which fails:
            health.failed(SPAN, RuntimeError("exporter down"))

        def queue(self, fields: dict[str, Any]) -> None:
            queued.append(fields)

    token = audit.REQUEST_OBSERVER.set(Observer())
    try:
        with logging_to(BrokenStdout()):
            emit(AuditRecord(method="GET", path="/fault/v1/refunds"))
            audit.emit_undelivered(AuditRecord(), audit.Undelivered.WRITE_TIMEOUT)
    finally:
        audit.REQUEST_OBSERVER.reset(token)
    assert [r.get("record_type") for r in queued] == [None, "answer_undelivered"]
    assert health.failures[LOG] == 2
    assert health.failures[SPAN] == 1
