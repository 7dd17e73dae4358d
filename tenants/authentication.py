from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from tenants.services import api_key_authenticate


class BearerAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <token>``: a tenant API key (``rk_…``) or an agent
    token (``rat_…``). Sets ``request.auth`` to the ``ApiKey`` or ``AgentToken``.

    A request without the header falls through to session authentication (the
    Swagger UI used by a logged-in staff user); a wrong token is always refused.
    """

    keyword = "bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != self.keyword or not token:
            raise exceptions.AuthenticationFailed(
                "Expected 'Authorization: Bearer <api key>'."
            )
        if token.startswith("rat_"):
            from registry.services import agent_token_authenticate

            result = agent_token_authenticate(plaintext=token)
            label = f"agent:{getattr(result, 'prefix', '')}"
        else:
            result = api_key_authenticate(plaintext=token)
            label = f"key:{getattr(result, 'prefix', '')}"
        if isinstance(result, str):
            raise exceptions.AuthenticationFailed(result)
        return (_TokenUser(label), result)

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
    target_class = "tenants.authentication.BearerAuthentication"
    name = "BearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A tenant API key (`rk_<prefix>_<secret>`) or, for an agent's own "
            "registration, heartbeats and deregistration, its agent token (`rat_…`).",
        }
