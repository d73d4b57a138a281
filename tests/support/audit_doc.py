"""The request record's fields as docs/ documents them."""

from __future__ import annotations

import re

from tests.support.paths import AUDIT_DOC

DOCS = AUDIT_DOC


def documented_request_fields() -> set[str]:
    """The field names of the `request` table in docs/audit.md (a row may name several)."""
    text = DOCS.read_text()
    section = text.split("### `request`", 1)[1].split("###", 1)[0]
    fields: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            fields.update(re.findall(r"`([a-z_0-9]+)`", first_cell))
    return fields
