"""The container's HEALTHCHECK: exit 0 if opgate's ops listener answers ``GET /healthz`` with 200.

The slim base image has no curl, so this uses the standard library only. It reads the same
``OPGATE_OPS_LISTEN`` as opgate (a wildcard bind address is reached on loopback) and never
goes through a proxy, whatever ``HTTP_PROXY`` says: the check is about this container only.

Usage: ``python healthcheck.py [PATH]`` (default ``/healthz``; ``/readyz`` for readiness).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_OPS_LISTEN = "127.0.0.1:8081"
TIMEOUT_SECONDS = 3.0
# Bind addresses that mean "every interface", and the loopback address that reaches them.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1", "": "127.0.0.1"}  # noqa: S104


def health_url(ops_listen: str, path: str) -> str:
    """The URL to probe for an ops listener bound to ``ops_listen`` (HOST:PORT)."""
    host, _, port = ops_listen.rpartition(":")
    host = _WILDCARDS.get(host, host).strip("[]")
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{path}"


def check(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=TIMEOUT_SECONDS) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else "/healthz"
    url = health_url(os.environ.get("OPGATE_OPS_LISTEN", DEFAULT_OPS_LISTEN), path)
    healthy = check(url)
    if not healthy:
        print(f"unhealthy: {url}", file=sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
