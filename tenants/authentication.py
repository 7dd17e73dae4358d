from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from tenants.services import api_key_authenticate


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer rk_…``. Sets ``request.auth`` to the ``ApiKey``.

    A request without the header falls through to session authentication (the
    Swagger UI used by a logged-in staff user); a wrong key is always refused.
    """

    keyword = "bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != self.keyword or not token.strip():
            raise exceptions.AuthenticationFailed(
                "Expected 'Authorization: Bearer <api key>'."
            )
        result = api_key_authenticate(plaintext=token.strip())
        if isinstance(result, str):
            raise exceptions.AuthenticationFailed(result)
        return (_KeyUser(result), result)

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="agent-reach"'


class _KeyUser:
    """The ``request.user`` of a key-authenticated request: authenticated, never staff."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None

    def __init__(self, api_key) -> None:
        self.api_key = api_key

    def get_username(self) -> str:
        return f"key:{self.api_key.prefix}"

    def __str__(self) -> str:
        return self.get_username()


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiKeyAuthentication"
    name = "ApiKeyAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A tenant API key, `rk_<prefix>_<secret>`.",
        }
