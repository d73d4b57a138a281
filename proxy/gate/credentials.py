"""Provider credentials: the header value a policy's ``credential:`` injects, from a secret.

Secrets themselves are read by ``proxy.settings.Secrets`` (environment or secret file, never a
policy); a missing secret makes that provider answer 503, never forward unauthenticated.
"""

from __future__ import annotations

from proxy.policy.model import CredentialInjection
from proxy.settings import Secrets


class CredentialSource(Secrets):
    def header_value(self, injection: CredentialInjection) -> str | None:
        secret = self.secret(injection.secret)
        if secret is None:
            return None
        return f"{injection.scheme} {secret}" if injection.scheme else secret
