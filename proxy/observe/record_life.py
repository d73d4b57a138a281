"""The life of one request's audit record, owned by one object: exactly one record per request,
whichever way the request ends.

A record leaves once, by the first of its ways out:

    leave       emitted to the sinks (audit.emit): before the answer is written, or on any other
                way out (a refusal, an exception, an agent that hung up and cancelled the handler)
    hand_over   sealed for the statement that records a claimed operation's outcome, which
                stores it in the operation's stream (migration 0022); then ``stored`` (the
                statement committed it) or ``not_stored`` (it did not: emitted after all)

    replaced    another record stands for the request (an MCP tool's own, or the pipeline's of
                a request composed for it): this one never leaves

Every later way out finds it gone and does nothing. Used as a context manager, the record leaves
when the block ends if nothing sent it before, completed by ``last`` (what was known by then).
The handler and a shielded task that outlives it (the forward stage) share one ``RecordLife``:
its methods are synchronous, so between the check that the record is still here and its
leaving nothing else runs (one event loop).

``complete`` fills the record in from what is known at that moment (the pipeline's outcome); it
runs only for the way out that sends the record, never on a record that has left.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from proxy.observe.audit import AuditRecord, Sealed, emit, emit_stored, seal

Complete = Callable[[AuditRecord], object]


def _as_is(_record: AuditRecord) -> None:
    return None


class RecordLife:
    """One request's audit record, from intake until it has left exactly once."""

    __slots__ = ("_gone", "_last", "record")

    def __init__(self, record: AuditRecord, last: Complete = _as_is) -> None:
        self.record = record
        self._last = last  # how the record is completed if it leaves when the block ends
        self._gone = False

    @property
    def gone(self) -> bool:
        """Whether the record has left (emitted, or handed to the outcome's statement)."""
        return self._gone

    def leave(self, complete: Complete = _as_is) -> bool:
        """Emit the record, ``complete``-d first, unless it has left; whether this call sent it."""
        if self._gone:
            return False
        self._gone = True
        complete(self.record)
        emit(self.record)
        return True

    def hand_over(self, complete: Complete = _as_is) -> Sealed | None:
        """The record, ``complete``-d and sealed for the statement that records the operation's
        outcome, which from now on owns it (then ``stored`` or ``not_stored``); None when it
        has left already, or cannot go that way (no audit log kept; JSON cannot hold it): it
        is still here then, to ``leave``."""
        if self._gone:
            return None
        complete(self.record)
        sealed = seal(self.record)
        if sealed is not None:
            self._gone = True
        return sealed

    def stored(self, sealed: Sealed) -> None:
        """The statement committed the record: its span, counters and log line."""
        emit_stored(sealed)

    def not_stored(self, complete: Complete = _as_is) -> None:
        """The statement did not store the record handed to it (it failed, or found the row
        changed): emitted to the batch writer instead, ``complete``-d anew."""
        complete(self.record)
        emit(self.record)

    def replaced(self) -> None:
        """Another record stands for this request (one an MCP tool writes of its call, or the
        pipeline's of a request composed for it): this one never leaves."""
        self._gone = True

    def __enter__(self) -> RecordLife:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.leave(self._last)  # every way out not taken yet: still exactly one record
