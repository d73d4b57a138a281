"""The log lines (proxy/observe/logs.py): an audit line written from the record's stored JSON
is the line structlog's processors would have written for the record."""

from __future__ import annotations

import datetime
import io
import json
import logging
import math
import random
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, redirect_stdout
from dataclasses import fields
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from opentelemetry.sdk.trace import TracerProvider

from proxy.observe import audit, logs
from proxy.observe.audit import AuditRecord, emit
from proxy.observe.auditlog.records import record_text
from proxy.observe.auditlog.redact import Redactor, redact_record, set_log_redactor

SECRET = "sk_test_do_not_log_me"


@contextmanager
def opgate_logging(level: str = "info") -> Iterator[io.StringIO]:
    """``configure_logging`` writing to a buffer; the test's configuration back afterwards."""
    saved = structlog.get_config()
    buffer = io.StringIO()
    try:
        with redirect_stdout(buffer):
            logs.configure_logging(level)
            yield buffer
    finally:
        structlog.configure(**saved)


def records() -> list[AuditRecord]:
    plain = AuditRecord(method="POST", path="/stripe/v1/refunds", policy_version="v1")
    odd = AuditRecord(method="GET", path="/x%00/\u212a\U0001f642", source="127.0.0.1")
    odd.reason, odd.decision = "path_not_canonical", "deny"
    evidence = AuditRecord(method="POST", path="/stripe/v1/refunds")
    evidence.precondition = {"lookup": "charge", "read": {"status": "succeeded", "n": [1, 2.5]}}
    evidence.operation_id, evidence.attempt = "op_1", 1
    secret = AuditRecord(method="POST", path=f"/stripe/v1/{SECRET}")
    secret.destination = f"api.stripe.com:443 {SECRET}"
    return [plain, odd, evidence, secret]


def structlog_line(fields_: dict[str, Any]) -> dict[str, Any]:
    """The line structlog's own chain renders for these fields."""
    event: Any = dict(fields_)
    for processor in logs.log_processors():
        event = processor(None, "info", event)
    return dict(json.loads(event))


@pytest.mark.parametrize("traced", [False, True], ids=["no span", "in a span"])
def test_the_audit_line_is_the_line_structlog_would_write(traced: bool) -> None:
    set_log_redactor(Redactor(secrets=[SECRET]))
    tracer = TracerProvider().get_tracer("test")
    expected_lines = []
    try:
        with opgate_logging() as out:
            for made in records():
                with tracer.start_as_current_span("request") if traced else nullcontext():
                    emit(made)
                    expected_lines.append(structlog_line(redact_record(made.fields())))
            lines = out.getvalue().splitlines()
        assert len(lines) == len(records())
        for line, expected in zip(lines, expected_lines, strict=True):
            written = json.loads(line)
            # two renderings, a moment apart: only the times they were made at differ
            for changing in ("logged_at", "latency_ms"):
                assert changing in written
                written.pop(changing), expected.pop(changing)
            assert ("span_id" in written) is traced
            assert written == expected
            assert SECRET not in line
            assert written["level"] == "info"
            assert written["event"] == "request"
    finally:
        set_log_redactor(Redactor())


def test_the_audit_line_and_the_stored_record_are_one_json() -> None:
    """What the observer hands to the audit log is the log line's own JSON, made once."""
    handed: list[tuple[dict[str, Any], str | None]] = []

    class Observer:
        def admit(self, fields_: dict[str, Any]) -> None:
            fields_["instance_seq"] = 7

        def observe(self, fields_: dict[str, Any], stored_json: str | None) -> None:
            handed.append((fields_, stored_json))

    token = audit.REQUEST_OBSERVER.set(Observer())
    try:
        with opgate_logging() as out:
            emit(records()[0])
            line = out.getvalue()
    finally:
        audit.REQUEST_OBSERVER.reset(token)
    [(fields_, stored)] = handed
    assert stored == record_text(fields_)
    assert line.startswith(stored[:-1] + ",")  # the record's JSON, then the line's own fields
    assert json.loads(line)["instance_seq"] == 7


def test_a_record_json_cannot_hold_is_still_logged_and_stored_as_a_placeholder() -> None:
    handed: list[str | None] = []

    class Observer:
        def admit(self, fields_: dict[str, Any]) -> None:
            pass

        def observe(self, fields_: dict[str, Any], stored_json: str | None) -> None:
            handed.append(stored_json)

    made = records()[2]
    made.precondition = {"read": {"amount": math.nan}}
    token = audit.REQUEST_OBSERVER.set(Observer())
    try:
        with opgate_logging() as out:
            emit(made)
            lines = out.getvalue().splitlines()
    finally:
        audit.REQUEST_OBSERVER.reset(token)
    assert handed == [None]  # the writer makes its placeholder (test_auditlog_writer.py)
    assert len(lines) == 1
    assert '"request_id": "' in lines[0]  # structlog's JSONRenderer (not the stored JSON's)


@pytest.mark.parametrize(("level", "lines"), [("debug", 1), ("info", 1), ("warning", 0)])
def test_the_level_filters_the_audit_line_as_structlog_would(level: str, lines: int) -> None:
    with opgate_logging(level) as out:
        emit(records()[0])
        assert len(out.getvalue().splitlines()) == lines


def test_no_record_field_is_one_a_line_adds() -> None:
    """The line's fields are appended to the record's JSON: a record field of the same name
    would be written twice, or keep a value the processors overwrite."""
    assert {f.name for f in fields(AuditRecord)}.isdisjoint({"level", "logged_at", "span_id"})


def test_another_configuration_renders_through_structlog() -> None:
    """A configuration of anyone else's (here: opgate's processors, another destination) is
    not opgate's own: its lines go through structlog."""
    saved = structlog.get_config()
    captured: list[str] = []

    class ListLogger:
        def info(self, message: str) -> None:
            captured.append(message)

        msg = info

    try:
        with opgate_logging() as out:
            structlog.configure(
                processors=logs.log_processors(),
                logger_factory=lambda *args: ListLogger(),
                wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
            )
            emit(records()[0])
            assert out.getvalue() == ""
        assert len(captured) == 1
        assert json.loads(captured[0])["event"] == "request"
    finally:
        structlog.configure(**saved)


class _FrozenDatetime(datetime.datetime):
    """``datetime`` whose ``now`` is one instant: two renderings of a line get one stamp."""

    instant = datetime.datetime(2026, 12, 6, 21, 5, 7, 123456, tzinfo=datetime.UTC)

    @classmethod
    def now(cls, tz: datetime.tzinfo | None = None) -> _FrozenDatetime:
        return cls.fromtimestamp(cls.instant.timestamp(), tz)


def _varied_fields(rng: random.Random) -> dict[str, Any]:
    """A record's fields, or a record of another kind, or fields naming a line's own fields."""
    made = AuditRecord(method=rng.choice(["GET", "POST", None]), path='/v1/\u00e9"x\\')
    made.reason = rng.choice([None, "path_not_canonical", 'quote " and \u2028'])
    made.attempt = rng.choice([None, 0, 3])
    made.precondition = rng.choice([None, {"read": {"n": [1, 2.5, None], "s": "\U0001f642"}}])
    fields_ = made.fields()
    shape = rng.randrange(6)
    if shape == 1:
        fields_ = {"record_type": "answer_undelivered", "event": "answer_undelivered"}
    elif shape == 2:
        fields_ = {}
    for name in ("level", "logged_at", "trace_id", "span_id", "run_id"):
        if rng.random() < 0.15:
            fields_[name] = rng.choice([None, "given", 7])
    return fields_


def test_the_audit_line_is_byte_for_byte_what_the_processors_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The audit line written directly (logs._own_fields) is, on 2,000 varied records, with
    and without a span and a writer run, the very bytes the processor chain's fields appended
    to the record's JSON gave (logs.with_line_fields, the path before), clock held still."""
    monkeypatch.setattr(logs, "datetime", _FrozenDatetime)
    monkeypatch.setattr(
        structlog.processors,
        "datetime",
        SimpleNamespace(datetime=_FrozenDatetime, timezone=datetime.timezone),
    )
    rng = random.Random(42)
    tracer = TracerProvider().get_tracer("test")
    try:
        with opgate_logging() as out:
            write = logs.prerendered_writer(structlog.get_config())
            assert write is not None
            installed = logs._installed
            assert installed is not None
            expected = []
            for index in range(2000):
                logs.bind_run(rng.choice([None, "run-1", 'run "2" \u00e9']))
                fields_ = _varied_fields(rng)
                text = "{}" if not fields_ else record_text(fields_)
                span = tracer.start_as_current_span("r") if index % 3 else nullcontext()
                with span:
                    write(text, fields_)
                    expected.append(logs.with_line_fields(text, fields_, installed.line_fields))
            written = out.getvalue()
    finally:
        logs.bind_run(None)
    assert written.encode() == ("\n".join(expected) + "\n").encode()
    assert '"logged_at":"2026-12-06T21:05:07.123456Z"' in written


def test_opgate_writes_a_line_as_structlog_would_print_it() -> None:
    """LineLogger (one write of line and newline, then a flush) puts on the stream the bytes
    structlog's PrintLogger (print: the line, a newline, a flush) does."""
    ours, theirs = io.StringIO(), io.StringIO()
    for message in ['{"event":"x"}', "", "\u00e9 \U0001f642", "a\nb"]:
        logs.LineLogger(ours).info(message)
        structlog.PrintLogger(theirs).info(message)
    assert ours.getvalue() == theirs.getvalue()
