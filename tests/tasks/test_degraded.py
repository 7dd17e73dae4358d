"""Tasks when the database goes away: 503 with Retry-After for every task door, never a 500,
and the same requests succeed once it is back. Synchronous calls are not touched."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import gateway  # noqa: F401  (the fixture)
from tests.support.waiting import wait_for
from tests.tasks.conftest import needs_services

pytestmark = needs_services


@pytest.mark.gateway_via_forwarders
def test_task_doors_answer_503_while_the_database_is_away_and_recover(gateway):  # noqa: F811
    submit = {"capability": "echo.all", "input": {"x": 1}, "mode": "async"}
    with gateway.client() as client:
        first = client.post("/v1/invoke", json=submit)
        assert first.status_code == 202, first.text
        task_id = first.json()["task_id"]
        with gateway.postgres.outage():
            away = [client.post("/v1/invoke", json=submit),
                    client.get(f"/v1/tasks/{task_id}"), client.get("/v1/tasks"),
                    client.post(f"/v1/tasks/{task_id}/cancel")]
            sync = client.post("/v1/invoke", json={"capability": "echo.all", "input": {}})
        wait_for(lambda: client.post("/v1/invoke", json=submit).status_code == 202,
                 timeout=20, message="submissions to succeed again")
        back = client.get(f"/v1/tasks/{task_id}")

    for reply in away:
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["code"] == "service_unavailable"
        assert int(reply.headers["retry-after"]) >= 1
    assert sync.status_code == 200  # the data plane routes from its table meanwhile
    assert back.status_code == 200 and back.json()["id"] == task_id
