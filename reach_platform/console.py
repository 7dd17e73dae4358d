"""The operations console: the admin's landing dashboard and each agent's activity page.

Read-only views over the call log (usage events), the registry and the budget alerts,
scoped to the tenants the viewer may see. Charts are inline SVG from the server.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import time
import uuid

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import F, Q
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

from metering import dashboard
from metering.models import Alert
from reach_core.kinds import InstanceState
from reach_platform.charts import stacked_bars
from registry.models import Agent, Instance, InstanceTransition
from tenants.principal import principal_for_request

logger = logging.getLogger(__name__)

HOUR, DAY = dt.timedelta(hours=1), dt.timedelta(days=1)


def dashboard_context(request, now: dt.datetime | None = None) -> dict:
    now = now or timezone.now()
    tenant_ids = principal_for_request(request).tenant_ids
    minutes = dashboard.buckets(tenant_ids, until=now, count=60, width=dt.timedelta(minutes=1))
    hour = dashboard.summary(tenant_ids, since=now - HOUR, until=now + dt.timedelta(seconds=1))
    day = dashboard.summary(tenant_ids, since=now - DAY, until=now + dt.timedelta(seconds=1))
    return {
        "now": now,
        "hour": hour, "day": day,
        "calls_per_minute": round(hour.total / 60, 1),
        "minutes_chart": stacked_bars(
            "Calls per minute, last hour", [(f"{b.start:%H:%M}", b.ok, b.failed)
                                            for b in minutes]),
        "unhealthy": _visible_instances(request).exclude(state=InstanceState.HEALTHY)
        .select_related("agent__namespace").order_by("agent__name", "pk")[:50],
        "refused_by_breakers": hour.by_outcome.get("circuit_open", 0)
        + hour.by_outcome.get("no_healthy_instance", 0),
        "open_breakers": _open_breakers(request),
        # Open ones, and those of the last week.
        "alerts": Alert.objects.for_tenants(tenant_ids).select_related("tenant")
        .filter(Q(resolved_at__isnull=True) | Q(opened_at__gte=now - 7 * DAY))
        .order_by(F("resolved_at").desc(nulls_first=True), "-opened_at")[:20],
        "backlog": usage_backlog(),
        **_false_positives(request, now - DAY),
        "call_log_url": reverse("admin:metering_usageevent_changelist"),
    }


def _false_positives(request, since: dt.datetime) -> dict:
    """Heartbeat false positives: instances judged lapsed (unknown) that came back healthy
    on their own, of all the lapses, since ``since``."""
    tenant_ids = principal_for_request(request).tenant_ids
    transitions = InstanceTransition.objects.filter(at__gte=since)
    if tenant_ids is not None:
        transitions = transitions.filter(agent__owner_tenant_id__in=tenant_ids)
    return {"lapses": transitions.filter(to_state=InstanceState.UNKNOWN).count(),
            "false_positives": transitions.filter(from_state=InstanceState.UNKNOWN,
                                                  to_state=InstanceState.HEALTHY).count()}


def open_breakers_now() -> dict[int, str] | None:
    """Instance pk -> its breaker's state ("open", "half_open") in any gateway process:
    the embedded gateway's own, or what each gateway publishes to Redis every 2 s
    (``gateway_factory.publish_breakers``). None when it cannot be read."""
    if not settings.REDIS_URL:
        gateway = _embedded_gateway()
        if gateway is None:
            return None
        return {pk: str(state) for pk, state in gateway.breakers.states().items()}
    import orjson
    import redis

    client = _redis()
    merged: dict[int, str] = {}
    try:
        for key in client.scan_iter(f"{settings.REDIS_KEY_PREFIX}breakers:*", count=100):
            for pk, state in orjson.loads(client.get(key) or b"{}").items():
                # Open anywhere counts as open.
                if merged.get(int(pk)) != "open":
                    merged[int(pk)] = state
    except redis.RedisError as exc:
        logger.warning("console: breakers unreadable (%s)", type(exc).__name__)
        return None
    finally:
        client.close()
    return merged


def _open_breakers(request) -> list[dict] | None:
    states = open_breakers_now()
    if states is None:
        return None
    rows = _visible_instances(request).filter(pk__in=list(states)).select_related(
        "agent__namespace").order_by("agent__name", "pk")
    return [{"instance": i, "state": states[i.pk]} for i in rows]


def _visible_instances(request):
    tenant_ids = principal_for_request(request).tenant_ids
    instances = Instance.objects.all()
    return instances if tenant_ids is None else instances.filter(
        agent__owner_tenant_id__in=tenant_ids)


def _embedded_gateway():
    """The gateway serving in this very process (the embedded mode), if one does."""
    return getattr(sys.modules.get("reach_platform.asgi"), "gateway_application", None)


def _redis():
    import redis

    # The console answers with "unreadable" rather than wait on a Redis that hangs.
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1)


def usage_backlog() -> dict | None:
    """Usage events not yet stored: the gateway's queue in the embedded mode, the Redis
    stream's consumer-group lag (entries not yet read) and pending (read, not stored)
    in production. None when it cannot be read (Redis away)."""
    if not settings.REDIS_URL:
        gateway = _embedded_gateway()
        if gateway is None or gateway.usage is None:
            return None
        return {"waiting": len(gateway.usage), "pending": 0, "where": "gateway queue"}
    import redis

    from metering.ingest import GROUP, STREAM

    client = _redis()
    try:
        groups = {g["name"].decode(): g for g in client.xinfo_groups(STREAM())}
    except redis.ResponseError:
        return {"waiting": 0, "pending": 0, "where": "Redis stream (no consumer yet)"}
    except redis.RedisError as exc:
        logger.warning("console: usage backlog unreadable (%s)", type(exc).__name__)
        return None
    finally:
        client.close()
    group = groups.get(GROUP, {})
    return {"waiting": group.get("lag") or 0, "pending": group.get("pending", 0),
            "where": "Redis stream"}


def agent_activity(request, pk: int):
    """One agent: its reach success and latency over the last day (per half hour), its
    instances and their recent state transitions, and a dry-run test call."""
    agent = get_object_or_404(Agent.objects.select_related("namespace", "owner_tenant"), pk=pk)
    principal = principal_for_request(request)
    if not principal.can_read(agent.owner_tenant_id):
        raise PermissionDenied
    now = timezone.now()
    tenant_ids = principal.tenant_ids
    instances = list(agent.instances.order_by("pk"))
    # ?instance=<pk>: the page of one instance (its calls and its state changes).
    chosen = next((i for i in instances if str(i.pk) == request.GET.get("instance")), None)
    halves = dashboard.buckets(tenant_ids, until=now, count=48,
                               width=dt.timedelta(minutes=30), agent_id=agent.pk,
                               instance_id=chosen.pk if chosen else None)
    transitions = InstanceTransition.objects.filter(agent=agent)
    if chosen is not None:
        transitions = transitions.filter(instance_pk=chosen.pk)
    context = {
        **admin.site.each_context(request),
        "title": f"{agent.namespace.name}/{agent.name}"
        + (f", instance {chosen.pk}" if chosen else ""),
        "agent": agent, "chosen": chosen,
        "hour": dashboard.summary(tenant_ids, since=now - HOUR, until=now + dt.timedelta(
            seconds=1), agent_id=agent.pk),
        "day": dashboard.summary(tenant_ids, since=now - DAY, until=now + dt.timedelta(
            seconds=1), agent_id=agent.pk),
        "chart": stacked_bars("Calls per half hour, last day"
                              + (f", instance {chosen.pk}" if chosen else ""),
                              [(f"{b.start:%m-%d %H:%M}", b.ok, b.failed) for b in halves]),
        "instances": instances,
        "transitions": transitions.order_by("-at")[:30],
        "capabilities": list(agent.capabilities.order_by("capability_id")),
        "call_log_url": reverse("admin:metering_usageevent_changelist")
        + f"?agent__id__exact={agent.pk}",
        "dry_run": _dry_run(request, agent) if request.method == "POST" else None,
        "real_call": _real_call(request, agent)
        if request.method == "POST" and request.POST.get("real") else None,
        "can_call": bool(settings.CONSOLE_GATEWAY_URL)
        and principal.can_manage(agent.owner_tenant_id),
        "input": request.POST.get("input", "{}"),
    }
    return TemplateResponse(request, "admin/console/agent.html", context)


def _dry_run(request, agent: Agent) -> dict:
    """Where a call to one of the agent's capabilities would go now, as a gateway would
    decide it from the current table: the dry run the gateway's /v1/route answers."""
    from registry.snapshot import build_table
    from routing.router import Router, RouteRequest

    capability = request.POST.get("capability", "")
    if not agent.capabilities.filter(capability_id=capability).exists():
        return {"error": f"{capability!r} is not one of this agent's capabilities."}
    decision = Router().route(build_table(), RouteRequest(
        tenant_pk=agent.owner_tenant_id, capability=capability), pick=False)
    explained = decision.explain()
    # A dry run ranks without picking: the first candidate is where the call would go.
    chosen = explained["chosen"] or next(iter(explained["candidates"]), None)
    return {"capability": capability, "explained": explained, "chosen": chosen,
            "error": decision.error}


# A test call's key is the owner tenant's, for this call only: it expires on its own
# within the minute, and is revoked as soon as the call returned.
TEST_KEY_LIFETIME = dt.timedelta(seconds=60)
TEST_CALL_TIMEOUT_S = 30.0
KEY_PROPAGATION_S = 5.0  # how long a new key may take to reach the gateway's table


def _real_call(request, agent: Agent) -> dict:
    """One real call of a capability of the agent, through a gateway, as its owner tenant
    (only for those who may manage that tenant: a call may cost money): the gateway's
    status, its reply and the request id to find it in the call log."""
    import httpx
    import orjson

    from tenants.choices import ApiKeyScope
    from tenants.services import api_key_create, api_key_revoke

    principal = principal_for_request(request)
    if not principal.can_manage(agent.owner_tenant_id):
        raise PermissionDenied
    if not settings.CONSOLE_GATEWAY_URL:
        return {"error": "No gateway to call: set REACH_CONSOLE_GATEWAY_URL."}
    capability = request.POST.get("capability", "")
    if not agent.capabilities.filter(capability_id=capability).exists():
        return {"error": f"{capability!r} is not one of this agent's capabilities."}
    try:
        payload = orjson.loads(request.POST.get("input") or "{}")
    except orjson.JSONDecodeError as exc:
        return {"error": f"The input is not JSON: {exc}"}
    if not isinstance(payload, dict):
        return {"error": "The input must be a JSON object."}
    issued = api_key_create(tenant=agent.owner_tenant, scopes=[ApiKeyScope.INVOKE],
                            name=f"console test call by {request.user.get_username()}"[:100],
                            expires_at=timezone.now() + TEST_KEY_LIFETIME)
    request_id = uuid.uuid4().hex
    try:
        reply = _call_when_known(issued.plaintext, request_id, {
            "capability": capability, "input": payload,
            "namespace": agent.namespace.name})
    except httpx.HTTPError as exc:
        return {"error": f"The gateway at {settings.CONSOLE_GATEWAY_URL} did not answer "
                         f"({type(exc).__name__}).", "request_id": request_id}
    finally:
        api_key_revoke(api_key=issued.api_key)
    return {"status": reply.status_code, "request_id": request_id,
            "body": reply.text[:4000],
            "call_log_url": reverse("admin:metering_usageevent_changelist")
            + f"?q={request_id}"}


def _call_when_known(key: str, request_id: str, body: dict):
    """POST the call; while the gateway does not know the new key yet (401 until the
    route-table change reaches it), try again, for at most ``KEY_PROPAGATION_S``."""
    import httpx

    deadline = time.monotonic() + KEY_PROPAGATION_S
    with httpx.Client(base_url=settings.CONSOLE_GATEWAY_URL, timeout=TEST_CALL_TIMEOUT_S,
                      headers={"Authorization": f"Bearer {key}",
                               "X-Request-ID": request_id}) as client:
        while True:
            reply = client.post("/v1/invoke", json=body)
            if reply.status_code != 401 or time.monotonic() >= deadline:
                return reply
            time.sleep(0.05)


def urls() -> list:
    return [path("console/agents/<int:pk>/", admin.site.admin_view(agent_activity),
                 name="console-agent")]
