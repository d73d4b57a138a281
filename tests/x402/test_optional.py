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
