from django.db import models


class MembershipRole(models.TextChoices):
    ADMIN = "admin", "Admin (view and edit)"
    VIEWER = "viewer", "Viewer (read only)"


class ApiKeyScope(models.TextChoices):
    INVOKE = "invoke", "Invoke agents (data plane)"
    READ = "read", "Read control-plane objects"
    MANAGE = "manage", "Create, change and delete control-plane objects"
    REGISTER = "register", "Register agents (exchanged for agent-scoped tokens)"


class CredentialKind(models.TextChoices):
    HEADER = "header", "Header"
    QUERY = "query", "Query parameter"
    BEARER = "bearer", "Bearer token"
    MTLS = "mtls", "mTLS client certificate"
