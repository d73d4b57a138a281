"""Where the repository's own files are, for tests in any folder."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
FIXTURES = REPO / "tests" / "fixtures"
README = REPO / "README.md"
AUDIT_DOC = REPO / "docs" / "audit.md"
