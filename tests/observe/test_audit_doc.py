"""docs/audit.md is the audit schema's contract: it must list every code and every field."""

from __future__ import annotations

import dataclasses

from proxy.gate.reasons import Reason
from proxy.observe.audit import AuditRecord, Decision
from proxy.store.operation import LastOutcome
from tests.support.audit_doc import DOCS, documented_request_fields


def test_every_reason_code_is_in_the_audit_doc() -> None:
    """A code added to proxy/gate/reasons.py without a row in docs/audit.md fails here."""
    text = DOCS.read_text()
    assert [r.value for r in Reason if f"| `{r.value}` |" not in text] == []


def test_every_decision_and_unknown_outcome_is_in_the_audit_doc() -> None:
    """The decision values and the unknown outcomes a `reason` can hold are documented."""
    text = DOCS.read_text()
    decisions = [v for k, v in vars(Decision).items() if k.isupper()]
    outcomes = [
        o.value for o in LastOutcome if o not in (LastOutcome.CONFIRMED, LastOutcome.FAILED)
    ]
    assert [v for v in [*decisions, *outcomes] if f"`{v}`" not in text] == []


def test_every_request_record_field_is_in_the_audit_doc() -> None:
    """The canonical record's fields are exactly the documented ones."""
    fields = {f.name for f in dataclasses.fields(AuditRecord)} - {"started_monotonic"}
    assert documented_request_fields() == fields


def test_the_output_of_audit_verify_is_documented() -> None:
    """Each form of the lines `opgate audit verify` begins with (tests/observe/
    test_auditlog_cli_verify.py and test_auditlog_chain.py assert them) is in docs/audit.md,
    with the exit statuses."""
    section = DOCS.read_text().split("**Verification.**", 1)[1].split("**What someone", 1)[0]
    section = " ".join(section.split())  # as wrapped in the page: one space between words
    forms = [
        "`ok: <summary>`",
        "`BROKEN: first broken record: ...`",
        "`BROKEN: the tree: <first problem>`",
        "`chains ok: <summary>`",
        "`tree: ok: <N> leaves,",
        "`tree: BROKEN: <N> problems; ...`",
        "`tree: not checked (<why>)`",
        "Exit status: 0 intact, 1 a chain or the tree broken, 2",
    ]
    assert [form for form in forms if form not in section] == []
