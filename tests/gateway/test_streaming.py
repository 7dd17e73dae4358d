"""Streams through a real gateway: idle timeouts, client disconnects, usage, credentials."""

from __future__ import annotations

import time

import pytest

from tests import factories
from tests.support.metrics import scrape
from tests.support.waiting import wait_for


def _tokens(gateway, direction: str) -> float:
    return scrape(gateway.base, "reach_tokens_total", {"direction": direction}) or 0.0


def stream_events(gateway, text: str) -> list[str]:
    with gateway.client() as client, client.stream("POST", "/v1/invoke", json={
        "capability": "chat.scripted", "stream": True, "input": {"text": text},
    }) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(response.iter_bytes()).decode()
    return [e for e in raw.split("\n\n") if e.strip()]


def test_a_stream_is_relayed_event_by_event_and_its_usage_counted(gateway):
    before = _tokens(gateway, "output")
    events = stream_events(gateway, "one two three four five six")
    chunks = [e for e in events if "chat.completion.chunk" in e]
    assert len(chunks) == 6 and events[-1] == "data: [DONE]"
    assert all(e.startswith("data: {") or e == "data: [DONE]" or '"usage"' in e
               for e in events)
    # Metered after the stream closes, so possibly after we have read it all.
    wait_for(lambda: _tokens(gateway, "output") >= before + 6, timeout=5,
             message="the stream's tokens to be counted")


@pytest.mark.gateway_env(REACH_GATEWAY_STREAM_IDLE_S="0.5")
def test_an_idle_stream_ends_with_an_error_event_not_a_fake_done(gateway):
    started = time.monotonic()
    events = stream_events(gateway, "stall after 2 words then nothing")
    assert time.monotonic() - started < 5
    assert len([e for e in events if "chat.completion.chunk" in e]) == 2
    assert events[-1].startswith("event: error") and "upstream_timeout" in events[-1]
    assert not any("[DONE]" in e for e in events)


def test_a_client_that_goes_away_cancels_the_upstream_call(gateway):
    words = " ".join(f"w{i}" for i in range(200))  # 200 words, 50 ms apart: 10 s
    with gateway.client() as client, client.stream("POST", "/v1/invoke", json={
        "capability": "chat.scripted", "stream": True, "input": {"text": f"slowly {words}"},
    }) as response:
        for chunk in response.iter_raw():
            if b"chat.completion.chunk" in chunk:
                break  # leave after the first event: the context closes the connection
    [cancelled] = wait_for(lambda: [s for s in gateway.seen() if "cancelled_at_word" in s],
                           timeout=5, message="the agent to stop streaming to nobody")
    assert cancelled["cancelled_at_word"] < 100


def test_credentials_are_injected_after_routing_and_never_the_callers_key(gateway):
    from registry.models import Agent

    agent = Agent.objects.get(name="scripted")
    factories.credential(tenant=gateway.tenant, agent=agent, secret="header-secret-1",
                         kind="header", field_name="X-Api-Token")
    factories.credential(tenant=gateway.tenant, agent=agent, secret="query-secret-2",
                         kind="query", field_name="api_key")
    deadline = time.monotonic() + 15
    with gateway.client() as client:
        while True:  # the gateway learns of the new credentials from the route table
            response = client.post("/v1/invoke", json={"capability": "echo.all",
                                                       "input": {"x": 1}})
            output = response.json()["output"]
            headers = {k.lower(): v for k, v in output["headers"].items()}
            if headers.get("x-api-token"):
                break
            assert time.monotonic() < deadline, "credentials never reached the gateway"
            time.sleep(0.2)
    assert headers["x-api-token"] == "header-secret-1"
    assert output["query"] == {"api_key": "query-secret-2"}
    assert gateway.key not in str(output)
    assert "header-secret-1" not in response.headers.get("x-request-id", "")


def test_the_callers_deadline_ends_a_stream_that_keeps_dripping(gateway):
    """X-Reach-Deadline-Ms bounds the whole stream, not only its first byte: an agent
    sending an event every 50 ms for 10 s is cut off at the caller's 1 s, with a
    ``deadline_exceeded`` error event, and told so by its connection closing."""
    words = " ".join(f"w{i}" for i in range(200))
    with gateway.client() as client, client.stream("POST", "/v1/invoke", headers={
        "X-Reach-Deadline-Ms": "1000"}, json={
        "capability": "chat.scripted", "stream": True, "input": {"text": f"slowly {words}"},
    }) as response:
        assert response.status_code == 200
        raw = b"".join(response.iter_bytes()).decode()
    events = [e for e in raw.split("\n\n") if e.strip()]
    relayed = [e for e in events if "chat.completion.chunk" in e]
    assert 0 < len(relayed) < 200
    assert events[-1].startswith("event: error") and "deadline_exceeded" in events[-1]
    assert not any("[DONE]" in e for e in events)
    [cancelled] = wait_for(lambda: [s for s in gateway.seen() if "cancelled_at_word" in s],
                           timeout=5, message="the agent to see its caller's deadline")
    assert cancelled["cancelled_at_word"] < 200


def test_a_stream_of_many_tiny_events_never_holds_other_calls(gateway):
    """helper-50: an agent's piece of 80,000 comment events ("\\:\\n\\n") held the gateway's
    event loop for 25 s, every other call and heartbeat waiting: the framer recopied and
    rescanned the piece per event. Now it scans each byte once and the relay gives the
    loop back every ``EVENTS_PER_TURN`` events: a call made while such a stream is being
    relayed is answered before the stream ends."""
    import threading

    done: dict[str, float] = {}
    began = threading.Event()

    def stream() -> None:
        with gateway.client() as client, client.stream("POST", "/v1/invoke", json={
            "capability": "chat.scripted", "stream": True,
            "input": {"text": "tiny events 12 80000"},
        }, timeout=300) as response:
            assert response.status_code == 200
            began.set()
            raw = b"".join(response.iter_bytes())
        done["stream"] = time.monotonic()
        assert raw.count(b":\n\n") == 12 * 80000 and raw.endswith(b"data: [DONE]\n\n")

    streaming = threading.Thread(target=stream)
    streaming.start()
    assert began.wait(30)
    with gateway.client() as client:
        reply = client.post("/v1/invoke", json={"capability": "echo.all",
                                                "input": {"text": "still here"}})
    done["call"] = time.monotonic()
    streaming.join(300)
    assert reply.status_code == 200 and "stream" in done
    assert done["call"] < done["stream"]
