"""POST /v1/invoke and /v1/chat/completions through a real gateway to real agents."""

from __future__ import annotations

import json
import socket
import time

import openai
import pytest

from tests.support.metrics import scrape


def invoke(gateway, capability, payload, **kw):
    with gateway.client() as client:
        return client.post("/v1/invoke", json={"capability": capability, "input": payload},
                           **kw)


def test_invoke_maps_parameters_and_unwraps_the_business_envelope(gateway):
    response = invoke(gateway, "translate.text", {"text": "hello", "dest_lang": "zh"},
                      headers={"X-Request-ID": "inv-1"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["request_id"] == "inv-1" and response.headers["x-request-id"] == "inv-1"
    assert body["agent"] == "demo-translator" and body["capability"] == "translate.text"
    assert body["reply_content"] == "你好"
    assert body["output"]["message"] == "你好"
    assert set(body["timings"]) == {"route_ms", "upstream_ms", "total_ms"}
    assert set(body["usage"]) == {"input_tokens", "output_tokens", "cost"}


def test_input_is_validated_before_forwarding(gateway):
    response = invoke(gateway, "translate.text", {"text": "", "dest_lang": "ja", "tone": 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_input" and error["retryable"] is False
    assert set(error["details"]) == {"text", "$"}  # too short; an unknown property
    # A language no instance translates into is a routing constraint, not bad input.
    unsupported = invoke(gateway, "translate.text", {"text": "hi", "dest_lang": "fr"})
    assert unsupported.status_code == 404
    assert unsupported.json()["error"]["code"] == "no_capability"


def test_the_official_openai_sdk_gets_a_completion_and_a_stream(gateway):
    client = openai.OpenAI(base_url=f"{gateway.base}/v1", api_key=gateway.key, max_retries=0)
    completion = client.chat.completions.create(
        model="demo-chat", messages=[{"role": "user", "content": "hello there"}])
    assert "hello there" in completion.choices[0].message.content
    assert completion.usage.completion_tokens > 0
    chunks = client.chat.completions.create(
        model="demo-chat", messages=[{"role": "user", "content": "stream me please"}],
        stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "stream me please" in text
    # A plain agent with no text to say: its output is the content, as JSON text.
    plain = client.chat.completions.create(
        model="capability:echo.all", messages=[{"role": "user", "content": "plain one"}])
    assert json.loads(plain.choices[0].message.content)["echo"] == {"text": "plain one"}


def test_an_agents_error_event_ends_its_stream_as_the_agents_failure(gateway):
    """An agent that ends its stream with ``event: error``: the events before it are
    relayed, then the gateway's own error event (the one shape; the agent's text is its
    internals), never a door's clean ``[DONE]`` over it, and metered as a failure."""
    def failed_calls() -> float:
        return sum(scrape(gateway.base, "reach_calls_total",
                          {"endpoint": endpoint, "outcome": "upstream_error"}) or 0
                   for endpoint in ("invoke", "chat_completions"))

    before = failed_calls()
    with gateway.client() as client:
        streamed = client.post("/v1/invoke", json={
            "capability": "chat.scripted", "stream": True,
            "input": {"text": "stream then fail"}}).text
    assert '"fine "' in streamed and "secret-internal-detail" not in streamed
    assert streamed.rstrip().endswith("}") and '"upstream_error"' in streamed
    chat = openai.OpenAI(base_url=f"{gateway.base}/v1", api_key=gateway.key, max_retries=0)
    with pytest.raises(openai.APIError) as failed:
        for _ in chat.chat.completions.create(
                model="scripted-chat", stream=True,
                messages=[{"role": "user", "content": "stream then fail"}]):
            pass
    assert "upstream_error" in str(failed.value.body) + str(failed.value)
    assert failed_calls() - before == 2


def _chat_calls(gateway) -> int:
    return len([s for s in gateway.seen() if s.get("path") == "/v1/chat/completions"])


def test_the_openai_sdk_does_not_resend_what_the_gateway_calls_not_retryable(gateway):
    """The SDK resends 5xx and 429 answers on its own (twice by default) unless told
    otherwise: an agent whose reply is garbage must run once, not three times."""
    client = openai.OpenAI(base_url=f"{gateway.base}/v1", api_key=gateway.key)  # retries on
    before = _chat_calls(gateway)
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(
            model="scripted-chat", messages=[{"role": "user", "content": "answer html"}])
    assert failed.value.status_code == 502
    assert failed.value.response.headers["x-should-retry"] == "false"
    assert _chat_calls(gateway) == before + 1


def test_a_stream_event_that_is_no_chat_chunk_ends_the_stream_as_the_agents_fault(gateway):
    """An OpenAI-protocol agent streaming an event that is not JSON: what came before it
    is relayed, then ``event: error`` ``upstream_bad_response`` (never the garbage
    itself, which the SDKs cannot parse), and the call is metered so."""
    client = openai.OpenAI(base_url=f"{gateway.base}/v1", api_key=gateway.key, max_retries=0)
    texts = []
    with pytest.raises(openai.APIError) as broken:
        for chunk in client.chat.completions.create(
                model="scripted-chat", stream=True,
                messages=[{"role": "user", "content": "stream garbage"}]):
            texts += [c.delta.content or "" for c in chunk.choices]
    assert "".join(texts) == "fine "
    assert "upstream_bad_response" in str(broken.value.body) + str(broken.value)


def test_caller_and_hop_by_hop_headers_never_reach_the_agent(gateway):
    response = invoke(gateway, "echo.all", {"x": 1}, headers={
        "X-Reach-Tenant": "someone-else", "X-Reach-Deadline-Ms": "4000",
        "Proxy-Authorization": "Basic Zm9vOmJhcg==", "TE": "trailers",
        "X-Forwarded-For": "10.9.9.9", "Cookie": "session=abc", "Upgrade": "h2c",
    })
    assert response.status_code == 200, response.text
    seen = {k.lower(): v for k, v in response.json()["output"]["headers"].items()}
    assert seen["x-reach-tenant"] == gateway.tenant.slug
    assert int(seen["x-reach-deadline-ms"]) < 4000
    for name in ("proxy-authorization", "te", "x-forwarded-for", "cookie", "upgrade"):
        assert name not in seen
    assert all(gateway.key not in value for value in seen.values())
    assert "authorization" not in seen  # the caller's key stays with the gateway


def test_a_crlf_injection_never_reaches_the_agent(gateway):
    host, port = gateway.base.removeprefix("http://").split(":")
    body = b'{"capability": "echo.all", "input": {"x": 2}}'
    raw = (b"POST /v1/invoke HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + gateway.key.encode()
           + b"\r\nX-Note: a\r\nX-Injected: 1\r\n\r\nContent-Type: application/json\r\n"
           + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(raw)
        reply = sock.recv(65536)
    assert b"X-Injected" not in reply
    echoed = [s for s in gateway.seen() if s["path"] == "/echo"]
    assert echoed == []  # the smuggled request body never became a call


def test_an_output_schema_violation_is_refused_and_counted(gateway):
    response = invoke(gateway, "bad.op", {})
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_bad_response"
    assert scrape(gateway.base, "reach_upstream_bad_responses_total",
                  {"capability": "bad.op"}) == 1.0


def test_redirects_from_agents_are_not_followed(gateway):
    response = invoke(gateway, "redirect.op", {})
    assert response.status_code == 502
    assert "redirect" in response.json()["error"]["message"]


def test_the_caller_budget_caps_the_call_and_is_passed_downstream(gateway):
    started = time.monotonic()
    response = invoke(gateway, "slow.op", {}, headers={"X-Reach-Deadline-Ms": "500"})
    elapsed = time.monotonic() - started
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "deadline_exceeded"
    # The agent answers after 2 s: a 504 sooner than that is the budget cutting it off (a
    # bound relative to the agent, not a tolerance on the machine's speed).
    assert elapsed < 2.0, elapsed
    [seen] = [s for s in gateway.seen() if s["path"] == "/slow"]
    assert 0 < int(seen["deadline"]) < 500


def test_a_callers_own_tight_deadline_never_opens_the_agents_breaker(gateway):
    """Breakers are per instance and shared by every caller: time-outs of a budget the
    caller cut short are the caller's, or one caller could take a healthy agent away
    from all the others (break test: 9 such calls opened it)."""
    for _ in range(15):
        response = invoke(gateway, "slow.op", {}, headers={"X-Reach-Deadline-Ms": "50"})
        assert response.status_code == 504, response.text
        assert response.json()["error"]["code"] == "deadline_exceeded"
    response = invoke(gateway, "slow.op", {})  # the agent's own timeout: it answers in 2 s
    assert response.status_code == 200, response.text


def test_a_callers_deadline_past_the_agents_patience_never_opens_its_breaker(gateway):
    """helper-50: the agent usually answers in a few ms (so its patience is 100 ms), and
    eleven calls of a request it takes longer over, cut by the caller at 100 ms, opened
    its breaker for every caller. Such time-outs now only count in routing."""
    for _ in range(10):
        assert invoke(gateway, "echo.all", {"text": "fast"}).status_code == 200
    for _ in range(15):
        response = invoke(gateway, "slow.op", {}, headers={"X-Reach-Deadline-Ms": "300"})
        assert response.status_code == 504, response.text
        assert response.json()["error"]["code"] == "deadline_exceeded"
    response = invoke(gateway, "echo.all", {"text": "still served"})
    assert response.status_code == 200, response.text


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_a_request_nested_past_the_limit_is_refused_before_any_agent_is_called(gateway):
    """Every depth gets an answer: up to 200 levels the call goes through; past them a
    400 (orjson reads 1,024 levels but writes only 254: from 254 to 1,022 was a 500)."""
    body = '{"capability":"echo.all","input":{"x":%s}}'
    with gateway.client() as client:
        ok = client.post("/v1/invoke", content=body % nested(190),
                         headers={"Content-Type": "application/json"})
        assert ok.status_code == 200, ok.text
        for depth in (201, 254, 600, 1022, 1100):
            refused = client.post("/v1/invoke", content=body % nested(depth),
                                  headers={"Content-Type": "application/json"})
            assert refused.status_code == 400, (depth, refused.text)
            assert refused.json()["error"]["code"] == "malformed_json"
        messages = '[{"role":"user","content":"hi"}]'
        chat = client.post("/v1/chat/completions",
                           content=f'{{"model":"chat.scripted","messages":{messages},'
                                   f'"x":{nested(300)}}}',
                           headers={"Content-Type": "application/json"})
        assert chat.status_code == 400, chat.text
    assert [s for s in gateway.seen() if s["path"] == "/echo"] != []  # the 190-deep one


def test_an_agent_reply_too_deep_to_forward_is_a_bad_response_and_frees_its_key(gateway):
    with gateway.client() as client:
        first = client.post("/v1/invoke", json={"capability": "deep.op", "input": {}},
                            headers={"Idempotency-Key": "deep-1"})
        assert first.status_code == 502, first.text
        assert first.json()["error"]["code"] == "upstream_bad_response"
        # The claim was let go: a repeat runs again at once, instead of waiting out the
        # claim's lease (or, within a short deadline, getting 409 idempotency_in_progress).
        again = client.post("/v1/invoke", json={"capability": "deep.op", "input": {}},
                            headers={"Idempotency-Key": "deep-1", "X-Reach-Deadline-Ms": "3000"})
        assert again.status_code == 502, again.text
        assert again.json()["error"]["code"] == "upstream_bad_response"
    assert len([s for s in gateway.seen() if s["path"] == "/deep"]) == 2


def test_an_agent_killed_mid_stream_ends_with_an_error_event(gateway):
    with gateway.client() as client, client.stream("POST", "/v1/invoke", json={
        "capability": "chat.scripted", "stream": True,
        "input": {"text": "die after 3 one two three four five"},
    }) as response:
        assert response.status_code == 200
        raw = b"".join(response.iter_bytes()).decode()
    events = [e for e in raw.split("\n\n") if e.strip()]
    contents = [e for e in events if e.startswith("data:") and "chat.completion.chunk" in e]
    assert len(contents) == 3
    assert events[-1].startswith("event: error")
    assert '"code":"upstream_error"' in events[-1]
    assert "[DONE]" not in raw


def test_limits_on_body_and_headers(gateway):
    with gateway.client() as client:
        big = client.post("/v1/invoke", content=b"{" + b" " * (2 * 1024 * 1024) + b"}",
                          headers={"Content-Type": "application/json"})
        assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"
        fat = client.post("/v1/invoke", json={}, headers={"X-Fat": "x" * 20_000})
        assert fat.status_code in (431, 400)


@pytest.mark.parametrize(
    ("body", "code"),
    [(b"{not json", "malformed_json"), (b"[1, 2]", "invalid_input"),
     (b'{"capability": "echo.all", "input": "text"}', "invalid_input"),
     (b'{"capability": "nobody.has.it", "input": {}}', "no_capability"),
     (b'{"capability": "echo.all", "intent": "x", "input": {}}', "invalid_input")],
)
def test_bad_requests_get_structured_errors(gateway, body, code):
    with gateway.client() as client:
        response = client.post("/v1/invoke", content=body,
                               headers={"Content-Type": "application/json"})
    assert response.json()["error"]["code"] == code
    assert response.status_code in (400, 404)


def test_the_same_idempotency_key_twenty_times_concurrently_runs_the_agent_once(gateway):
    import concurrent.futures

    body = {"capability": "echo.all", "input": {"order": 42}}

    def send(_):
        with gateway.client() as client:
            return client.post("/v1/invoke", json=body, headers={"Idempotency-Key": "pay-42"})

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        responses = list(pool.map(send, range(20)))
    assert [r.status_code for r in responses] == [200] * 20
    assert len({r.json()["request_id"] for r in responses}) == 1  # one execution, replayed
    assert sum(1 for r in responses if r.headers.get("idempotent-replayed")) == 19
    assert len([s for s in gateway.seen() if s["path"] == "/echo"]) == 1
    assert scrape(gateway.base, "reach_idempotent_replays_total") == 19.0
    with gateway.client() as client:
        reused = client.post("/v1/invoke", json={**body, "input": {"order": 43}},
                             headers={"Idempotency-Key": "pay-42"})
    assert reused.status_code == 422
    assert reused.json()["error"]["code"] == "idempotency_key_reused"


@pytest.mark.gateway_env(REACH_GATEWAY_BODY_TIMEOUT_S="0.5", REACH_GATEWAY_MAX_IN_FLIGHT="4",
                         REACH_GATEWAY_TENANT_SHARE="1")  # every slot, not one tenant's share
def test_a_sender_that_stalls_mid_body_gets_408_and_its_call_slot_back(gateway):
    """A valid key, a Content-Length of 1000 and 5 bytes, then nothing: as many such
    senders as the gateway has call slots must not lock every other caller out."""
    host, port = gateway.base.removeprefix("http://").split(":")
    head = (f"POST /v1/invoke HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {gateway.key}"
            "\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode()
    stalled = [socket.create_connection((host, int(port)), timeout=30) for _ in range(4)]
    try:
        for sock in stalled:
            sock.sendall(head + b'{"cap')
        for sock in stalled:
            reply = read_reply(sock)
            assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
            assert b'"request_timeout"' in reply
        # Every slot is free again: a whole call goes through.
        response = invoke(gateway, "echo.all", {"text": "after the stall"})
        assert response.status_code == 200, response.text
    finally:
        for sock in stalled:
            sock.close()


def read_reply(sock: socket.socket) -> bytes:
    """One whole HTTP reply with a Content-Length (its head and body may come apart)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, data
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_slow_upload_does_not_spend_the_agents_timeout(gateway):
    """slow.op may take 5 s and answers in 2: a body that takes 3.5 s to arrive (inside
    the 10 s body limit) must still leave the agent its whole timeout (break test: 503
    "retry shortly", for a call no retry could help)."""
    host, port = gateway.base.removeprefix("http://").split(":")
    body = b'{"capability": "slow.op", "input": {"pad": "' + b"x" * 700 + b'"}}'
    head = (f"POST /v1/invoke HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer "
            f"{gateway.key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        pieces = [body[i:i + 100] for i in range(0, len(body), 100)]
        for piece in pieces:  # the sender's pace is what is under test
            sock.sendall(piece)
            time.sleep(3.5 / len(pieces))
        reply = read_reply(sock)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:400]
