"""docs/mcp.md as an agent developer follows it: its raw JSON-RPC example (the one python
block) runs as written against opgate and localstripe, executing an approved refund as a task
and polling it to the end; and what it says of the protocol headers holds."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil

import pytest

from tests.mcp.conftest import approved_refund
from tests.support.localstripe_server import list_refunds
from tests.support.mcp_wire import TASKS, modern_request, post
from tests.support.opgate import AGENT_TOKEN, Opgate
from tests.support.paths import REPO

PAGE = REPO / "docs" / "mcp.md"


def snippet() -> str:
    [code] = re.findall(r"^```python\n(.*?)^```", PAGE.read_text("utf-8"), re.S | re.M)
    return code


def test_the_page_names_the_protocol_headers() -> None:
    """The three headers a raw 2026-07-28 client must send are named on the page."""
    text = PAGE.read_text("utf-8")
    for header in ("MCP-Protocol-Version", "Mcp-Method", "Mcp-Name"):
        assert f"`{header}" in text, header


async def test_the_raw_task_example_runs_as_written(
    stripe_gate: Opgate, localstripe_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example's execute_operation answers a task; polled with tasks/get it completes
    with next_action proceed, and the refund was made once."""
    op = await approved_refund(stripe_gate, localstripe_url)
    monkeypatch.setenv("OPGATE_URL", stripe_gate.agent_url)
    monkeypatch.setenv("OPGATE_AGENT_TOKEN", AGENT_TOKEN)
    monkeypatch.setenv("OPERATION_ID", op["operation_id"])
    printed: list[tuple[object, ...]] = []

    def run() -> None:  # blocking, as a user's script: off the loop opgate runs on
        # its print, caught (opgate's log lines share this process's stdout)
        defined = {"__name__": "mcp_md", "print": lambda *said: printed.append(said)}
        exec(compile(snippet(), str(PAGE), "exec"), defined)  # noqa: S102

    await asyncio.wait_for(asyncio.to_thread(run), 60)
    assert printed == [("completed", "proceed")]
    [refund] = await list_refunds(localstripe_url, charge=op["params"]["charge"])
    assert refund["metadata"]["operation_id"] == op["operation_id"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_the_curl_example_reads_a_task(stripe_gate: Opgate, localstripe_url: str) -> None:
    """The page's curl block, pointed at this opgate, answers tasks/get of an operation."""
    op = await approved_refund(stripe_gate, localstripe_url)
    [block] = re.findall(r"^```sh\n(.*?)^```", PAGE.read_text("utf-8"), re.S | re.M)
    command = block.replace("http://127.0.0.1:8080", stripe_gate.agent_url)
    env = {"PATH": os.environ["PATH"], "OPGATE_AGENT_TOKEN": AGENT_TOKEN}
    child = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        command,
        env={**env, "TASK_ID": op["operation_id"]},
        stdout=asyncio.subprocess.PIPE,
    )
    output, _ = await asyncio.wait_for(child.communicate(), 60)
    answer = json.loads(output)
    assert (answer["result"]["taskId"], answer["result"]["status"]) == (
        op["operation_id"],
        "working",
    )


async def test_without_the_version_header_a_request_is_of_the_handshake_era(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """As the page warns: without MCP-Protocol-Version, server/discover is -32601 and a
    tools/call that declares the tasks extension in _meta runs inline (no task)."""
    body, headers = modern_request("server/discover")
    del headers["MCP-Protocol-Version"]
    _, _, discovered = await post(
        stripe_gate.http, stripe_gate.agent_url, AGENT_TOKEN, body, headers
    )
    op = await approved_refund(stripe_gate, localstripe_url)
    arguments = {"name": "execute_operation", "arguments": {"operation_id": op["operation_id"]}}
    body, headers = modern_request("tools/call", arguments, {"extensions": {TASKS: {}}})
    del headers["MCP-Protocol-Version"]
    _, _, executed = await post(stripe_gate.http, stripe_gate.agent_url, AGENT_TOKEN, body, headers)
    assert discovered["error"]["code"] == -32601
    assert "resultType" not in executed["result"] or executed["result"]["resultType"] != "task"
    assert executed["result"]["structuredContent"]["next_action"] == "proceed"
