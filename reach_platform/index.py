"""``/api/v1/``: an index of the control plane's API, so the URL the README names answers."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import permissions
from rest_framework.response import Response
from rest_framework.views import APIView


class ApiIndexView(APIView):
    """What ``/api/v1/`` serves: its resources (and where the gateway and docs are)."""

    permission_classes = [permissions.AllowAny]
    authentication_classes: list = []
    router = None  # the API's router (as_view(router=...))

    @extend_schema(exclude=True)
    def get(self, request):
        base = request.build_absolute_uri("/api/v1/")
        resources = {prefix: f"{base}{prefix}/" for prefix, _, _ in self.router.registry}
        return Response({
            "service": "Agent-Reach control plane",
            "resources": resources,
            "also": {"register an agent": f"{base}agents/register",
                     "usage report": f"{base}usage/report/",
                     "tool usage": f"{base}usage/tools/",
                     "usage allocation": f"{base}usage/allocation/"},
            "docs": request.build_absolute_uri("/api/docs/"),
            "gateway": request.build_absolute_uri("/v1/"),
        })
