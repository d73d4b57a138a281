"""The x402 SDK stays optional: serving opgate imports none of it until a rule pays."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import REPO


def test_serving_opgate_imports_neither_the_sdk_nor_web3() -> None:
    """The process's modules and the request path load without x402, web3 or eth-account."""
    probe = (
        "import sys, proxy.server, proxy.gate.pipeline, proxy.workers\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'x402', 'web3', 'eth_account', 'proxy.x402'} or m.startswith('proxy.x402'))\n"
        "print(','.join(loaded))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert ran.stdout.strip() == ""


def test_paying_leaves_the_recursion_limit_and_deep_json_is_still_an_error() -> None:
    """py_ecc (under eth-account) raises the recursion limit to 100,000 on import; after the
    gate's signing modules and the SDK's EVM code are loaded the limit is the interpreter's own,
    so JSON nested 200,000 deep is a RecursionError (a refusal), not a crashed process."""
    probe = (
        "import json, sys\n"
        "before = sys.getrecursionlimit()\n"
        "import proxy.x402.authorization\n"
        "from x402.mechanisms.evm.exact import facilitator\n"
        "assert sys.getrecursionlimit() == before, sys.getrecursionlimit()\n"
        "try:\n"
        "    json.loads('[' * 200_000 + ']' * 200_000)\n"
        "except RecursionError:\n"
        "    print('refused')\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert (ran.returncode, ran.stdout.strip()) == (0, "refused"), ran.stderr[-2000:]
