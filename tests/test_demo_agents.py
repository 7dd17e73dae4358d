"""The demo agents over real loopback HTTP: httpx for the wire, the official openai SDK for
the chat agent's OpenAI compatibility."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from reach_platform.demo_agents import (
    CHAT_AGENT_ID,
    CHAT_SIGNATURE,
    RECORDED_REQUESTS,
    TRANSLATOR_AGENT_ID,
    DemoAgent,
    run_in_thread,
    start_demo_agents,
    translate,
)


@pytest.fixture(scope="module")
def agents() -> Iterator[dict[str, DemoAgent]]:
    started, stop = run_in_thread()
    try:
        yield {agent.name: agent for agent in started}
    finally:
        stop()


@pytest.fixture(scope="module")
def chat_url(agents: dict[str, DemoAgent]) -> str:
    return f"http://127.0.0.1:{agents[CHAT_AGENT_ID].port}"


@pytest.fixture(scope="module")
def translator_url(agents: dict[str, DemoAgent]) -> str:
    return f"http://127.0.0.1:{agents[TRANSLATOR_AGENT_ID].port}"


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    # trust_env=False: a proxy set in the environment must not stand between us and loopback.
    with httpx.Client(timeout=10.0, trust_env=False) as client:
        yield client


@pytest.fixture
def sdk(chat_url: str) -> Iterator[openai.OpenAI]:
    with httpx.Client(timeout=10.0, trust_env=False) as transport_client:
        client = openai.OpenAI(
            base_url=f"{chat_url}/v1", api_key="x", http_client=transport_client, max_retries=0
        )
        yield client
        client.close()


def sse_events(response: httpx.Response) -> list[str]:
    """The ``data:`` payloads of an SSE response, in order, read until the body ends."""
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


def expected_reply(text: str) -> str:
    return f"You said: {text}. {CHAT_SIGNATURE}"


# ----------------------------------------------------------------------------- both agents


def test_both_agents_answer_healthz(agents: dict[str, DemoAgent], http: httpx.Client) -> None:
    assert set(agents) == {CHAT_AGENT_ID, TRANSLATOR_AGENT_ID}
    for agent in agents.values():
        response = http.get(f"{agent.base_url}/healthz")
        assert response.status_code == 200
        assert response.json() == {"status": "ok"}


def test_descriptors_point_at_the_listening_ports(agents: dict[str, DemoAgent]) -> None:
    chat = agents[CHAT_AGENT_ID].descriptor
    assert chat["agent_id"] == "demo-chat"
    assert chat["reach"] == {
        "protocol": "openai",
        "endpoint": f"http://127.0.0.1:{agents[CHAT_AGENT_ID].port}/",
    }
    assert chat["liveness"] == {"ttl_seconds": 30, "heartbeat_interval_seconds": 10}
    (chat_cap,) = chat["capabilities"]
    assert chat_cap["id"] == "chat.general"
    assert chat_cap["kind"] == "stream"
    assert chat_cap["path"] == "/v1/chat/completions"

    translator = agents[TRANSLATOR_AGENT_ID].descriptor
    assert translator["agent_id"] == "demo-translator"
    assert translator["reach"] == {
        "protocol": "http",
        "endpoint": f"http://127.0.0.1:{agents[TRANSLATOR_AGENT_ID].port}/",
    }
    (cap,) = translator["capabilities"]
    assert cap["id"] == "translate.text"
    assert cap["path"] == "/translate"
    assert cap["kind"] == "sync"
    assert cap["input_schema"]["required"] == ["text", "target_lang"]
    assert cap["response"] == {
        "envelope": {
            "code_field": "code", "ok_value": 0, "data_field": "data", "message_field": "message"
        }
    }
    # Descriptors go over the wire to the platform: they must be plain JSON.
    assert json.loads(json.dumps(translator)) == translator


# -------------------------------------------------------------------------------- demo-chat


def test_chat_completion_through_the_openai_sdk(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(
        model="demo-chat",
        messages=[
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "hello there friend"},
        ],
        temperature=0.3,
    )
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "demo-chat"
    assert completion.created > 0
    (choice,) = completion.choices
    assert choice.index == 0
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content == expected_reply("hello there friend")
    assert completion.usage is not None
    # Tokens are whitespace-separated words: 3 system + 3 user; the reply has 10.
    assert completion.usage.prompt_tokens == 6
    assert completion.usage.completion_tokens == len(choice.message.content.split()) == 10
    assert completion.usage.total_tokens == 16


def test_chat_completion_echoes_the_last_user_message(chat_url: str, http: httpx.Client) -> None:
    response = http.post(
        f"{chat_url}/v1/chat/completions",
        json={
            "model": "any-model",
            "messages": [
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [{"type": "text", "text": "你好"}]},
            ],
        },
    )
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == "any-model"
    assert body["choices"][0]["message"]["content"] == expected_reply("你好")
    assert body["usage"]["prompt_tokens"] == 3


def test_max_tokens_cuts_the_reply_with_finish_reason_length(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(
        model="demo-chat", messages=[{"role": "user", "content": "one two three"}], max_tokens=2
    )
    assert completion.choices[0].message.content == "You said:"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 2


def test_chat_stream_through_the_openai_sdk(sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="demo-chat",
        messages=[{"role": "user", "content": "stream me please"}],
        stream=True,
    )
    chunks = list(stream)
    reply = expected_reply("stream me please")
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    # One chunk per word, then the finish chunk.
    assert len(chunks) == len(reply.split()) + 1
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == reply
    assert [chunk.choices[0].finish_reason for chunk in chunks[-2:]] == [None, "stop"]
    assert all(chunk.usage is None for chunk in chunks)


def test_chat_stream_is_sse_ending_with_done(chat_url: str, http: httpx.Client) -> None:
    request = {"model": "demo-chat", "messages": [{"role": "user", "content": "hi"}],
               "stream": True}
    with http.stream("POST", f"{chat_url}/v1/chat/completions", json=request) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "You"}
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)
    assert text == expected_reply("hi")


def test_stream_options_include_usage_adds_a_usage_chunk(sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="demo-chat",
        messages=[{"role": "user", "content": "count my words"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.prompt_tokens == 3
    assert usage_chunk.usage.completion_tokens == len(expected_reply("count my words").split())
    assert usage_chunk.usage.total_tokens == 3 + usage_chunk.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == "stop"


def read_until_broken(response: httpx.Response) -> tuple[list[str], Exception | None]:
    events: list[str] = []
    try:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: "):])
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        return events, exc
    return events, None


@pytest.mark.parametrize("fail_after", [0, 3])
def test_fail_after_header_breaks_the_stream_mid_way(
    chat_url: str, http: httpx.Client, fail_after: int
) -> None:
    request = {"model": "demo-chat", "messages": [{"role": "user", "content": "die soon"}],
               "stream": True}
    with http.stream(
        "POST", f"{chat_url}/v1/chat/completions", json=request,
        headers={"X-Demo-Fail-After": str(fail_after)},
    ) as response:
        assert response.status_code == 200
        events, error = read_until_broken(response)
    # A dying agent leaves a truncated chunked body, not a clean end of stream.
    assert isinstance(error, httpx.RemoteProtocolError | httpx.ReadError)
    assert "[DONE]" not in events
    assert len(events) == fail_after
    # The agent itself survives to serve the next caller.
    assert http.get(f"{chat_url}/healthz").status_code == 200


def test_fail_after_beyond_the_stream_lets_it_complete(chat_url: str, http: httpx.Client) -> None:
    request = {"model": "demo-chat", "messages": [{"role": "user", "content": "x"}],
               "stream": True}
    with http.stream(
        "POST", f"{chat_url}/v1/chat/completions", json=request,
        headers={"X-Demo-Fail-After": "1000"},
    ) as response:
        events, error = read_until_broken(response)
    assert error is None
    assert events[-1] == "[DONE]"


@pytest.mark.parametrize(
    ("content", "headers", "param"),
    [
        (b"not json", {}, None),
        (json.dumps({"model": "demo-chat"}).encode(), {}, "messages"),
        (json.dumps({"messages": []}).encode(), {}, "messages"),
        (json.dumps({"messages": [{"content": "no role"}]}).encode(), {}, "messages[0]"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).encode(),
         {}, "max_tokens"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True}).encode(),
         {"X-Demo-Fail-After": "soon"}, None),
    ],
)
def test_invalid_chat_requests_get_openai_style_400(
    chat_url: str, http: httpx.Client, content: bytes, headers: dict[str, str],
    param: str | None,
) -> None:
    response = http.post(
        f"{chat_url}/v1/chat/completions", content=content,
        headers={"Content-Type": "application/json", **headers},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    assert error["param"] == param


def test_the_sdk_sees_a_bad_request_error(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="demo-chat", messages=[])
    assert caught.value.status_code == 400


# -------------------------------------------------------------------------- demo-translator


def post_translate(http: httpx.Client, url: str, body: object) -> dict:
    response = http.post(f"{url}/translate", json=body)
    # Business envelope: even errors are HTTP 200; ``code`` tells them apart.
    assert response.status_code == 200
    return response.json()


@pytest.mark.parametrize(
    ("text", "target_lang", "message", "source_lang"),
    [
        ("hello", "zh", "你好", "en"),
        ("Good morning!", "ja", "おはようございます", "en"),
        ("谢谢", "en", "Thank you", "zh"),
        ("ありがとう", "zh", "谢谢", "ja"),
        ("The weather is nice", "zh", "[zh] The weather is nice", "en"),
    ],
)
def test_translator_success_envelope(
    translator_url: str, http: httpx.Client, text: str, target_lang: str, message: str,
    source_lang: str,
) -> None:
    body = post_translate(http, translator_url, {"text": text, "target_lang": target_lang})
    assert body == {
        "code": 0,
        "message": "ok",
        "data": {"message": message, "source_lang": source_lang},
    }


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        ({"target_lang": "zh"}, 40001, "text is required"),
        ({"text": "   ", "target_lang": "zh"}, 40001, "text is required"),
        ({"text": "hello", "target_lang": "fr"}, 40002, None),
        ({"text": "hello"}, 40002, None),
        (["not", "an", "object"], 40000, None),
    ],
)
def test_translator_errors_are_in_the_envelope(
    translator_url: str, http: httpx.Client, body: object, code: int, message: str | None
) -> None:
    reply = post_translate(http, translator_url, body)
    assert reply["code"] == code
    assert reply["data"] is None
    assert reply["message"] == (message or reply["message"])
    assert reply["message"]


def test_translator_rejects_a_non_json_body_in_the_envelope(
    translator_url: str, http: httpx.Client
) -> None:
    response = http.post(f"{translator_url}/translate", content=b"\xff{")
    assert response.status_code == 200
    assert response.json()["code"] == 40000


def test_translate_keeps_text_already_in_the_target_language() -> None:
    assert translate("今日は良い天気ですね", "ja") == ("今日は良い天気ですね", "ja")
    assert translate("你好", "zh") == ("你好", "zh")
    assert translate("12345", "en") == ("[en] 12345", "und")


# ------------------------------------------------------------------------ request recording


def last_requests(http: httpx.Client, url: str) -> list[dict]:
    response = http.get(f"{url}/_demo/last-requests")
    assert response.status_code == 200
    return response.json()


def test_last_requests_record_the_headers_that_arrived(
    agents: dict[str, DemoAgent], http: httpx.Client, chat_url: str, translator_url: str
) -> None:
    probe = uuid.uuid4().hex
    http.post(
        f"{chat_url}/v1/chat/completions?trace=1",
        json={"messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Probe": probe, "Authorization": "Bearer forwarded"},
    )
    http.post(
        f"{translator_url}/translate",
        json={"text": "hello", "target_lang": "ja"},
        headers={"X-Probe": probe},
    )
    http.get(f"{chat_url}/healthz")

    chat_seen = last_requests(http, chat_url)[-1]
    assert chat_seen["path"] == "/v1/chat/completions"
    assert chat_seen["method"] == "POST"
    assert chat_seen["query"] == "trace=1"
    # Names are lower-cased so lookups do not depend on how a client spelled them.
    assert chat_seen["headers"]["x-probe"] == probe
    assert chat_seen["headers"]["authorization"] == "Bearer forwarded"

    translator_seen = last_requests(http, translator_url)[-1]
    assert translator_seen["path"] == "/translate"
    assert translator_seen["headers"]["x-probe"] == probe

    # Health checks and the log itself are bookkeeping, not traffic worth recording.
    for url in (chat_url, translator_url):
        assert all(
            not entry["path"].startswith(("/healthz", "/_demo/"))
            for entry in last_requests(http, url)
        )


def test_last_requests_keep_only_the_latest_hundred(
    http: httpx.Client, translator_url: str
) -> None:
    for index in range(RECORDED_REQUESTS + 5):
        http.post(
            f"{translator_url}/translate",
            json={"text": "hi", "target_lang": "zh"},
            headers={"X-Seq": str(index)},
        )
    seen = last_requests(http, translator_url)
    assert len(seen) == RECORDED_REQUESTS
    assert [int(entry["headers"]["x-seq"]) for entry in seen] == list(
        range(5, RECORDED_REQUESTS + 5)
    )


# -------------------------------------------------------------------------------- lifecycle


def test_stop_closes_the_ports_and_is_idempotent() -> None:
    started, stop = run_in_thread(chunk_delay=0)
    ports = [agent.port for agent in started]
    assert len(set(ports)) == 2
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        for port in ports:
            assert client.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        stop()
        stop()
        for port in ports:
            with pytest.raises(httpx.ConnectError):
                client.get(f"http://127.0.0.1:{port}/healthz")


def test_stop_during_a_stream_finishes_it_without_the_pauses() -> None:
    # A pause long enough that the test would crawl if shutdown waited them out.
    started, stop = run_in_thread(chunk_delay=5.0)
    chat = next(agent for agent in started if agent.name == CHAT_AGENT_ID)
    request = {"messages": [{"role": "user", "content": "stop me"}], "stream": True}
    stopper = threading.Thread(target=stop)
    began = time.monotonic()
    try:
        with httpx.Client(timeout=10.0, trust_env=False) as client, client.stream(
            "POST", f"{chat.base_url}/v1/chat/completions", json=request
        ) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            stopper.start()
            rest = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    finally:
        if stopper.ident is None:  # the stream failed before the stop began
            stopper.start()
        stopper.join()
    assert json.loads(first[len("data: "):])["choices"][0]["delta"]["role"] == "assistant"
    assert rest[-1] == "[DONE]"
    assert len(rest) == len(expected_reply("stop me").split()) + 1
    assert time.monotonic() - began < 4.0


def test_start_demo_agents_in_a_running_loop() -> None:
    async def scenario() -> tuple[int, dict]:
        started, stop = await start_demo_agents(chunk_delay=0)
        try:
            translator = next(a for a in started if a.name == TRANSLATOR_AGENT_ID)
            async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
                response = await client.post(
                    f"{translator.base_url}/translate", json={"text": "bye", "target_lang": "ja"}
                )
                return response.status_code, response.json()
        finally:
            await stop()
            await stop()

    status, body = asyncio.run(scenario())
    assert status == 200
    assert body["data"] == {"message": "さようなら", "source_lang": "en"}


def test_negative_chunk_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="chunk_delay"):
        asyncio.run(start_demo_agents(chunk_delay=-1))
