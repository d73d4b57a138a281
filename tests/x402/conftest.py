"""The x402 tests run only where the optional extra is installed (opgate[x402], in [test])."""

from __future__ import annotations

import pytest

pytest.importorskip("x402")
pytest.importorskip("eth_account")
