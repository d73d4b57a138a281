"""The reference pages that restate code (proxy/authoring/reference.py) are what the generator
writes from the code today, and say something for every code, setting and command."""

from __future__ import annotations

import pytest

from proxy.authoring.reference import MEANINGS, REFRESH, reference_pages
from proxy.cli import _parser
from proxy.gate.reasons import Reason
from proxy.settings import Settings
from tests.support.paths import REPO

PAGES = reference_pages(_parser())


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_committed_reference_page_is_current(page: str) -> None:
    """A generated page in docs/reference/ is exactly what the generator writes now."""
    assert (REPO / page).read_text("utf-8") == PAGES[page](), f"refresh it: {REFRESH}"


def test_every_code_has_its_meaning() -> None:
    """Each rejection and outcome code has a meaning in the table, and no meaning is left over."""
    assert set(MEANINGS) == set(Reason)


def test_every_setting_is_described() -> None:
    """Each setting has a description for the settings page."""
    assert [name for name, f in Settings.model_fields.items() if not f.description] == []


def test_every_command_is_on_the_cli_page() -> None:
    """Each subcommand of opgate has its own heading on the CLI page."""
    page = PAGES["docs/reference/cli.md"]()
    for heading in ("## opgate serve", "## opgate policy check", "## opgate audit verify"):
        assert heading in page
