"""Write the console's screenshots in docs/ (console-proposal.png, console-escalation.png,
console-dashboard.png) from the browser tests that show those pages, in headless Chromium:

    PYTHONPATH=$PWD OPGATE_TEST_DATABASE_URL=postgresql://... python docs/screenshots.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    env = {**os.environ, "OPGATE_WRITE_DOCS_SCREENSHOTS": "1"}
    test = REPO / "tests" / "console" / "test_console_pages.py"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)]
    # the command is this interpreter and a fixed path: nothing from outside
    return subprocess.run(command, cwd=REPO, env=env, check=False).returncode  # noqa: S603


if __name__ == "__main__":
    sys.exit(main())
