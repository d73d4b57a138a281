"""One request's audit record leaves exactly once (proxy/observe/record_life.py), whichever of
its ways out come, in whatever order: emitted, handed to the outcome's statement, replaced, or
the block ending by a return, an exception or a cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from proxy.observe.audit import REQUEST_OBSERVER, AuditRecord
from proxy.observe.record_life import RecordLife


class _Writer:
    """The observer's side of a record (an audit writer is running): what it was given."""

    def __init__(self) -> None:
        self.queued: list[dict[str, Any]] = []
        self.stored: list[dict[str, Any]] = []

    def admit(self, fields: dict[str, Any]) -> None:
        return None

    def observe(self, fields: dict[str, Any], stored_json: str | None) -> None:
        self.queued.append(fields)

    def queue(self, fields: dict[str, Any]) -> None:
        self.queued.append(fields)

    def sealing(self, fields: dict[str, Any]) -> bool:
        return True

    def observe_stored(self, fields: dict[str, Any]) -> None:
        self.stored.append(fields)


@contextmanager
def writing() -> Iterator[_Writer]:
    writer = _Writer()
    token = REQUEST_OBSERVER.set(writer)
    try:
        yield writer
    finally:
        REQUEST_OBSERVER.reset(token)


def test_a_record_leaves_once_completed_by_the_first_way_out() -> None:
    """Two calls to leave emit one line, completed by the first; the block's end adds none."""
    with capture_logs() as lines, RecordLife(AuditRecord(request_id="r1")) as life:
        assert life.leave(lambda r: setattr(r, "response_status", 200))
        assert not life.leave(lambda r: setattr(r, "response_status", 500))
    assert [(e["request_id"], e["response_status"]) for e in lines] == [("r1", 200)]
    assert life.gone


def test_the_block_ending_sends_what_was_known_by_then() -> None:
    """Nothing sent it: the block's end does, completed by ``last`` (even on an exception)."""
    known = {"status": 0}

    def handle(record: AuditRecord) -> None:
        with RecordLife(record, last=lambda r: setattr(r, "response_status", known["status"])):
            known["status"] = 503
            raise RuntimeError("the handler failed")

    with capture_logs() as lines, pytest.raises(RuntimeError):
        handle(AuditRecord(request_id="r2"))
    assert [(e["request_id"], e["response_status"]) for e in lines] == [("r2", 503)]


def test_a_replaced_record_never_leaves() -> None:
    """A record another stands for (an MCP tool's own) is not emitted at the block's end."""
    with capture_logs() as lines, RecordLife(AuditRecord(request_id="r3")) as life:
        life.replaced()
        assert not life.leave()
    assert lines == []


def test_a_record_handed_to_the_statement_is_the_statements() -> None:
    """Handed over, the record is the statement's: stored (no line queued for the writer) or
    not stored (queued after all), and neither the handler nor the block sends it again."""
    with writing() as writer, capture_logs() as lines:
        with RecordLife(AuditRecord(request_id="r4")) as life:
            sealed = life.hand_over(lambda r: setattr(r, "response_status", 201))
            assert sealed is not None
            assert life.hand_over() is None
            assert not life.leave()
            life.stored(sealed)
        assert [f["request_id"] for f in writer.stored] == ["r4"]
        assert writer.queued == []
        with RecordLife(AuditRecord(request_id="r5")) as life:
            assert life.hand_over() is not None
            life.not_stored(lambda r: setattr(r, "response_status", 202))
    assert [f["request_id"] for f in writer.queued] == ["r5"]
    assert [(e["request_id"], e["response_status"]) for e in lines] == [
        ("r4", 201),
        ("r5", 202),
    ]


def test_without_an_audit_writer_the_record_cannot_be_handed_over_and_stays() -> None:
    """No writer runs (no audit log kept): hand_over gives None and the record still leaves,
    once, when the block ends."""
    with capture_logs() as lines, RecordLife(AuditRecord(request_id="r6")) as life:
        assert life.hand_over() is None
        assert not life.gone
    assert [e["request_id"] for e in lines] == ["r6"]


@pytest.mark.parametrize("task_first", [False, True], ids=["handler-first", "task-first"])
async def test_a_cancelled_handler_and_its_shielded_task_send_one_record(task_first: bool) -> None:
    """The handler is cancelled (the agent hung up) while a shielded task still records the
    outcome: the handler's end sends the record and the task then finds it gone; or the task
    hands it over first and the handler's end sends nothing."""
    with writing() as writer, capture_logs():
        life = RecordLife(AuditRecord(request_id="r7"))
        waiting, go, done = asyncio.Event(), asyncio.Event(), asyncio.Event()
        handed: list[object] = []

        async def record_outcome() -> None:
            if not task_first:
                await go.wait()
            handed.append(life.hand_over())
            done.set()

        async def handler() -> None:
            with life:
                task = asyncio.ensure_future(record_outcome())
                if task_first:
                    await done.wait()
                waiting.set()
                await asyncio.shield(task)

        running = asyncio.ensure_future(handler())
        await waiting.wait()
        if task_first:
            await running
        else:
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            go.set()
        await done.wait()
        assert len(writer.queued) + sum(h is not None for h in handed) == 1
        assert (handed[0] is not None) is task_first


@given(st.lists(st.sampled_from(["leave", "hand_over", "replaced", "not"]), max_size=6))
def test_any_order_of_ways_out_sends_at_most_one_record(ways: list[str]) -> None:
    """Whatever sequence of ways out a request takes, at most one record leaves by emit or
    hand_over, and exactly one unless it was replaced first."""
    with writing() as writer, capture_logs():
        sealed = 0
        with RecordLife(AuditRecord()) as life:
            for way in ways:
                if way == "leave":
                    life.leave()
                elif way == "hand_over":
                    sealed += life.hand_over() is not None
                elif way == "replaced" and not life.gone:
                    life.replaced()
        sent = len(writer.queued) + sealed
        replaced_first = next((w for w in ways if w in ("leave", "hand_over", "replaced")), None)
        assert sent == (0 if replaced_first == "replaced" else 1)
