"""Asynchronous tasks through a real gateway and a real Celery worker's task engine."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import orjson

from metering.models import UsageEvent
from tests.support.inprocess import stop_process
from tests.support.waiting import wait_for
from tests.tasks.conftest import needs_services, start_helper

pytestmark = needs_services


def test_an_async_call_is_a_task_committed_before_202_and_run_by_a_worker(platform):
    with platform.client() as client:
        reply = platform.submit(client, "work.do", {"ms": 50, "x": 1},
                                headers={"X-Request-ID": "req-task-one"})
        assert reply.status_code == 202, reply.text
        body = reply.json()
        assert reply.headers["location"] == f"/v1/tasks/{body['task_id']}"
        assert body["state"] in ("submitted", "working", "completed")
        # Committed before the answer: readable at once.
        assert platform.task(client, body["task_id"])["request_id"] == "req-task-one"

        task = platform.wait_state(client, body["task_id"], "completed")
        events = client.get(f"/v1/tasks/{body['task_id']}/events", timeout=10)

    assert task["result"]["output"]["done"] == {"ms": 50, "x": 1}
    assert task["agent"] == "task-agent" and task["capability"] == "work.do"
    assert [h["state"] for h in task["history"]] == ["submitted", "working", "completed"]
    assert events.headers["content-type"].startswith("text/event-stream")
    streamed = [orjson.loads(line[6:]) for line in events.text.splitlines()
                if line.startswith("data: ")]
    assert [e["state"] for e in streamed] == ["submitted", "working", "completed"]
    seen = [s for s in platform.seen(0) + platform.seen(1) if s["path"] == "/work"]
    assert len(seen) == 1
    assert seen[0]["task"] == task["id"] and seen[0]["request_id"] == "req-task-one"
    assert seen[0]["idempotency_key"] == task["idempotency_key"]
    # One usage event for the attempt, with its outcome; none for the submission.
    wait_for(lambda: UsageEvent.objects.filter(request_id="req-task-one").exists(),
             timeout=20, message="the attempt's usage event to be stored")
    rows = list(UsageEvent.objects.filter(request_id="req-task-one"))
    assert [r.outcome for r in rows] == ["success"]


def test_a_canceled_task_stops_its_running_attempt(platform):
    """Canceling a task whose attempt is at its agent stops that attempt: the agent's
    connection is dropped (its work stops) within a renewal (a third of the lease, 1 s
    here) and the attempt is metered client_cancelled, never success; the task stays
    canceled. Before, the attempt ran to its end and was billed as a success."""
    with platform.client() as client:
        task_id = platform.submit(client, "work.do", {"ms": 60_000},
                                  headers={"X-Request-ID": "req-task-stop"}).json()["task_id"]
        wait_for(lambda: any(s["task"] == task_id for s in platform.seen(0) + platform.seen(1)
                             if s["path"] == "/work"),
                 timeout=20, message="the attempt to reach the agent")
        canceled = client.post(f"/v1/tasks/{task_id}/cancel")
        wait_for(lambda: any(s["path"] == "gone" and s["task"] == task_id
                             for s in platform.seen(0) + platform.seen(1)),
                 timeout=20, message="the agent to see its call dropped")
        wait_for(lambda: UsageEvent.objects.filter(request_id="req-task-stop").exists(),
                 timeout=20, message="the attempt's usage event to be stored")
        task = platform.task(client, task_id)

    assert canceled.status_code == 200 and canceled.json()["state"] == "canceled"
    assert task["state"] == "canceled"
    assert [r.outcome for r in UsageEvent.objects.filter(request_id="req-task-stop")] == [
        "client_cancelled"]


def test_a_result_too_deep_to_write_again_fails_its_task_and_spoils_no_listing(platform):
    """Stored, it would make every read of the task, and of the tenant's task list, a
    500 (break test): the task fails as the agent's bad response instead."""
    with platform.client() as client:
        reply = platform.submit(client, "deep.reply", {})
        assert reply.status_code == 202, reply.text
        task = platform.wait_state(client, reply.json()["task_id"], "failed")
        assert task["error"]["code"] == "upstream_bad_response", task
        listed = client.get("/v1/tasks")
        assert listed.status_code == 200, listed.text


def test_an_agent_asking_for_input_is_continued_on_the_same_instance(platform):
    with platform.client() as client:
        asked = []
        for n in range(4):  # two instances, balanced: the same one each time is no accident
            task_id = platform.submit(client, "ask.language", {"text": f"hi {n}"}
                                      ).json()["task_id"]
            waiting = platform.wait_state(client, task_id, "input-required")
            assert waiting["message"] == "Which language?"
            asked.append((task_id, waiting["result"]["instance"]))
        for task_id, _ in asked:
            reply = client.post(f"/v1/tasks/{task_id}/messages",
                                json={"input": {"language": "fr"}})
            assert reply.status_code == 200, reply.text
        done = [platform.wait_state(client, task_id, "completed") for task_id, _ in asked]
        again = client.post(f"/v1/tasks/{asked[0][0]}/messages",
                            json={"input": {"language": "de"}})

    instances = {i for _, i in asked}
    assert len(instances) == 2, "the balancer should have used both instances"
    for (_, instance), task in zip(asked, done, strict=True):
        assert task["result"]["instance"] == instance
        assert task["result"]["output"]["language"] == "fr"
        assert task["result"]["output"]["translated"].startswith("hi ")
        assert [h["state"] for h in task["history"]] == [
            "submitted", "working", "input-required", "submitted", "working", "completed"]
    continued = [s for s in platform.seen(0) + platform.seen(1)
                 if s["path"] == "/ask" and s["body"].get("language")]
    assert {s["idempotency_key"].rsplit("/", 1)[1] for s in continued} == {"1"}
    assert again.status_code == 409  # a completed task takes no more messages
    assert again.json()["error"]["code"] == "conflict"


def test_an_a2a_agent_asking_for_input_is_continued_in_its_own_task(platform):
    with platform.client() as client:
        task_id = platform.submit(client, "a2a.translate", {"text": "hello"}).json()["task_id"]
        platform.wait_state(client, task_id, "input-required")
        client.post(f"/v1/tasks/{task_id}/messages", json={"input": {"language": "de"}})
        task = platform.wait_state(client, task_id, "completed")

    assert task["result"]["reply_content"] == "translated into de"
    first, second = [s for s in platform.seen(0) if s["path"] == "/a2a"][-2:]
    asked_task = second["body"]["params"]["message"]["taskId"]
    assert asked_task and "taskId" not in first["body"]["params"]["message"]
    assert second["body"]["params"]["message"]["contextId"]


def test_an_a2a_agent_that_takes_the_work_pushes_its_result(platform):
    with platform.client() as client:
        task_id = platform.submit(client, "a2a.translate", {"text": "push"}).json()["task_id"]
        task = platform.wait_state(client, task_id, "completed")
        forged = client.post(f"/api/v1/tasks/{task_id}/a2a-push", json={
            "kind": "task", "status": {"state": "failed"}},
            headers={"X-A2A-Notification-Token": "not-the-token"})

    assert task["message"] == "pushed result"
    assert [h["state"] for h in task["history"]] == ["submitted", "working", "working",
                                                     "completed"]
    pushed = [s for s in platform.seen(0) if s["path"] == "push"]
    assert [p["status"] for p in pushed] == [200]
    assert forged.status_code == 404


def test_a_long_running_agent_reports_its_task_through_the_status_api(platform):
    url, _, _ = platform.receiver()
    with platform.client() as client:
        task_id = platform.submit(client, "accept.later", {"doc": "big"},
                                  callback_url=url).json()["task_id"]
        # Claimed (working, attempt 1), then handed to the agent (working, the agent's).
        wait_for(lambda: len(platform.task(client, task_id)["history"]) >= 3, timeout=10)
        held = platform.task(client, task_id)
        path = f"/api/v1/tasks/{task_id}/status"
        as_manager = client.post(path, json={"state": "completed"},
                                 headers={"Authorization": f"Bearer {platform.manage_key}"})
        agent = {"Authorization": f"Bearer {platform.agent_token}"}
        as_agent = client.get(f"/api/v1/tasks/{task_id}/", headers=agent)
        progress = client.post(path, json={"state": "working", "progress": 0.5,
                                           "message": "half way"}, headers=agent)
        done = client.post(path, json={"state": "completed", "output": {"pages": 3}},
                           headers=agent)
        late = client.post(path, json={"state": "failed"}, headers=agent)
        bad = client.post(path, json={"state": "done"}, headers=agent)
        task = platform.wait_state(client, task_id, "completed")
        wait_for(lambda: task_deliveries(platform, client, task_id) == ["delivered"],
                 timeout=20, message="the callback to be delivered")

    assert held["agent"] == "task-agent"
    # The agent reads the task it holds, not the caller's callback (it may be another
    # tenant's public agent).
    assert as_agent.status_code == 200 and as_agent.json()["id"] == task_id
    assert "callback" not in as_agent.json() and "callback" not in progress.json()
    assert as_manager.status_code == 403
    assert progress.status_code == 200 and progress.json()["progress"] == 0.5
    assert done.status_code == 200
    assert late.status_code == 409 and bad.status_code == 400
    assert task["result"]["output"] == {"pages": 3}
    assert "half way" in [h.get("message") for h in task["history"]]


def task_deliveries(platform, client, task_id: str) -> list[str]:
    return [d["status"] for d in platform.task(client, task_id)["callback"]["deliveries"]]


def test_a_receiver_down_for_three_attempts_gets_the_result_once_it_is_back(platform):
    from tests.support.servers import free_port

    port = free_port()  # nothing listens there yet
    url = f"http://127.0.0.1:{port}/hook"
    with platform.client() as client:
        task_id = platform.submit(client, "work.do", {"x": 2}, callback_url=url).json()[
            "task_id"]
        platform.wait_state(client, task_id, "completed")

        def attempts() -> int:
            deliveries = platform.task(client, task_id)["callback"]["deliveries"]
            return deliveries[0]["attempts"] if deliveries else 0

        wait_for(lambda: attempts() >= 3, timeout=30, message="three failed attempts")
        receiver = start_helper("tests.agents.receiver", str(port), platform.base,
                                platform.key, env=_receiver_env(platform))
        platform.extra.append(receiver)
        wait_for(lambda: task_deliveries(platform, client, task_id) == ["delivered"],
                 timeout=30, message="delivery once the receiver is back")
        delivery = platform.task(client, task_id)["callback"]["deliveries"][0]
        seen = httpx.get(f"http://127.0.0.1:{port}/_seen").json()

    assert delivery["attempts"] >= 4
    assert len(seen) == 1  # acknowledged once
    assert seen[0]["delivery"] == delivery["id"] and seen[0]["task"] == task_id
    assert seen[0]["signature_ok"] and seen[0]["readable"]


def _receiver_env(platform) -> dict:
    from tests.support.servers import platform_env

    return {**platform_env(platform.tmp), "SIGNING_SECRET": platform.secret}


def test_a_receiver_that_always_fails_sees_six_attempts_then_a_retrigger_delivers(platform):
    url, failing, port = platform.receiver(fail=True)
    with platform.client() as client:
        task_id = platform.submit(client, "work.do", {"x": 3}, callback_url=url).json()[
            "task_id"]
        wait_for(lambda: task_deliveries(platform, client, task_id) == ["exhausted"],
                 timeout=60, message="the delivery to run out of retries")
        tried = httpx.get(f"http://127.0.0.1:{port}/_seen").json()
        shown = _admin_task_list(platform)
        stop_process(failing)
        healthy = start_helper("tests.agents.receiver", str(port), platform.base, platform.key,
                               env=_receiver_env(platform))
        platform.extra.append(healthy)
        again = client.post(f"/api/v1/tasks/{task_id}/redeliver",
                            headers={"Authorization": f"Bearer {platform.manage_key}"})
        wait_for(lambda: task_deliveries(platform, client, task_id) == ["delivered"],
                 timeout=20, message="the re-triggered delivery")
        seen = httpx.get(f"http://127.0.0.1:{port}/_seen").json()

    assert len(tried) == 6  # the first attempt and five retries
    assert len({t["delivery"] for t in tried}) == 1
    assert all(t["signature_ok"] and t["readable"] for t in tried)
    assert "undelivered" in shown
    assert again.status_code == 200, again.text
    assert len(seen) == 1 and seen[0]["delivery"] == tried[0]["delivery"]


def _admin_task_list(platform) -> str:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("ops", "ops@example.com", "pw-ops-123")
    browser = Client()
    browser.force_login(user)
    page = browser.get("/admin/tasks/task/?deliveries__status__exact=exhausted")
    assert page.status_code == 200
    return page.content.decode()


def test_callback_urls_are_refused_at_submission_and_again_at_delivery(platform):
    gateway_port = platform.base.rsplit(":", 1)[1]
    refused = {}
    with platform.client() as client:
        for url in ("http://169.254.169.254/latest/meta-data", f"http://127.0.0.1:{gateway_port}/x",
                    f"http://localhost:{gateway_port}/x", "http://[fd00:ec2::254]/",
                    "ftp://127.0.0.1/x", "not a url"):
            reply = platform.submit(client, "work.do", {}, callback_url=url)
            refused[url] = (reply.status_code, reply.json()["error"])
        # Allowed now; refused by the policy of the worker that delivers it.
        url, _, port = platform.receiver()
        platform.restart_worker(REACH_OWN_PORTS=f"{gateway_port},{port}")
        task_id = platform.submit(client, "work.do", {}, callback_url=url).json()["task_id"]

        def refused_at_delivery() -> bool:
            deliveries = platform.task(client, task_id).get("callback", {}).get(
                "deliveries", [])
            return bool(deliveries) and "endpoint policy" in (deliveries[0]["last_error"] or "")

        wait_for(refused_at_delivery, timeout=30, message="the delivery to be refused")
        seen = httpx.get(f"http://127.0.0.1:{port}/_seen").json()

    for url, (status, error) in refused.items():
        assert status == 400, url
        assert error["code"] == "invalid_input" and "callback_url" in error["details"], url
    assert seen == []


def test_idempotent_submissions_make_one_task(platform):
    headers = {"Idempotency-Key": "order-42"}
    with platform.client() as client:
        def submit(_):
            with platform.client() as own:  # one client per thread, as callers have
                return platform.submit(own, "work.do", {"x": 42}, headers=headers)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(submit, range(8)))
        reused = platform.submit(client, "work.do", {"x": 43}, headers=headers)
        task_id = replies[0].json()["task_id"]
        task = platform.wait_state(client, task_id, "completed")
    assert {r.status_code for r in replies} == {202}
    assert {r.json()["task_id"] for r in replies} == {task_id}
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in replies) == 7
    assert reused.status_code == 422
    assert reused.json()["error"]["code"] == "idempotency_key_reused"
    assert task["idempotency_key"] == "order-42" and task["attempts"] == 1
    calls = [s for s in platform.seen(0) + platform.seen(1) if s["path"] == "/work"
             and s["body"].get("x") == 42]
    assert len(calls) == 1 and calls[0]["idempotency_key"] == "order-42"


def test_tasks_are_the_tenants_own_and_bad_requests_are_clear(platform):
    from tenants.choices import ApiKeyScope
    from tests import factories

    other = factories.api_key(tenant=factories.tenant(),
                              scopes=[ApiKeyScope.INVOKE]).plaintext
    with platform.client() as client, platform.client(other) as stranger:
        task_id = platform.submit(client, "accept.later", {}).json()["task_id"]
        platform.wait_state(client, task_id, "working")
        foreign = [stranger.get(f"/v1/tasks/{task_id}"),
                   stranger.get(f"/v1/tasks/{task_id}/events"),
                   stranger.post(f"/v1/tasks/{task_id}/cancel"),
                   stranger.post(f"/v1/tasks/{task_id}/messages", json={"input": {}})]
        listed = stranger.get("/v1/tasks").json()
        not_waiting = client.post(f"/v1/tasks/{task_id}/messages", json={"input": {"a": 1}})
        canceled = client.post(f"/v1/tasks/{task_id}/cancel")
        twice = client.post(f"/v1/tasks/{task_id}/cancel")
        mine = client.get("/v1/tasks", params={"state": "canceled"}).json()
        bad = {
            "mode": client.post("/v1/invoke", json={"capability": "work.do", "input": {},
                                                    "mode": "later"}),
            "stream": platform.submit(client, "work.do", {}, stream=True),
            "secret": platform.submit(client, "work.do", {}, callback_url="http://127.0.0.1:9/",
                                      callback_secret="nope"),
            "secret alone": platform.submit(client, "work.do", {}, callback_secret="default"),
            "nul": platform.submit(client, "work.do", {"text": "a\x00b"}),
            "capability": platform.submit(client, "no.such", {}),
            "sync callback": client.post("/v1/invoke", json={
                "capability": "work.do", "input": {}, "callback_url": "http://127.0.0.1:9/"}),
            "state filter": client.get("/v1/tasks", params={"state": "done"}),
            # Not ignored, and not the last one winning (a break test: both were).
            "unknown filter": client.get("/v1/tasks", params={"sate": "completed"}),
            "state twice": client.get("/v1/tasks", params={"state": ["completed", "failed"]}),
            "API state filter": client.get("/api/v1/tasks/", params={"state": "done"},
                                           headers={"Authorization":
                                                    f"Bearer {platform.manage_key}"}),
            "limit": client.get("/v1/tasks", params={"limit": "0"}),
        }
        missing = [client.get("/v1/tasks/00000000-0000-0000-0000-000000000000"),
                   client.get("/v1/tasks/not-a-uuid"),
                   client.get("/v1/tasks/not-a-uuid/events")]
        wrong_method = client.delete(f"/v1/tasks/{task_id}")

    assert [r.status_code for r in foreign] == [404, 404, 404, 404]
    assert listed["count"] == 0
    assert not_waiting.status_code == 409
    assert canceled.status_code == 200 and canceled.json()["state"] == "canceled"
    assert twice.status_code == 409
    assert [t["id"] for t in mine["results"]] == [task_id]
    for name, reply in bad.items():
        expected = 404 if name == "capability" else 400
        assert reply.status_code == expected, (name, reply.text)
        assert reply.json()["error"]["code"] in ("invalid_input", "no_capability",
                                                 "validation_error"), name
    assert "Task" not in bad["state filter"].json()["error"]["message"]  # no enum reprs
    assert [r.status_code for r in missing] == [404, 404, 404]
    assert wrong_method.status_code == 405


def test_three_hundred_tasks_survive_the_worker_killed_twice(platform):
    """300 tasks on a 5 s agent; the worker is SIGKILLed 2 s and 8 s into the work (while
    it holds tasks) and restarted: every task reaches a final state, none is lost or left
    working, and a task run again reached the agent with the same Idempotency-Key."""
    from tasks.models import Task

    def running(min_attempts: int = 1) -> int:
        return Task.objects.filter(state="working", attempts__gte=min_attempts).exclude(
            claim="").count()

    def submit(n: int) -> str:
        with platform.client() as client:
            reply = platform.submit(client, "work.do", {"ms": 5000, "n": n})
            assert reply.status_code == 202, reply.text
            return reply.json()["task_id"]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        ids = list(pool.map(submit, range(300)))
    wait_for(lambda: running() >= 10, timeout=60, message="the worker to run tasks")
    began = time.monotonic()
    time.sleep(2)
    killed_holding = [running()]
    platform.restart_worker(kill=True)
    # The new worker runs the lost tasks again once their leases lapse (3 s here).
    wait_for(lambda: running(2) >= 1, timeout=60, message="the lost tasks to run again")
    time.sleep(max(0.0, 8 - (time.monotonic() - began)))
    killed_holding.append(running())
    platform.restart_worker(kill=True)

    with platform.client() as client:
        def all_final() -> bool:
            page = client.get("/v1/tasks", params={"limit": "1000"}).json()["results"]
            states = [t["state"] for t in page if t["id"] in set(ids)]
            return len(states) == 300 and all(
                s in ("completed", "failed", "canceled", "rejected") for s in states)

        wait_for(all_final, timeout=300, interval=1.0, message="all 300 tasks to finish")
        page = client.get("/v1/tasks", params={"limit": "1000"}).json()["results"]
    mine = [t for t in page if t["id"] in set(ids)]
    states = {t["state"] for t in mine}
    attempts = [t["attempts"] for t in mine]
    print(f"300 tasks, worker killed twice holding {killed_holding} tasks: final "
          f"{time.monotonic() - began:.0f} s after the first kill's anchor; states "
          f"{sorted(states)}; tasks run more than once: {sum(a > 1 for a in attempts)}")
    assert len(mine) == 300 and states == {"completed"}
    assert all(n > 0 for n in killed_holding)  # each kill took tasks down with it
    assert max(attempts) >= 2
    calls = [s for s in platform.seen(0) + platform.seen(1) if s["path"] == "/work"]
    by_task: dict[str, set] = {}
    for call in calls:
        by_task.setdefault(call["task"], set()).add(call["idempotency_key"])
    # A task run again after a crash is the same call: the same Idempotency-Key.
    assert all(len(keys) == 1 for keys in by_task.values())
    assert set(by_task) == set(ids)


def readme_verifier():
    """The README's signature-verification example, run as written."""
    from tests.support.servers import ROOT

    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- verify-callback -->", 1)[1].split("```python\n", 1)[1]
    namespace: dict = {}
    exec(compile(block.split("```", 1)[0], "README.md", "exec"), namespace)  # noqa: S102
    return namespace["verify"]


def test_the_readmes_verification_example_verifies_a_real_delivery(platform):
    url, _, port = platform.receiver()
    with platform.client() as client:
        task_id = platform.submit(client, "work.do", {"x": 7}, callback_url=url).json()[
            "task_id"]
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/_seen").json(), timeout=30,
                 message="the delivery")
    (delivery,) = httpx.get(f"http://127.0.0.1:{port}/_seen").json()
    verify = readme_verifier()
    body = delivery["body"].encode()

    assert delivery["task"] == task_id
    assert verify(platform.secret, delivery["headers"], body) is True
    assert verify(platform.secret, delivery["headers"], body.replace(b"7", b"8")) is False
    assert verify("whsec_wrong", delivery["headers"], body) is False
    stale = {**delivery["headers"],
             "X-Reach-Timestamp": str(int(delivery["headers"]["X-Reach-Timestamp"]) - 3600)}
    assert verify(platform.secret, stale, body) is False


def test_one_key_is_one_request_whether_sent_as_a_task_or_a_call(platform):
    """An Idempotency-Key used for a submission may not run again as a call with another
    body, nor the reverse: the agent would see two requests under one key."""
    with platform.client() as client:
        submitted = platform.submit(client, "work.do", {"x": 7},
                                    headers={"Idempotency-Key": "both-ways-1"})
        as_call = client.post("/v1/invoke", json={"capability": "work.do", "input": {"x": 8}},
                              headers={"Idempotency-Key": "both-ways-1"})
        called = client.post("/v1/invoke", json={"capability": "work.do", "input": {"x": 9}},
                             headers={"Idempotency-Key": "both-ways-2"})
        as_task = platform.submit(client, "work.do", {"x": 10},
                                  headers={"Idempotency-Key": "both-ways-2"})
        as_stream = client.post("/v1/invoke", json={"capability": "work.do", "stream": True,
                                                     "input": {"x": 11}},
                                headers={"Idempotency-Key": "both-ways-1"})
        platform.wait_state(client, submitted.json()["task_id"], "completed")
    assert (submitted.status_code, called.status_code) == (202, 200), called.text
    for refused in (as_call, as_task, as_stream):
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "idempotency_key_reused"
    bodies = [s["body"].get("x") for s in platform.seen(0) + platform.seen(1)
              if s["path"] == "/work"]
    assert sorted(bodies) == [7, 9]
