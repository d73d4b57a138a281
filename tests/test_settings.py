"""Settings refuse an approver that is not one person with a token of its own."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from proxy.gate.identity import token_digest
from proxy.settings import Settings, load_settings

AGENT = {"id": "agent-a", "tenant": "t1", "token_sha256": token_digest("agent-token")}


@pytest.mark.parametrize(
    "approvers",
    [
        [{"name": "olga", "token_sha256": token_digest("agent-token")}],
        [
            {"name": "olga", "token_sha256": token_digest("one")},
            {"name": "olga", "token_sha256": token_digest("two")},
        ],
        [
            {"name": "olga", "token_sha256": token_digest("one")},
            {"name": "otto", "token_sha256": token_digest("one")},
        ],
        [{"name": "olga", "token_sha256": token_digest("admin-token")}],
    ],
    ids=["an agent's token", "a name twice", "a token twice", "the admin's token"],
)
def test_an_approver_needs_its_own_name_and_token(approvers: list[dict[str, Any]]) -> None:
    """An approver sharing a token with an agent, the admin or another approver, or a name
    with another approver, stops opgate from starting."""
    with pytest.raises(ValidationError, match="approvers"):
        Settings(
            agents=[AGENT], approvers=approvers, admin_token_sha256=token_digest("admin-token")
        )


def test_distinct_approvers_are_accepted() -> None:
    """Two approvers, each with its own name and token, and an agent owned by one of them."""
    settings = Settings(
        agents=[{**AGENT, "owner": "olga"}],
        approvers=[
            {"name": "olga", "token_sha256": token_digest("one")},
            {"name": "otto", "token_sha256": token_digest("two")},
        ],
    )
    assert [a.name for a in settings.approvers] == ["olga", "otto"]
    assert settings.agents[0].owner == "olga"


@pytest.mark.parametrize("spelling", ["null", "NULL", ""])
def test_forward_listen_null_in_the_environment_disables_forward_mode(
    monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    """`OPGATE_FORWARD_LISTEN=null`, as the settings reference spells it, disables the forward
    listener rather than being refused as an address."""
    monkeypatch.setenv("OPGATE_FORWARD_LISTEN", spelling)
    assert load_settings().forward_listen is None
