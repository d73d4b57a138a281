#!/usr/bin/env bash
# One Patroni failover under a stream of approved refunds through opgate, counted at the
# provider (deploy/patroni/failover_run.py says how). Installs nothing: it says what is missing.
#
#   deploy/patroni/failover-run.sh [--strict] [--agents N] [--keep]
#
# Needs: Debian's patroni and etcd-server packages, PostgreSQL 15 binaries in
# /usr/lib/postgresql/15/bin, the repository's .venv (./dev test --co -q makes it), and root
# or the postgres user (PostgreSQL refuses to run as root: the cluster runs as postgres).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
pg_bin=/usr/lib/postgresql/15/bin

missing=()
packages=()
for tool in patroni patronictl; do
    command -v "$tool" >/dev/null || { missing+=("$tool"); packages+=(patroni); }
done
command -v etcd >/dev/null || { missing+=(etcd); packages+=(etcd-server); }
for tool in postgres initdb pg_ctl pg_basebackup pg_rewind; do
    [ -x "$pg_bin/$tool" ] || { missing+=("$pg_bin/$tool"); packages+=(postgresql-15); }
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "missing: ${missing[*]}" >&2
    echo "install: apt-get install $(printf '%s\n' "${packages[@]}" | sort -u | tr '\n' ' ')" >&2
    exit 3
fi
if [ ! -x "$repo/.venv/bin/python" ]; then
    echo "missing: $repo/.venv (run ./dev test --co -q once in $repo)" >&2
    exit 3
fi
if [ "$(id -u)" -ne 0 ] && [ "$(id -un)" != postgres ]; then
    echo "run as root or as postgres: PostgreSQL and Patroni run as postgres" >&2
    exit 3
fi

exec "$repo/.venv/bin/python" "$here/failover_run.py" "$@"
