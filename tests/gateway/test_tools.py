"""The tool gateway through a real gateway process: the external service (a loopback
HTTP server) receives the gateway's credential, never the caller's; the tool's quota
holds across callers; a failing service opens the tool's breaker; every call leaves one
audit row without argument values; the OpenAI export; secrets never leak."""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote

import httpx
import pytest
from django.conf import settings

from registry.models import Agent
from tests.support.loopback import LoopbackService
from tests.support.waiting import wait_for
from tools.models import Tool, ToolGrant
from tools.services import tool_save

pytestmark = pytest.mark.skipif(
    not (settings.DATABASES["default"]["ENGINE"].endswith("postgresql") and settings.REDIS_URL),
    reason="audit rows come through the Redis stream (.ci/run sets PostgreSQL and Redis)",
)

SECRET = "inventory-secret-" + uuid.uuid4().hex  # the external system's, held by the gateway


class Inventory(LoopbackService):
    """A stand-in external API: GET /stock/<sku> answers when the gateway's key is sent;
    ``failing`` makes it answer 500."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.failing = False
        super().__init__(self._answer)

    def _answer(self, request, body: bytes) -> tuple[int, str, bytes]:
        self.seen.append({"path": request.path, "headers": {
            k.lower(): v for k, v in request.headers.items()}})
        if self.failing:
            status, answer = 500, {"error": "down"}
        elif request.headers.get("X-Api-Key") != SECRET:
            status, answer = 401, {"error": "bad key"}
        else:
            status, answer = 200, {"sku": request.path.split("/stock/")[1].split("?")[0],
                                   "in_stock": 7}
        return status, "application/json", json.dumps(answer).encode()


@pytest.fixture
def inventory():
    found = Inventory()
    yield found
    found.close()


def stock_tool(tenant, url: str, **kw) -> Tool:
    fields = {
        "name": "stock-lookup", "description": "Current stock of one article.",
        "when_to_use": "Someone asks whether an article is available.",
        "when_not_to_use": "Prices or delivery dates.",
        "input_schema": {"type": "object", "required": ["sku"],
                         "additionalProperties": False, "properties": {
                             "sku": {"type": "string", "pattern": "^[A-Z]-[0-9]+$"}}},
        "examples": [{"arguments": {"sku": "A-100"}, "use": "stock of article A-100"}],
        "url_template": url + "/stock/{sku}", "method": "GET", "auth_kind": "header",
        "auth_field_name": "X-Api-Key", **kw}
    return tool_save(tool=Tool(owner_tenant=tenant, **fields), secret=SECRET)


def agent_token(gateway, name: str) -> str:
    from registry.tokens import agent_token_issue

    return agent_token_issue(agent=Agent.objects.get(name=name))


def tool_call(base: str, token: str, arguments: dict, name: str = "stock-lookup", **headers):
    return httpx.post(f"{base}/v1/tools/{name}/call", json={"arguments": arguments},
                      headers={"Authorization": f"Bearer {token}", **headers}, timeout=10)


def wait_for_tool(base: str, token: str, name: str = "stock-lookup") -> None:
    wait_for(lambda: any(t["name"] == name for t in httpx.get(
        f"{base}/v1/tools", headers={"Authorization": f"Bearer {token}"},
        timeout=5).json().get("tools", [])), timeout=15, interval=0.05,
        message=f"the gateway to know {name}")


@pytest.mark.django_db(transaction=True)
def test_an_agent_calls_a_tool_with_the_gateways_credential_and_is_audited(
        gateway, inventory):
    tool = stock_tool(gateway.tenant, inventory.url)
    token = agent_token(gateway, "scripted")
    wait_for_tool(gateway.base, token)
    reply = tool_call(gateway.base, token, {"sku": "A-100"},
                      **{"Authorization": f"Bearer {token}", "X-Api-Key": "agent-made-up"})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["ok"] and body["result"] == {"sku": "A-100", "in_stock": 7}
    # The service got the gateway's key, and nothing of the caller's credentials.
    seen = inventory.seen[-1]["headers"]
    assert seen["x-api-key"] == SECRET
    assert token not in json.dumps(inventory.seen) and "agent-made-up" not in json.dumps(
        inventory.seen)
    # Invalid arguments: 400 with the path, and nothing sent.
    sent = len(inventory.seen)
    bad = tool_call(gateway.base, token, {"sku": "lowercase"})
    assert bad.status_code == 400 and "sku" in bad.json()["error"]["details"]
    assert len(inventory.seen) == sent
    # The tenant's key may call it too; another tenant's may not even see it.
    assert tool_call(gateway.base, gateway.key, {"sku": "B-2"}).status_code == 200

    # One audit row per call (the usage event), the arguments' digest and no values.
    import redis as redis_sync

    from metering.ingest import usage_stream_consume
    from metering.models import UsageEvent

    rows = UsageEvent.objects.filter(tool=tool)
    client = redis_sync.Redis.from_url(settings.REDIS_URL)
    try:
        wait_for(lambda: (usage_stream_consume(client=client, consumer="tools-test",
                                               block_ms=100, max_batches=10),
                          rows.count() >= 3)[1], timeout=30, interval=0.1,
                 message="three audit rows")
    finally:
        client.close()
    assert rows.count() == 3
    outcomes = sorted(rows.values_list("outcome", flat=True))
    assert outcomes == ["invalid_input", "success", "success"]
    by_agent = rows.filter(caller_agent__name="scripted")
    assert by_agent.count() == 2 and rows.filter(caller_agent__isnull=True).count() == 1
    # The tool usage report: per tool and caller.
    from tests import factories
    from tests.conftest import key_client

    reader = key_client(factories.api_key(tenant=gateway.tenant).plaintext)
    report = reader.get("/api/v1/usage/tools/").json()["rows"]
    assert {(r["caller"], r["calls"], r["errors"]) for r in report
            if r["tool"] == "stock-lookup"} == {("scripted", 2, 1), ("(tenant key)", 1, 0)}
    for row in rows:
        assert len(row.argument_digest) == 64
        stored = json.dumps({f.name: str(getattr(row, f.name)) for f in row._meta.fields})
        assert "A-100" not in stored and "B-2" not in stored and SECRET not in stored


@pytest.mark.django_db(transaction=True)
@pytest.mark.gateway_env(REACH_BREAKER_MIN_VOLUME="3", REACH_BREAKER_FAILURE_RATIO="0.5",
                         REACH_BREAKER_COOLDOWN_S="1")
def test_a_failing_service_opens_the_tools_breaker_and_calls_fail_fast(gateway, inventory):
    stock_tool(gateway.tenant, inventory.url)
    token = agent_token(gateway, "scripted")
    wait_for_tool(gateway.base, token)
    inventory.failing = True
    codes = [tool_call(gateway.base, token, {"sku": "A-1"}).json()["error"]["code"]
             for _ in range(3)]
    assert codes == ["upstream_error"] * 3
    sent = len(inventory.seen)
    started = time.monotonic()
    refused = tool_call(gateway.base, token, {"sku": "A-1"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "circuit_open"
    assert refused.headers["retry-after"] and time.monotonic() - started < 1
    assert len(inventory.seen) == sent  # fast: the service was not asked
    inventory.failing = False

    def recovered() -> bool:
        return tool_call(gateway.base, token, {"sku": "A-1"}).status_code == 200

    wait_for(recovered, timeout=15, interval=0.2, message="the breaker to close again")
    # The agent's own routing is untouched by its tool's failures.
    with gateway.client() as client:
        route = client.get("/v1/route", params={"capability": "echo.all"}).json()
    assert route["chosen"] is not None or route["candidates"]


@pytest.mark.django_db(transaction=True)
def test_three_agents_share_the_tools_quota_and_each_has_its_own(gateway, inventory):
    # 600 a minute in total (10/s), 240 a minute per caller (4/s).
    stock_tool(gateway.tenant, inventory.url, calls_per_minute=600,
               caller_calls_per_minute=240)
    from tests import factories

    factories.agent(owner=gateway.tenant, name="third-caller")
    tokens = [agent_token(gateway, n) for n in ("scripted", "scripted-chat", "third-caller")]
    wait_for_tool(gateway.base, tokens[0])
    seconds = 4.0
    admitted: dict[int, int] = {0: 0, 1: 0, 2: 0}
    lock = threading.Lock()

    def hammer(index: int) -> None:
        with httpx.Client(base_url=gateway.base, timeout=10, headers={
                "Authorization": f"Bearer {tokens[index]}"}) as client:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                reply = client.post("/v1/tools/stock-lookup/call",
                                    json={"arguments": {"sku": "A-1"}})
                if reply.status_code == 200:
                    with lock:
                        admitted[index] += 1
                else:
                    assert reply.json()["error"]["code"] == "rate_limited"

    started = time.monotonic()
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(hammer, [0, 0, 1, 1, 2, 2]))
    elapsed = time.monotonic() - started
    # Each caller: its bucket (five seconds' worth: 20) plus 4/s; all three: the tool's 50
    # plus 10/s, less than the three callers' 3 x (20 + 4/s) could take.
    per_caller_cap = 20 + 4 * elapsed
    for count in admitted.values():
        assert count <= per_caller_cap * 1.05
    total_cap = 50 + 10 * elapsed
    assert sum(admitted.values()) <= total_cap * 1.05
    assert sum(admitted.values()) >= (50 + 10 * seconds) * 0.95


@pytest.mark.django_db(transaction=True)
def test_the_openai_export_and_who_may_see_a_tool(gateway, inventory):
    from tests import factories

    stock_tool(gateway.tenant, inventory.url)
    hidden = stock_tool(factories.tenant(), inventory.url, name="someone-elses")
    token = agent_token(gateway, "scripted")
    wait_for_tool(gateway.base, token)
    listed = httpx.get(f"{gateway.base}/v1/tools", params={"format": "openai"},
                       headers={"Authorization": f"Bearer {token}"}).json()["tools"]
    assert [t["function"]["name"] for t in listed] == ["stock-lookup"]
    # Valid as the OpenAI SDK types a chat request's tools, with a name OpenAI accepts and
    # parameters that are a JSON Schema.
    import re

    import pydantic
    from jsonschema import Draft202012Validator
    from openai.types.chat import ChatCompletionToolParam

    pydantic.TypeAdapter(list[ChatCompletionToolParam]).validate_python(listed)
    for tool in listed:
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", tool["function"]["name"])
        Draft202012Validator.check_schema(tool["function"]["parameters"])
    # The query is read as every door reads it: a repeat or bytes that are not UTF-8
    # are refused, not settled by the last value.
    for query in (b"format=openai&format=mcp", b"format=%ff"):
        refused = httpx.get(f"{gateway.base}/v1/tools?{query.decode()}",
                            headers={"Authorization": f"Bearer {token}"})
        assert refused.status_code == 400, (query, refused.text)
        assert refused.json()["error"]["code"] == "invalid_input"
    function = listed[0]["function"]
    assert listed[0]["type"] == "function"
    assert "Use it when" in function["description"] and "A-100" in function["description"]
    assert function["parameters"]["type"] == "object"
    assert function["parameters"]["required"] == ["sku"]
    assert tool_call(gateway.base, token, {"sku": "A-1"}, name="someone-elses")\
        .status_code == 404
    # A grant to the agent lets it call the other tenant's tool.
    ToolGrant.objects.create(tool=hidden, agent=Agent.objects.get(name="scripted"))
    wait_for_tool(gateway.base, token, name="someone-elses")
    assert tool_call(gateway.base, token, {"sku": "A-1"}, name="someone-elses")\
        .status_code == 200
    everything = json.dumps(listed) + httpx.get(
        f"{gateway.base}/v1/tools", headers={"Authorization": f"Bearer {token}"}).text
    assert SECRET not in everything


@pytest.mark.django_db(transaction=True)
def test_the_official_mcp_client_lists_and_calls_tools_and_agents(gateway, inventory):
    """The mcp SDK's Streamable HTTP client, against the gateway's /mcp with the agent's
    token: the tool, and (with ?agents=true) a capability of an agent, both called."""
    import asyncio

    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    stock_tool(gateway.tenant, inventory.url)
    token = agent_token(gateway, "scripted")
    wait_for_tool(gateway.base, token)

    async def session_run(url: str, steps):
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) \
                as http, streamable_http_client(url, http_client=http) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            return await steps(session)

    async def tools_only(session):
        listed = await session.list_tools()
        called = await session.call_tool("stock-lookup", {"sku": "C-3"})
        refused = await session.call_tool("stock-lookup", {"sku": "nope"})
        return listed, called, refused

    listed, called, refused = asyncio.run(session_run(f"{gateway.base}/mcp", tools_only))
    assert [t.name for t in listed.tools] == ["stock-lookup"]
    assert "Use it when" in listed.tools[0].description
    assert listed.tools[0].input_schema["required"] == ["sku"]
    assert not called.is_error
    assert json.loads(called.content[0].text) == {"sku": "C-3", "in_stock": 7}
    assert refused.is_error and "invalid_input" in refused.content[0].text
    assert inventory.seen[-1]["headers"]["x-api-key"] == SECRET

    async def with_agents(session):
        listed = await session.list_tools()
        called = await session.call_tool("agent__echo_all", {"text": "via mcp"})
        chatted = await session.call_tool("agent__chat_scripted", {"text": "hi chat"})
        return listed, called, chatted

    listed, called, chatted = asyncio.run(session_run(f"{gateway.base}/mcp?agents=true",
                                                      with_agents))
    names = {t.name for t in listed.tools}
    assert {"stock-lookup", "agent__echo_all"} <= names
    assert not called.is_error, called.content
    assert "via mcp" in called.content[0].text
    # A chat agent's answer is its reply: the text shown, not its empty output ("null").
    assert not chatted.is_error, chatted.content
    assert chatted.content[0].text == "ok: hi chat"


@pytest.mark.django_db(transaction=True)
def test_a_tools_secret_appears_in_no_response_page_log_or_error(
        gateway, inventory, tmp_path, client, caplog):
    """Registered through the API, used by the gateway, then looked for everywhere."""
    import logging

    from django.contrib.auth import get_user_model
    from django.urls import reverse

    from audit.models import AuditEntry
    from tests import factories
    from tests.conftest import key_client

    caplog.set_level(logging.DEBUG)
    manage = key_client(factories.api_key(tenant=gateway.tenant).plaintext)
    created = manage.post("/api/v1/tools/", {
        "name": "stock-lookup", "description": "Current stock of one article.",
        "input_schema": {"type": "object", "required": ["sku"],
                         "properties": {"sku": {"type": "string"}}},
        "url_template": inventory.url + "/stock/{sku}", "method": "GET",
        "auth_kind": "header", "auth_field_name": "X-Api-Key", "secret": SECRET},
        format="json")
    assert created.status_code == 201, created.content
    tool = Tool.objects.get(name="stock-lookup")
    ciphertext = bytes(tool.secret_ciphertext).decode()
    token = agent_token(gateway, "scripted")
    wait_for_tool(gateway.base, token)

    seen: list[str] = [created.content.decode()]
    seen.append(tool_call(gateway.base, token, {"sku": "A-1"}).text)
    inventory.failing = True
    seen.append(tool_call(gateway.base, token, {"sku": "A-1"}).text)  # a 502
    seen.append(tool_call(gateway.base, token, {"sku": 5}).text)  # a 400
    inventory.failing = False
    seen.append(httpx.get(f"{gateway.base}/v1/tools", params={"format": "openai"},
                          headers={"Authorization": f"Bearer {token}"}).text)
    seen.append(httpx.post(f"{gateway.base}/mcp", json={
        "jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Authorization": f"Bearer {token}"}).text)
    for url in ("/api/v1/tools/", "/api/v1/tools/stock-lookup/", "/api/v1/audit/",
                "/api/schema/"):
        reply = manage.get(url)
        assert reply.status_code == 200, url
        seen.append(reply.content.decode())
    detail = manage.get("/api/v1/tools/stock-lookup/").json()
    assert "secret" not in detail and detail["has_secret"] is True
    root = get_user_model().objects.create_superuser("root-tools", "r@localhost", "pw")
    client.force_login(root)
    for url in (reverse("admin:tools_tool_changelist"),
                reverse("admin:tools_tool_change", args=[tool.pk]),
                reverse("admin:audit_auditentry_changelist")):
        reply = client.get(url)
        assert reply.status_code == 200, url
        seen.append(reply.content.decode())
    seen += [str(row) for row in AuditEntry.objects.values()]
    seen.append((tmp_path / "gw.log").read_text())
    seen += [record.getMessage() for record in caplog.records]
    for text in seen:
        assert SECRET not in text and ciphertext not in text
    assert inventory.seen[0]["headers"]["x-api-key"] == SECRET  # it was used, all along


class Echoing(LoopbackService):
    """A service that echoes what it was asked (path, query, headers) and, for
    ``/big``, answers 300 KiB of JSON."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        super().__init__(self._answer)

    def _answer(self, request, body: bytes) -> tuple[int, str, bytes]:
        self.hits.append(request.path)
        if request.path.startswith("/big"):
            return 200, "application/json", json.dumps({"items": ["x" * 100] * 3000}).encode()
        return 200, "application/json", json.dumps(
            {"path": request.path, "headers": dict(request.headers)}).encode()


@pytest.mark.django_db(transaction=True)
def test_what_the_break_test_found_stays_fixed(gateway, tmp_path):
    """Schemas that fetch or backtrack, dot segments, echoed secrets, long answers, one
    caller starving the others, deep nesting and half-made grants."""
    from reach_core.schemas import schema_problems
    from tests import factories
    from tests.conftest import key_client

    echo = Echoing()
    try:
        manage = key_client(factories.api_key(tenant=gateway.tenant).plaintext)
        # A schema reaching outside itself, or with a pattern the engine refuses: 400.
        for schema in ({"type": "object", "properties": {"a": {
                "$ref": f"{echo.url}/schema"}}},
                       {"type": "object", "properties": {"a": {"pattern": "("}}},
                       {"type": "nonsense"}):
            refused = manage.post("/api/v1/tools/", {
                "name": "bad-schema", "description": "d", "input_schema": schema,
                "url_template": echo.url + "/x"}, format="json")
            assert refused.status_code == 400, refused.content
            assert "input_schema" in refused.json()["error"]["details"]
        assert echo.hits == []
        assert schema_problems({"type": "object", "properties": {
            "a": {"$ref": "#/$defs/b"}}, "$defs": {"b": {"type": "string"}}}) == []
        # A backtracking pattern is answered at once (the regex engine, with a limit).
        slow = stock_tool(gateway.tenant, echo.url, name="backtracking",
                          input_schema={"type": "object", "properties": {
                              "sku": {"type": "string", "pattern": "(a+)+$"}}})
        token = agent_token(gateway, "scripted")
        wait_for_tool(gateway.base, token, name="backtracking")
        started = time.monotonic()
        reply = tool_call(gateway.base, token, {"sku": "a" * 40 + "!"}, name="backtracking")
        assert reply.status_code == 400 and time.monotonic() - started < 5
        # Dot segments never climb the service's path.
        assert tool_call(gateway.base, token, {"sku": ".."}, name="backtracking")\
            .status_code == 400
        assert all(".." not in hit for hit in echo.hits)
        # The key in the query, echoed by the service, does not reach the caller.
        tool_save(tool=Tool(owner_tenant=gateway.tenant, name="echo-query",
                            description="d", url_template=echo.url + "/echo",
                            auth_kind="query", auth_field_name="token"),
                  secret=SECRET)
        tool_save(tool=Tool(owner_tenant=gateway.tenant, name="big", description="d",
                            url_template=echo.url + "/big"))
        wait_for_tool(gateway.base, token, name="big")
        echoed = tool_call(gateway.base, token, {}, name="echo-query")
        assert echoed.status_code == 200 and SECRET not in echoed.text
        assert "[redacted]" in echoed.text
        # A tool call is a call through the gateway: it writes its reach.calls line.
        wait_for(lambda: any("tool call success echo-query" in line and
                             echoed.json()["request_id"] in line
                             for line in (tmp_path / "gw.log").read_text().splitlines()),
                 timeout=10, message="the tool call's log line")
        # Nor when the echo encodes it: percent-encoded in the query (a base64 key's
        # + and =), JSON-escaped in a header dump (a break test read both back).
        encoded = {"echo-b64": ("query", "AbC+dEf/GhI9kLm=" + uuid.uuid4().hex[:6]),
                   "echo-quote": ("header", 'k3y"with\\quote' + uuid.uuid4().hex[:6])}
        for name, (kind, secret) in encoded.items():
            tool_save(tool=Tool(owner_tenant=gateway.tenant, name=name, description="d",
                                url_template=echo.url + "/echo", auth_kind=kind,
                                auth_field_name="token" if kind == "query" else "X-Api-Key"),
                      secret=secret)
            wait_for_tool(gateway.base, token, name=name)
            reply = tool_call(gateway.base, token, {}, name=name)
            assert reply.status_code == 200, reply.text
            result = reply.json()["result"]
            readable = [unquote(result["path"]), *map(str, result["headers"].values())]
            assert not any(secret in text for text in readable), readable
            assert "[redacted]" in reply.text
        assert any("AbC" in hit for hit in echo.hits)  # it was sent, and echoed
        # A long answer comes whole.
        big = tool_call(gateway.base, token, {}, name="big").json()
        assert len(big["result"]["items"]) == 3000
        # Deeply nested arguments: a clear 400, not a 500.
        deep: dict = {}
        for _ in range(300):
            deep = {"a": deep}
        nested = tool_call(gateway.base, token, deep, name="big")
        assert nested.status_code in (200, 400), nested.text
        # A grant to nobody, or to both a tenant and an agent: 400, not 500.
        for grant in ({"tool": slow.pk}, {"tool": slow.pk, "tenant": gateway.tenant.slug,
                                          "agent": Agent.objects.get(name="scripted").pk}):
            assert manage.post("/api/v1/tool-grants/", grant, format="json")\
                .status_code == 400
    finally:
        echo.close()


@pytest.mark.django_db(transaction=True)
def test_a_caller_over_its_own_quota_does_not_spend_the_shared_one(gateway, inventory):
    from tests import factories

    # 60 a minute in total (a bucket of 5), 12 a minute per caller (a bucket of 1).
    stock_tool(gateway.tenant, inventory.url, calls_per_minute=60, caller_calls_per_minute=12)
    factories.agent(owner=gateway.tenant, name="quiet-caller")
    noisy, quiet = agent_token(gateway, "scripted"), agent_token(gateway, "quiet-caller")
    wait_for_tool(gateway.base, noisy)
    codes = [tool_call(gateway.base, noisy, {"sku": "A-1"}).status_code for _ in range(30)]
    assert codes.count(200) == 1  # its own bucket of one, then refused by its quota
    # The refused calls took nothing from the total: the quiet caller is served.
    assert tool_call(gateway.base, quiet, {"sku": "A-1"}).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_mcp_refuses_a_message_nested_past_the_limit_and_a_reply_it_cannot_write(gateway):
    """The /mcp door parses its own bodies: the same depth limit and refusal of repeated
    keys as every door, and an
    agent's result nested too deep to write again is a JSON-RPC error, never a 500."""
    token = agent_token(gateway, "scripted")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    deep = "[" * 300 + "]" * 300
    message = ('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":'
               '"agent__echo_all","arguments":{"text":"x","deep":' + deep + "}}}")
    refused = httpx.post(f"{gateway.base}/mcp?agents=true", content=message, headers=headers)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == -32700
    # A repeated key is refused as on every door (a filter reading the first "name"
    # would see another tool than the one that runs).
    twice = ('{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":'
             '"agent__echo_all","arguments":{"text":"x"},"name":"agent__slow_op"}}')
    repeated = httpx.post(f"{gateway.base}/mcp?agents=true", content=twice, headers=headers)
    assert repeated.status_code == 400, repeated.text
    assert repeated.json()["error"]["code"] == -32700
    assert "repeats the key" in repeated.json()["error"]["message"]
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "agent__deep_op", "arguments": {}}}
    answered = httpx.post(f"{gateway.base}/mcp?agents=true", json=call, headers=headers)
    assert answered.status_code == 200, answered.text
    assert answered.json()["error"]["code"] == -32603
    both = httpx.post(f"{gateway.base}/mcp?agents=true&agents=false", json=call,
                      headers=headers)
    assert both.status_code == 400 and both.json()["error"]["code"] == "invalid_input"


@pytest.mark.django_db(transaction=True)
def test_a_grantee_has_one_grant_per_tool_even_when_asked_at_once(world):
    """Granting twice, in turn or at once, leaves one grant: else deleting "the" grant
    would revoke nothing while its twin stays."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    from tests import factories
    from tests.conftest import key_client

    tool = stock_tool(world.tenant_a, "http://127.0.0.1:9")
    other = world.tenant_b
    key = factories.api_key(tenant=world.tenant_a).plaintext
    grant = {"tool": tool.pk, "tenant": other.slug}

    def ask(_):
        try:
            return key_client(key).post("/api/v1/tool-grants/", grant, format="json")
        finally:
            connection.close()  # each thread's own connection

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(ask, range(16)))
    codes = sorted(r.status_code for r in replies)
    assert codes.count(201) == 1 and set(codes) <= {201, 400, 409}, codes
    assert ToolGrant.objects.filter(tool=tool, tenant=other).count() == 1
    again = key_client(key).post("/api/v1/tool-grants/", grant, format="json")
    assert again.status_code == 400 and "tenant" in again.json()["error"]["details"]
    agent = {"tool": tool.pk, "agent": world.agent_b.pk}
    assert key_client(key).post("/api/v1/tool-grants/", agent, format="json").status_code == 201
    assert key_client(key).post("/api/v1/tool-grants/", agent, format="json").status_code == 400


@pytest.mark.parametrize("secret", ['p@ss w/rd+&=%?#"\\<>Z9', "sécret€/Ωx+y", "AbC+dEf/GhI9kLm=",
                                    "emoji😀key"])
def test_a_secret_echoed_in_any_common_encoding_is_redacted(secret):
    """Every shape of echo break tests sent back (percent-encoded once or twice, JSON
    escaped once or twice as a header dump inside a JSON string, base64, hex, HTML
    entities), embedded in a JSON answer: none shows the secret, each shows [redacted]."""
    import base64
    import html
    import re
    from urllib.parse import quote, quote_plus

    from gateway.tools import _redacted

    once = quote(secret, safe="")
    dump = json.dumps({"x-api-key": secret})
    lower_hex = re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), once)
    echoes = [secret, once, quote(secret), quote_plus(secret), lower_hex, quote(once, safe=""),
              json.dumps(secret)[1:-1], json.dumps(secret).replace("/", "\\/")[1:-1],
              json.dumps(dump)[1:-1], json.dumps(json.dumps(secret, ensure_ascii=False))[1:-1],
              base64.b64encode(secret.encode()).decode(),
              base64.urlsafe_b64encode(secret.encode()).decode().rstrip("="),
              secret.encode().hex(), secret.encode().hex().upper(),
              "".join(f"&#{ord(c)};" for c in secret),
              html.escape(secret)]
    for echo in echoes:
        answer = ('{"seen": "before ' + echo + ' after"}').encode()
        redacted = _redacted(answer, secret)
        assert b"[redacted]" in redacted, echo
        assert echo.encode() not in redacted and secret.encode() not in redacted, echo


@pytest.mark.django_db(transaction=True)
def test_mcp_calls_keep_the_callers_deadline(gateway):
    """A re-test found X-Reach-Deadline-Ms ignored on /mcp (1 ms and "abc" alike ran the
    call): the caller's deadline bounds an MCP capability call as on every door."""
    token = agent_token(gateway, "scripted")
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "agent__slow_op", "arguments": {}}}

    def tools_call(deadline: str) -> dict:
        answer = httpx.post(f"{gateway.base}/mcp?agents=true", json=call, timeout=30, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
            "X-Reach-Deadline-Ms": deadline})
        assert answer.status_code == 200, answer.text
        return answer.json()["result"]

    cut = tools_call("300")  # the agent answers after 2 s
    assert cut["isError"] and cut["structuredContent"]["error"]["code"] == "deadline_exceeded"
    bad = tools_call("abc")
    assert bad["isError"] and bad["structuredContent"]["error"]["code"] == "invalid_input"
    whole = tools_call("4000")
    assert not whole["isError"], whole


@pytest.mark.django_db(transaction=True)
def test_mcp_lists_and_calls_the_agents_of_the_namespace_it_is_told(gateway):
    """An agent in another namespace was listed by /mcp?agents=true, and its call routed
    in "default", where nothing offered it: /mcp now reads X-Reach-Namespace (or
    ?namespace=) as every door does, listing and calling that namespace's agents."""
    import datetime as dt

    from django.utils import timezone

    from registry.models import Instance, Namespace
    from registry.services import agent_register
    from registry.spec import AgentSpec, CapabilitySpec

    Namespace.objects.get_or_create(name="team-b")
    agent_register(tenant=gateway.tenant, spec=AgentSpec(
        name="team-b-echo", namespace="team-b",
        endpoint=f"http://127.0.0.1:{gateway.agent_port}/", lease_ttl_seconds=3600,
        capabilities=(CapabilitySpec(capability_id="teamb.echo", path="/echo"),)))
    Instance.objects.update(lease_expires_at=timezone.now() + dt.timedelta(hours=1))
    headers = {"Authorization": f"Bearer {gateway.key}",
               "Accept": "application/json, text/event-stream"}
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "agent__teamb_echo", "arguments": {"text": "in team-b"}}}

    def names(**extra) -> set[str]:
        reply = httpx.post(f"{gateway.base}/mcp?agents=true", json=listing,
                           headers={**headers, **extra}, timeout=10)
        assert reply.status_code == 200, reply.text
        return {t["name"] for t in reply.json()["result"]["tools"]}

    wait_for(lambda: "agent__teamb_echo" in names(**{"X-Reach-Namespace": "team-b"}),
             timeout=15, interval=0.05, message="the gateway to know team-b's agent")
    assert "agent__teamb_echo" not in names()
    assert "agent__echo_all" in names() and "agent__echo_all" not in names(
        **{"X-Reach-Namespace": "team-b"})
    for url, extra in ((f"{gateway.base}/mcp?agents=true", {"X-Reach-Namespace": "team-b"}),
                       (f"{gateway.base}/mcp?agents=true&namespace=team-b", {})):
        called = httpx.post(url, json=call, headers={**headers, **extra}, timeout=10)
        assert called.status_code == 200, called.text
        result = called.json()["result"]
        assert not result["isError"], result
        assert "in team-b" in result["content"][0]["text"]
    unknown = httpx.post(f"{gateway.base}/mcp?agents=true", json=call, headers=headers,
                         timeout=10)
    assert unknown.json()["error"]["code"] == -32602  # not a tool of "default"
    bad = httpx.post(f"{gateway.base}/mcp?agents=true", json=call, timeout=10,
                     headers={**headers, "X-Reach-Namespace": "../etc"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_input"


@pytest.mark.django_db(transaction=True)
def test_a_compressed_tool_answer_is_refused_not_inflated_past_the_limit(gateway):
    """helper-53: a tool answering 200 KB of gzip (200 MB inflated) got past the 4 MiB
    answer limit, inflated by the client; three such calls stalled the gateway. Tools
    are asked for identity, and an encoded answer is 502 upstream_bad_response."""
    import gzip

    inflated = b'{"a": "' + b"0" * (6 * 1024 * 1024) + b'"}'
    asked: list[str | None] = []

    def bomb(handler, body):
        asked.append(handler.headers.get("Accept-Encoding"))
        return 200, "application/json", gzip.compress(inflated), {"Content-Encoding": "gzip"}

    service = LoopbackService(bomb)
    try:
        stock_tool(gateway.tenant, service.url)
        token = agent_token(gateway, "scripted")
        wait_for_tool(gateway.base, token)
        reply = tool_call(gateway.base, token, {"sku": "A-1"})
    finally:
        service.close()
    assert reply.status_code == 502, reply.text[:300]
    error = reply.json()["error"]
    assert error["code"] == "upstream_bad_response"
    assert "Content-Encoding: gzip" in error["message"]
    assert asked and set(asked) == {"identity"}
