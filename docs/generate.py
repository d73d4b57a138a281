"""Write the reference pages that restate code (docs/reference/codes.md, settings.md, cli.md).

Run from the repository: ``python docs/generate.py`` (the venv's Python, opgate installed).
tests/authoring/test_reference.py fails when a committed page differs from what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from proxy.authoring.reference import write_reference
from proxy.cli import _parser

if __name__ == "__main__":
    changed = write_reference(_parser(), Path(__file__).resolve().parents[1])
    print("\n".join(f"wrote {path}" for path in changed) or "the reference pages are current")
    sys.exit(0)
