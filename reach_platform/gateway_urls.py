"""What Django answers in a gateway process: the balancer's health checks."""

from django.urls import path

from reach_platform import health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
]
