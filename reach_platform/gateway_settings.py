"""Settings of a gateway process (``reach_platform.gateway_asgi``): the platform's
settings, with only the apps the data plane reads installed.

A gateway process serves ``/v1/``, ``/metrics``, ``/healthz`` and ``/readyz``; it loads the
route table through the ORM and nothing else of Django. Leaving out the admin, the REST
framework, the OpenAPI generator and Celery keeps a gateway some 30 MB smaller, which
every gateway process of a deployment pays (bench/fleet.py). Management commands and the
control plane keep using ``reach_platform.settings``.
"""

from reach_platform.settings import *  # noqa: F403

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",  # tenants' memberships point at users
    "tenants",
    "registry",
    "tasks",  # /v1/tasks: submitted and read by the gateway, run by the workers
    "tools",  # tools reach the route table through the ORM
]
MIDDLEWARE = [
    "reach_platform.middleware.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
]
ROOT_URLCONF = "reach_platform.gateway_urls"
TEMPLATES = []
SERVE_GATEWAY = True
SERVE_API = False
