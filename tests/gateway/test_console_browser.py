"""The console in a real browser (Playwright driving Debian's chromium) against a real
platform process: calls made through its gateway, their usage stored by the metering
consumer, then an operator logs in, reads the dashboard, finds a failed call by its
request id, opens the agent's page and its chart, downloads the usage CSV; and a
tenant's staff user sees that tenant's calls only.

Screenshots go to ``REACH_SCREENSHOTS_DIR`` when set (the README's come from here), else
to the test's temporary directory.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from registry.services import agent_register
from registry.spec import AgentSpec, CapabilitySpec
from tests import factories
from tests.support.waiting import wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.skipif(
        not (settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
             and settings.REDIS_URL),
        reason="usage rows come through the Redis stream (.ci/run sets PostgreSQL and Redis)"),
    # .ci/run installs the Debian package when it is missing: there it always runs.
    pytest.mark.skipif(CHROMIUM is None, reason="needs the chromium package"),
]


def store_usage(tenant, request_ids: list[str]) -> None:
    import redis as redis_sync

    from metering.ingest import usage_stream_consume
    from metering.models import UsageEvent

    client = redis_sync.Redis.from_url(settings.REDIS_URL)
    try:
        def stored() -> bool:
            usage_stream_consume(client=client, consumer="browser-test", block_ms=100,
                                 max_batches=10)
            return UsageEvent.objects.filter(request_id__in=request_ids).count() \
                >= len(request_ids)

        wait_for(stored, timeout=30, interval=0.1, message="the calls' usage rows")
    finally:
        client.close()


def server_password(plaintext: str) -> str:
    """A password hash the platform process checks: the test settings hash with a fast
    hasher the platform's own settings do not accept."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    hasher = PBKDF2PasswordHasher()
    return hasher.encode(plaintext, hasher.salt(), iterations=1000)


def log_in(page, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_selector("#reach-dashboard")


def test_an_operator_runs_the_platform_from_the_console(gateway, tmp_path):
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("REACH_SCREENSHOTS_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    endpoint = f"http://127.0.0.1:{gateway.agent_port}/"
    agent_register(tenant=gateway.tenant, spec=AgentSpec(
        name="observed", endpoint=endpoint, description="Fails on purpose.", capabilities=(
            CapabilitySpec(capability_id="observed.fail", path="/fail"),)))
    # Another tenant, its own agent and calls, and a staff user of it.
    other = factories.tenant(slug="other-co", name="Other Co")
    agent_register(tenant=other, spec=AgentSpec(
        name="others-echo", endpoint=endpoint, capabilities=(
            CapabilitySpec(capability_id="others.echo", path="/echo"),)))
    other_key = factories.api_key(tenant=other, scopes=["invoke"]).plaintext
    staff = factories.staff_user(tenant=other, username="other-staff")
    staff.password = server_password("other-pass-1")
    staff.save()
    from django.contrib.auth import get_user_model

    get_user_model().objects.create(username="operator", is_staff=True, is_superuser=True,
                                    password=server_password("op-pass-1"))

    mine: dict[str, str] = {}
    with gateway.client() as client:
        wait_for(lambda: client.get("/v1/route", params={"capability": "observed.fail"})
                 .status_code == 200, timeout=15, interval=0.05, message="the new agent")
        for i in range(6):
            rid = uuid.uuid4().hex
            capability = "observed.fail" if i == 2 else "echo.all"
            client.post("/v1/invoke", json={"capability": capability, "input": {"n": i}},
                        headers={"X-Request-ID": rid})
            mine[rid] = capability
    failed = next(rid for rid, capability in mine.items() if capability == "observed.fail")
    theirs = []
    with httpx.Client(base_url=gateway.base, timeout=10,
                      headers={"Authorization": f"Bearer {other_key}"}) as client:
        wait_for(lambda: client.get("/v1/route", params={"capability": "others.echo"})
                 .status_code == 200, timeout=15, interval=0.05, message="the other agent")
        for _ in range(3):
            rid = uuid.uuid4().hex
            assert client.post("/v1/invoke", json={"capability": "others.echo", "input": {}},
                               headers={"X-Request-ID": rid}).status_code == 200
            theirs.append(rid)
    store_usage(gateway.tenant, [*mine, *theirs])

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000},
                                    accept_downloads=True)
            base = gateway.base
            log_in(page, base, "operator", "op-pass-1")
            assert page.inner_text("#reach-calls-hour") == str(len(mine) + len(theirs))
            assert page.locator("svg[data-chart='Calls per minute, last hour'] rect.failed")\
                .count() == 60
            page.screenshot(path=str(shots / "dashboard.png"), full_page=True)

            # The failed call, by its request id.
            page.click("text=Open the call log")
            page.fill("#searchbar", failed)
            page.press("#searchbar", "Enter")
            rows = page.locator("#result_list tbody tr")
            rows.first.wait_for()
            assert rows.count() == 1
            assert "upstream_error" in rows.first.inner_text()
            assert failed in rows.first.inner_text()
            page.screenshot(path=str(shots / "call-log.png"), full_page=True)

            # The agent's page and its chart.
            page.goto(f"{base}/admin/registry/agent/?q=observed")
            page.click("text=success, latency, health")
            chart = page.locator("svg[data-chart='Calls per half hour, last day']")
            chart.wait_for()
            heights = [float(h) for h in chart.locator("rect.failed").evaluate_all(
                "rects => rects.map(r => r.getAttribute('height'))")]
            assert any(h > 0 for h in heights)  # the failed call is drawn
            page.screenshot(path=str(shots / "agent.png"), full_page=True)

            # The usage CSV, as finance downloads it.
            page.goto(f"{base}/admin/metering/usagedaily/report/")
            page.click("input[type=submit]")
            with page.expect_download() as download:
                page.click("text=Download CSV")
            csv = Path(download.value.path()).read_text()
            assert csv.splitlines()[0].startswith(("tenant,", "agent,", "capability,"))
            assert "observed" in csv

            # A tenant's staff: their calls only.
            staff_page = browser.new_context().new_page()
            log_in(staff_page, base, "other-staff", "other-pass-1")
            assert staff_page.inner_text("#reach-calls-hour") == str(len(theirs))
            staff_page.goto(f"{base}/admin/metering/usageevent/")
            listed = staff_page.inner_text("#result_list")
            assert all(rid in listed for rid in theirs)
            assert not any(rid in listed for rid in mine)
            staff_page.goto(f"{base}/admin/metering/usageevent/?q={failed}")
            assert staff_page.locator("#result_list tbody tr").count() == 0
        finally:
            browser.close()
