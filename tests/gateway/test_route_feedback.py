"""POST /v1/route/feedback on a real gateway: strict validation with structured errors,
202 without touching the database, and the event shipped through Redis (surviving an
outage) to the control plane, which learns a phrase for the caller's tenant only."""

from __future__ import annotations

import httpx
import pytest
import redis
from django.conf import settings

from registry.learning import route_feedback_consume, route_feedback_learn
from registry.models import LearnedPhrase, RouteFeedback
from registry.services import agent_register
from registry.snapshot import build_table, current_version
from registry.spec import AgentSpec, CapabilitySpec
from tenants.choices import ApiKeyScope
from tests import factories
from tests.gateway.conftest import wait_for_table
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(
    not settings.REDIS_URL, reason="the gateway ships feedback through Redis (.ci/run sets it)")

FEEDBACK = "/v1/route/feedback"


def post(gateway, body, **kw) -> httpx.Response:
    with gateway.client() as client:
        return client.post(FEEDBACK, json=body, **kw)


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and isinstance(error["retryable"], bool)
    assert error["request_id"] == response.headers["x-request-id"]
    return error


# (body, the fields its 400 names): one gateway for all (each costs seconds to start).
BAD_BODIES = [
    ([], None),
    ({}, {"intent", "capability"}),
    ({"intent": "numbers for the board"}, {"capability"}),
    ({"capability": "echo.all"}, {"intent"}),
    ({"intent": "   ", "capability": "echo.all"}, {"intent"}),
    ({"intent": 42, "capability": "echo.all"}, {"intent"}),
    ({"intent": "x" * 1001, "capability": "echo.all"}, {"intent"}),
    ({"intent": "nul\x00", "capability": "echo.all"}, {"intent"}),
    ({"intent": "numbers", "capability": "nobody.offers.this"}, {"capability"}),
    ({"intent": "numbers", "capability": ["echo.all"]}, {"capability"}),
    ({"intent": "numbers", "capability": "echo.all", "routed_to": 7}, {"routed_to"}),
    ({"intent": "numbers", "capability": "echo.all", "because": "x"}, {"because"}),
]


def test_bad_feedback_gets_a_structured_400_naming_each_field(gateway):
    for body, fields in BAD_BODIES:
        error = assert_error(post(gateway, body), 400, "invalid_input")
        if fields is not None:
            assert set(error["details"]) == fields, body
    # Each problem is named as it is (helper-43: a NUL was "must be 1 to 1000 characters").
    nul = assert_error(post(gateway, {"intent": "nul\x00", "capability": "echo.all"}), 400,
                       "invalid_input")
    assert nul["details"] == {"intent": ["holds a control character (a NUL, an escape...)"]}
    escape = assert_error(post(gateway, {"intent": "numbers \x1b[8m", "capability": "echo.all",
                                         "routed_to": "echo\x07"}), 400, "invalid_input")
    assert set(escape["details"]) == {"intent", "routed_to"}
    # A wrong type is named as one (helper-51: a list was "is required").
    typed = assert_error(post(gateway, {"intent": ["list"], "capability": 5}), 400,
                         "invalid_input")
    assert typed["details"] == {"intent": ["must be a string, not an array"],
                                "capability": ["must be a string, not a number"]}
    # Nothing of them was shipped: a good one sent after is the only row that arrives.
    assert post(gateway, {"intent": "sentinel", "capability": "echo.all"}).status_code == 202
    assert [row.intent for row in arrived(gateway)] == ["sentinel"]


def arrived(gateway) -> list[RouteFeedback]:
    """The tenant's feedback rows, once some have come through the stream."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    mine = RouteFeedback.objects.filter(tenant=gateway.tenant)
    wait_for(lambda: route_feedback_consume(client=client, consumer="test") >= 0
             and mine.exists(), timeout=20, message="feedback to reach the database")
    return list(mine)


def test_malformed_json_content_type_method_and_keys_are_refused(gateway):
    with gateway.client() as client:
        assert_error(client.post(FEEDBACK, content=b'{"intent": ',
                                 headers={"content-type": "application/json"}),
                     400, "malformed_json")
        assert_error(client.post(FEEDBACK, content=b'{"intent": "a", "intent": "b"}',
                                 headers={"content-type": "application/json"}),
                     400, "malformed_json")
        assert_error(client.post(FEEDBACK, content=b"intent=a",
                                 headers={"content-type": "text/plain"}),
                     415, "unsupported_media_type")
        assert_error(client.get(FEEDBACK), 405, "method_not_allowed")
        assert_error(client.post(FEEDBACK, content=b"x" * 20_000,
                                 headers={"content-type": "application/json"}),
                     413, "payload_too_large")
    body = {"intent": "numbers", "capability": "echo.all"}
    assert_error(httpx.post(gateway.base + FEEDBACK, json=body), 401, "unauthorized")
    read_only = factories.api_key(tenant=gateway.tenant, scopes=[ApiKeyScope.READ]).plaintext
    wait_for_table([gateway.base], current_version())
    assert_error(httpx.post(gateway.base + FEEDBACK, json=body,
                            headers={"Authorization": f"Bearer {read_only}"}),
                 403, "forbidden")


def test_another_tenants_private_capability_is_refused_like_a_missing_one(gateway):
    agent_register(tenant=factories.tenant(), spec=AgentSpec(
        name="private", endpoint="http://127.0.0.1:9504/",
        capabilities=(CapabilitySpec(capability_id="secret.thing"),)))
    wait_for_table([gateway.base], current_version())
    theirs = assert_error(post(gateway, {"intent": "ledger", "capability": "secret.thing"}),
                          400, "invalid_input")
    missing = assert_error(post(gateway, {"intent": "ledger", "capability": "no.such"}),
                           400, "invalid_input")
    assert theirs["message"] == missing["message"]
    assert theirs["details"] == missing["details"]


@pytest.mark.gateway_via_forwarders
def test_feedback_is_accepted_through_a_redis_outage_and_learned_for_its_tenant(gateway):
    """202 at once, whatever Redis does; the event waits in the gateway and reaches the
    control plane once Redis is back; the periodic fold makes a routable phrase of it,
    in the caller's tenant's part of the route table only."""
    other = factories.tenant()
    body = {"intent": "Quarterly numbers for the board!", "capability": "echo.all",
            "routed_to": "summarize.text"}
    with gateway.redis.outage():
        response = post(gateway, body)
    assert response.status_code == 202, response.text
    assert response.json() == {"accepted": True}

    [row] = arrived(gateway)
    assert (row.intent, row.capability_id, row.routed_to, row.source) == (
        body["intent"], "echo.all", "summarize.text", "explicit")
    assert row.request_id == response.headers["x-request-id"]

    assert route_feedback_learn()["published"] == 1
    table = build_table()
    [entry] = table.learned_by_tenant[gateway.tenant.pk]
    assert (entry.capability_id, entry.phrase) == ("echo.all", "quarterly numbers for the board")
    assert other.pk not in table.learned_by_tenant
    assert LearnedPhrase.objects.get().routable
    wait_for_table([gateway.base], table.version)
