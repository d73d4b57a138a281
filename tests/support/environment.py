"""The environment a test gives a process it starts: the test run's own, without its OPGATE_*
settings (each process gets the ones its test names), except ``OPGATE_EVENT_LOOP``: a suite run
on uvloop (``OPGATE_EVENT_LOOP=uvloop ./dev test``) runs the opgate processes it starts on it
too, unless a test names a loop itself."""

from __future__ import annotations

import os

KEPT = ("OPGATE_EVENT_LOOP",)


def inherited() -> dict[str, str]:
    """``os.environ`` without the OPGATE_* settings, ``KEPT`` kept."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OPGATE_") or k in KEPT}
