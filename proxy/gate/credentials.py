"""Provider credentials: read from the environment or a secret file, never from a policy.

``OPGATE_SECRET_STRIPE_API_KEY`` or ``<secrets_dir>/stripe_api_key`` for ``secret: stripe_api_key``.
Read per use (cheap: a dict lookup or a small file), so a rotated secret file takes effect
without a restart. A missing secret makes that provider answer 503, never forward unauthenticated.
"""

from __future__ import annotations

import os
from pathlib import Path

from proxy.policy.model import CredentialInjection


class CredentialSource:
    def __init__(self, secrets_dir: Path | None, environ: dict[str, str] | None = None) -> None:
        self._secrets_dir = secrets_dir
        self._environ = environ if environ is not None else dict(os.environ)

    def secret(self, name: str) -> str | None:
        value = self._environ.get(f"OPGATE_SECRET_{name.upper()}")
        if value:
            return value
        if self._secrets_dir is not None:
            path = self._secrets_dir / name
            if path.is_file():
                return path.read_text("utf-8").strip() or None
        return None

    def header_value(self, injection: CredentialInjection) -> str | None:
        secret = self.secret(injection.secret)
        if secret is None:
            return None
        return f"{injection.scheme} {secret}" if injection.scheme else secret
