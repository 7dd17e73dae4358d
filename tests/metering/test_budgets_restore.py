"""After Redis loses its data, the gateways' month counters are restored from the
stored usage, never lowered and never counted twice."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest
import redis
from django.conf import settings

from gateway.governance import quota_scope
from metering.budgets import budget_counters_restore, quota_budget_scope
from metering.models import UsageEvent
from routing.table import QuotaEntry
from tenants.models import Quota
from tests import factories

needs_redis = pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis (.ci/run)")


def test_the_control_plane_names_budget_scopes_as_the_gateway_does(db):
    tenant = factories.tenant()
    agent = factories.agent(owner=tenant, name="scoped")
    for kw in ({}, {"agent": agent}):
        quota = Quota(tenant=tenant, monthly_requests=1, **kw)
        entry = QuotaEntry(pk=1, tenant_pk=tenant.pk, agent_pk=kw.get("agent") and agent.pk)
        assert quota_budget_scope(quota) == quota_scope(entry)


@needs_redis
def test_lost_counters_are_restored_and_live_ones_never_lowered(db):
    tenant = factories.tenant()
    Quota.objects.create(tenant=tenant, monthly_requests=100, monthly_cost=Decimal("50"))
    now = datetime.now(tz=UTC)
    for i in range(7):
        UsageEvent.objects.create(request_id=f"r-{i}", tenant=tenant, outcome="success",
                                  input_tokens=2, output_tokens=3, cost=Decimal("0.5"),
                                  occurred_at=now)
    UsageEvent.objects.create(request_id="failed", tenant=tenant, outcome="upstream_error",
                              occurred_at=now)  # no usage: consumes no budget
    prefix = f"{settings.REDIS_KEY_PREFIX}restore-{uuid.uuid4().hex[:8]}:"
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{prefix}usage-month:{now:%Y-%m}:{tenant.pk}"
    try:
        assert budget_counters_restore(client=client, prefix=prefix, now=now) == 1
        assert client.hgetall(key) == {b"requests": b"7", b"tokens": b"35",
                                       b"cost": b"3500000"}
        client.hset(key, mapping={"requests": 9, "tokens": 1})  # the live count is ahead
        budget_counters_restore(client=client, prefix=prefix, now=now)
        assert client.hget(key, "requests") == b"9"  # never lowered
        assert client.hget(key, "tokens") == b"35"  # raised back to the stored usage
    finally:
        client.delete(key)
        client.close()
