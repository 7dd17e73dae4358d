from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from reach_core.errors import ReachError
from reach_platform import auth_throttle
from registry.tokens import agent_token_authenticate
from tenants.principal import principal_for_agent_token, principal_for_api_key
from tenants.services import api_key_authenticate


class BearerAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <token>``: a tenant API key (``rk_…``) or an agent
    token (``rat_…``). Sets ``request.auth`` to the token's ``Principal``.

    Here in the project package rather than in ``tenants`` because it knows both
    kinds of token, and ``tenants`` imports no other app.

    A request without the header falls through to session authentication (the
    Swagger UI used by a logged-in staff user); a wrong token is always refused.
    Failures are counted per client address (``reach_platform.auth_throttle``): past the
    limit, every request with credentials from there is a 429 until the window ends.
    """

    keyword = "bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        address = request.META.get("REMOTE_ADDR", "")
        wait = auth_throttle.retry_after(address)
        if wait is not None:
            # Imported here: reach_platform.errors imports rest_framework.views, which
            # imports this module through the DRF settings.
            from reach_platform.errors import ReachAPIException

            raise ReachAPIException(ReachError(
                "too_many_requests",
                "Too many failed authentications from this address; retry later.",
                retry_after=wait,
            ))
        try:
            return self._authenticate(header)
        except exceptions.AuthenticationFailed:
            auth_throttle.record_failure(address)
            raise

    def _authenticate(self, header: str):
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != self.keyword or not token:
            raise exceptions.AuthenticationFailed(
                "Expected 'Authorization: Bearer <api key>'."
            )
        if token.startswith("rat_"):
            result = agent_token_authenticate(plaintext=token)
            to_principal = principal_for_agent_token
        else:
            result = api_key_authenticate(plaintext=token)
            to_principal = principal_for_api_key
        if isinstance(result, str):
            raise exceptions.AuthenticationFailed(result)
        principal = to_principal(result)
        return (_TokenUser(principal.label), principal)

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="agent-reach"'


class _TokenUser:
    """The ``request.user`` of a token-authenticated request: authenticated, never staff."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None

    def __init__(self, label: str) -> None:
        self.label = label

    def get_username(self) -> str:
        return self.label

    def __str__(self) -> str:
        return self.label


class BearerAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "reach_platform.authentication.BearerAuthentication"
    name = "BearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A tenant API key (`rk_<prefix>_<secret>`) or, for an agent's own "
            "registration, heartbeats and deregistration, its agent token (`rat_…`).",
        }
