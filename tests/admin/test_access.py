"""Sign-in and answers of the operations listener (proxy/admin/access.py)."""

from __future__ import annotations

import pytest

from proxy.admin.access import admin_token_matches
from proxy.gate.identity import token_digest


@pytest.mark.parametrize(
    ("presented", "expected_digest", "matches"),
    [
        pytest.param("admin-secret", token_digest("admin-secret"), True, id="right token"),
        pytest.param("wrong", token_digest("admin-secret"), False, id="wrong token"),
        pytest.param(None, token_digest("admin-secret"), False, id="no token presented"),
        pytest.param("admin-secret", None, False, id="no admin configured"),
    ],
)
def test_admin_token_matches(
    presented: str | None, expected_digest: str | None, matches: bool
) -> None:
    """The admin token matches only its configured digest; nothing matches when none is set."""
    assert admin_token_matches(presented, expected_digest) is matches
