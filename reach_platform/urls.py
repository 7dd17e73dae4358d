from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import SimpleRouter

from audit.api import AuditEntryViewSet
from metering.api.views import (
    ToolUsageView,
    UsageAllocationView,
    UsageDailyViewSet,
    UsageEventViewSet,
    UsageReportCSVView,
    UsageReportView,
)
from reach_platform import console, health
from reach_platform.index import ApiIndexView
from registry.api.views import (
    AgentRegisterView,
    AgentViewSet,
    CapabilityViewSet,
    InstanceViewSet,
    NamespaceViewSet,
    ParameterSynonymViewSet,
)
from tasks.api.views import SigningSecretViewSet, TaskPushView, TaskViewSet
from tenants.api.views import (
    ApiKeyViewSet,
    CredentialViewSet,
    GrantViewSet,
    QuotaViewSet,
    TenantViewSet,
)
from tools.api.views import ToolGrantViewSet, ToolViewSet

router = SimpleRouter()
# Trailing slash optional: a redirect would drop a POST body, and clients differ.
router.trailing_slash = "/?"
router.register("tenants", TenantViewSet, basename="tenant")
router.register("api-keys", ApiKeyViewSet, basename="api-key")
router.register("grants", GrantViewSet, basename="grant")
router.register("credentials", CredentialViewSet, basename="credential")
router.register("quotas", QuotaViewSet, basename="quota")
router.register("namespaces", NamespaceViewSet, basename="namespace")
router.register("agents", AgentViewSet, basename="agent")
router.register("parameter-synonyms", ParameterSynonymViewSet, basename="parameter-synonym")
router.register("capabilities", CapabilityViewSet, basename="capability")
router.register("instances", InstanceViewSet, basename="instance")
router.register("usage/events", UsageEventViewSet, basename="usage-event")
router.register("usage/daily", UsageDailyViewSet, basename="usage-daily")
router.register("audit", AuditEntryViewSet, basename="audit-entry")
router.register("tasks", TaskViewSet, basename="task")
router.register("signing-secrets", SigningSecretViewSet, basename="signing-secret")
router.register("tools", ToolViewSet, basename="tool")
router.register("tool-grants", ToolGrantViewSet, basename="tool-grant")

admin.site.site_header = "Agent-Reach operations"
admin.site.site_title = "Agent-Reach"
admin.site.index_title = "Operations console"
admin.site.index_template = "admin/console/index.html"

urlpatterns = [
    # Before the admin's own URLs, which would take any path under admin/.
    path("admin/", include(console.urls())),
    path("admin/", admin.site.urls),
    path("api/v1/agents/register", AgentRegisterView.as_view(), name="agent-register"),
    # The usage API's root lists usage events, newest first (as /usage/events/ does).
    path("api/v1/usage/", UsageEventViewSet.as_view({"get": "list"}), name="usage-root"),
    path("api/v1/usage/report/", UsageReportView.as_view(), name="usage-report"),
    path("api/v1/usage/report.csv", UsageReportCSVView.as_view(), name="usage-report-csv"),
    path("api/v1/usage/allocation/", UsageAllocationView.as_view(), name="usage-allocation"),
    path("api/v1/usage/tools/", ToolUsageView.as_view(), name="usage-tools"),
    path("api/v1/tasks/<str:pk>/a2a-push", TaskPushView.as_view(), name="task-a2a-push"),
    path("api/v1/", ApiIndexView.as_view(router=router), name="api-index"),
    path("api/v1/", include(router.urls)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
]

handler400 = "reach_platform.errors.bad_request"
handler403 = "reach_platform.errors.permission_denied"
handler404 = "reach_platform.errors.page_not_found"
handler500 = "reach_platform.errors.server_error"
