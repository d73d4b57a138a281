"""Forward-mode settings for tests whose providers listen on loopback."""

from __future__ import annotations

LOOPBACK_ALLOWED = "forward_proxy:\n  allow_destinations: [loopback]\n"
