"""Provider credentials: the header value a policy's ``credential:`` injects.

Static secrets (a bearer token, an API-key header) are read by ``proxy.settings.Secrets``
(environment or secret file, never a policy); OAuth2 client credentials exchange such a secret
for an access token (proxy.gate.oauth2). A credential that cannot be had makes that provider
answer 503 credential_unavailable, never forward unauthenticated.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from proxy.gate.decision import Deny
from proxy.gate.oauth2 import TokenCache, TokenUnavailable
from proxy.gate.reasons import Reason
from proxy.policy.model import CredentialInjection, OAuth2ClientCredentials, Provider
from proxy.settings import Secrets


class CredentialUnavailable(Exception):
    """The provider's credential cannot be had now: nothing may be sent."""


def _with_scheme(scheme: str | None, value: str) -> str:
    """The header value: ``Bearer <value>``, or the bare value (``scheme: null``)."""
    return f"{scheme} {value}" if scheme else value


class CredentialSource(Secrets):
    def __init__(self, secrets_dir: Path | None, environ: dict[str, str] | None = None) -> None:
        super().__init__(secrets_dir, environ)
        self.tokens = TokenCache()

    def header_value(self, injection: CredentialInjection) -> str | None:
        secret = self.secret(injection.secret)
        if secret is None:
            return None
        return _with_scheme(injection.scheme, secret)

    async def resolve(
        self,
        credential: CredentialInjection | OAuth2ClientCredentials,
        session: aiohttp.ClientSession,
        upstream_base: str = "",
    ) -> str:
        """The header value to send; CredentialUnavailable (with why) if there is none."""
        if isinstance(credential, CredentialInjection):
            value = self.header_value(credential)
            if value is None:
                raise CredentialUnavailable(f"secret {credential.secret!r} is not configured")
            return value
        credential, client_id, client_secret = self._client(credential, upstream_base)
        try:
            token = await self.tokens.token(credential, client_id, client_secret, session)
        except TokenUnavailable as exc:
            raise CredentialUnavailable(str(exc)) from exc
        return _with_scheme(credential.scheme, token)

    def _client(
        self, credential: OAuth2ClientCredentials, upstream_base: str
    ) -> tuple[OAuth2ClientCredentials, str, str]:
        """The credential with its token endpoint's full URL, the client id and its secret."""
        client_secret = self.secret(credential.secret)
        if client_secret is None:
            raise CredentialUnavailable(f"secret {credential.secret!r} is not configured")
        client_id = credential.client_id
        if credential.client_id_secret is not None:
            client_id = self.secret(credential.client_id_secret)
            if client_id is None:
                name = credential.client_id_secret
                raise CredentialUnavailable(f"secret {name!r} is not configured")
        assert client_id is not None  # the model requires one of the two
        if credential.token_url.startswith("/"):
            credential = credential.model_copy(
                update={"token_url": upstream_base + credential.token_url}
            )
        return credential, client_id, client_secret


async def provider_credential(
    source: CredentialSource,
    session: aiohttp.ClientSession,
    provider: Provider,
    upstream_base: str,
) -> dict[str, str] | Deny:
    """The header opgate authenticates to ``provider`` with (none if it needs none), or the
    refusal: fetched before the claim, so that a missing credential leaves nothing sent."""
    if provider.credential is None:
        return {}
    try:
        value = await source.resolve(provider.credential, session, upstream_base)
    except CredentialUnavailable as exc:
        return Deny(Reason.CREDENTIAL_UNAVAILABLE, f"no credential for {provider.provider}: {exc}")
    return {provider.credential.header: value}
