"""Alerts: budget thresholds (80 %, 100 %) and an agent with no healthy instance reach the
tenant's webhook signed, are retried after a failure with the same delivery id, are
announced once however often the check runs, and show in the console."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import uuid

import orjson
import pytest
from django.urls import reverse
from django.utils import timezone

from metering.alerts import alerts_check, deliver_alerts
from metering.models import Alert, AlertDelivery, UsageEvent
from tasks.services import signing_secret_create
from tenants.models import Quota
from tests import factories
from tests.support.loopback import LoopbackService
from tests.support.waiting import wait_for


class Receiver(LoopbackService):
    """A webhook receiver on loopback: answers 500 to the first ``fail_first`` posts."""

    def __init__(self, fail_first: int = 0) -> None:
        self.posts: list[dict] = []
        self._failing = fail_first
        super().__init__(self._answer, path="/alerts")

    def _answer(self, request, body: bytes) -> tuple[int, None, bytes]:
        status = 500 if self._failing > 0 else 204
        self._failing -= 1
        self.posts.append({"headers": dict(request.headers), "body": body, "answered": status})
        return status, None, b""


@pytest.fixture
def receiver():
    found = Receiver(fail_first=1)
    yield found
    found.close()


def used(tenant, agent, n: int) -> None:
    UsageEvent.objects.bulk_create([UsageEvent(
        request_id=uuid.uuid4().hex, tenant=tenant, agent=agent, outcome="success",
        occurred_at=timezone.now()) for _ in range(n)])


def deliver_until(predicate, message: str):
    return wait_for(lambda: (deliver_alerts(), predicate())[1], timeout=20, interval=0.02,
                    message=message)


@pytest.mark.django_db
def test_budget_and_health_alerts_reach_the_webhook_signed_once_each(
        receiver, settings, client):
    settings.CALLBACK_BACKOFF_S = 0.01
    tenant = factories.tenant(alert_webhook_url=receiver.url)
    _, secret = signing_secret_create(tenant=tenant, name="alerts")
    agent = factories.agent(owner=tenant, name="budgeted")
    Quota.objects.create(tenant=tenant, agent=agent, monthly_requests=10)
    now = timezone.now()

    used(tenant, agent, 8)
    assert alerts_check(now=now)["opened"] == 1  # 80 %
    assert alerts_check(now=now)["opened"] == 0  # once, however often it runs
    used(tenant, agent, 2)
    assert alerts_check(now=now)["opened"] == 1  # 100 %

    # An agent whose only instance's lease ran out: no healthy instance.
    down = factories.agent(owner=tenant, name="fragile")
    instance = factories.instance(agent=down, lease_expires_at=now - dt.timedelta(seconds=1))
    assert alerts_check(now=now) == {"opened": 1, "resolved": 0}
    assert alerts_check(now=now) == {"opened": 0, "resolved": 0}
    instance.lease_expires_at = now + dt.timedelta(minutes=1)
    instance.save()
    assert alerts_check(now=now) == {"opened": 0, "resolved": 1}

    deliver_until(lambda: AlertDelivery.objects.filter(status="delivered").count() == 4,
                  "four deliveries acknowledged")
    ok = [p for p in receiver.posts if p["answered"] == 204]
    assert len(ok) == 4 and len(receiver.posts) == 5  # the first post failed, and was retried
    failed = receiver.posts[0]
    retried = [p for p in ok if p["headers"]["X-Reach-Delivery"]
               == failed["headers"]["X-Reach-Delivery"]]
    assert len(retried) == 1 and retried[0]["body"] != b""
    for post in receiver.posts:
        headers = post["headers"]
        expected = "sha256=" + hmac.new(
            secret.encode(), headers["X-Reach-Timestamp"].encode() + b"." + post["body"],
            hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["X-Reach-Signature"], expected)
    bodies = [orjson.loads(p["body"]) for p in ok]
    events = sorted((b["alert"]["kind"], b["event"], b["alert"]["details"].get("threshold"))
                    for b in bodies)
    assert events == [("budget", "opened", "0.80"), ("budget", "opened", "1.00"),
                      ("no_healthy_instance", "opened", None),
                      ("no_healthy_instance", "resolved", None)]
    assert all(b["alert"]["tenant"] == tenant.slug for b in bodies)

    # The console shows them.
    client.force_login(factories.staff_user(tenant=tenant))
    html = client.get(reverse("admin:index")).content.decode()
    assert html.count('data-alert="budget"') == 2
    assert 'data-alert="no_healthy_instance"' in html and "fragile" in html


@pytest.mark.django_db
def test_without_a_webhook_alerts_are_recorded_and_nothing_is_sent(receiver):
    tenant = factories.tenant()
    agent = factories.agent(owner=tenant)
    factories.instance(agent=agent, state="offline")
    assert alerts_check(now=timezone.now())["opened"] == 1
    assert Alert.objects.filter(tenant=tenant, kind="no_healthy_instance").exists()
    assert not AlertDelivery.objects.exists()


@pytest.mark.django_db
def test_a_drained_agent_is_not_down_and_a_webhook_url_obeys_the_endpoint_policy(client):
    tenant = factories.tenant()
    agent = factories.agent(owner=tenant)
    factories.instance(agent=agent, state="draining")
    assert alerts_check(now=timezone.now())["opened"] == 0
    key = factories.api_key(tenant=tenant).plaintext

    def patch(url: str):
        return client.patch(f"/api/v1/tenants/{tenant.slug}/", data={
            "alert_webhook_url": url}, content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {key}")

    reply = patch("http://169.254.169.254/latest")  # the cloud metadata address
    assert reply.status_code == 400, reply.content
    assert "alert_webhook_url" in reply.json()["error"]["details"]
    assert patch("http://127.0.0.1:9911/hooks").status_code == 200
    tenant.refresh_from_db()
    assert tenant.alert_webhook_url == "http://127.0.0.1:9911/hooks"
