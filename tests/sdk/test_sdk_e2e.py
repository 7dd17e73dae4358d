"""The SDK as an agent team and a caller use it, against a real platform."""

from __future__ import annotations

import concurrent.futures
import signal
import threading
import time

import httpx
import pytest

from agent_reach import Agent, AsyncReachClient, ReachClient
from agent_reach.errors import NoCapability, NoHealthyInstance, ReachError, UpstreamError
from registry.models import Instance
from tests.sdk.conftest import GatewayProcess, instance, needs_services, sdk_agent_process
from tests.support.waiting import wait_for

pytestmark = needs_services


def sdk_agent(name: str = "sdk-agent") -> tuple[Agent, threading.Event]:
    agent = Agent(name, description="an agent built with the SDK")
    release = threading.Event()

    @agent.capability("sdk.echo", description="echo the input")
    def echo(input, ctx):
        return {"echo": input, "request_id": ctx.request_id,
                "deadline_ms": ctx.deadline.left_ms() if ctx.deadline else None,
                "idempotency_key": ctx.idempotency_key}

    @agent.capability("sdk.words", description="stream words")
    async def words(input, ctx):
        for word in input["text"].split():
            yield word

    @agent.capability("sdk.counts", description="stream counts")
    def counts(input, ctx):
        for i in range(2):
            yield {"i": i}
        if input.get("report") or input.get("text") == "report":
            yield {"usage": {"input_tokens": 4, "output_tokens": 6}}

    @agent.capability("sdk.ask", description="asks for a language")
    def ask(input, ctx):
        if not input.get("language"):
            return ctx.ask("Which language?")
        return {"text": input["text"], "language": input["language"], "task": ctx.task_id}

    @agent.capability("sdk.stall", description="never finishes until released")
    def stall(input, ctx):
        release.wait(30)
        return {"released": True}

    return agent, release


def sdk_chat_agent() -> Agent:
    agent = Agent("sdk-chat", description="an OpenAI-compatible agent built with the SDK")

    @agent.chat("sdk.chat", description="a chat that streams")
    async def chat(messages, ctx):
        for word in ("you", "said", messages[-1]["content"]):
            yield word + " "

    return agent


def test_an_agent_speaks_one_protocol():
    chat = sdk_chat_agent()
    with pytest.raises(ValueError, match="OpenAI protocol only"):
        chat.capability("sdk.other")
    plain, _ = sdk_agent()
    with pytest.raises(ValueError, match="OpenAI protocol only"):
        plain.chat("sdk.chat")


def test_an_sdk_agent_registers_serves_heartbeats_and_is_called(platform):
    agent, _ = sdk_agent()
    running = agent.start(platform=platform.base, key=platform.manage_key, heartbeat_s=0.5)
    chatting = sdk_chat_agent().start(platform=platform.base, key=platform.manage_key)
    try:
        wait_for(lambda: running.beats >= 2, timeout=10, message="two heartbeats")
        with ReachClient(platform.base, platform.key) as reach:
            reply = reach.invoke("sdk.echo", input={"x": 1}, timeout=5,
                                 idempotency_key="sdk-1")
            streamed = list(reach.stream("sdk.words", input={"text": "one two three"}))
            task = reach.submit("sdk.ask", input={"text": "hello"})
            asked = reach.wait(task["task_id"], timeout=30)
            reach.send(task["task_id"], {"language": "fr"})
            done = reach.wait(task["task_id"], timeout=30)
            with pytest.raises(NoCapability):
                reach.invoke("sdk.nothing", input={})

        async def twin():
            async with AsyncReachClient(platform.base, platform.key) as reach:
                return (await reach.invoke("sdk.echo", input={"y": 2}),
                        [e async for e in reach.stream("sdk.words", input={"text": "a b"})])

        import asyncio

        async_reply, async_words = asyncio.run(twin())
        from openai import OpenAI

        openai = OpenAI(base_url=f"{platform.base}/v1", api_key=platform.key, max_retries=0)
        wait_for(lambda: httpx.get(f"{platform.base}/v1/route", params={
            "capability": "sdk.chat"}, headers={"Authorization": f"Bearer {platform.key}"}
        ).status_code == 200, timeout=10, message="the gateway to route to sdk-chat")
        chat = openai.chat.completions.create(
            model="sdk-chat", messages=[{"role": "user", "content": "hi"}])
        chat_stream = [c.choices[0].delta.content for c in openai.chat.completions.create(
            model="sdk-chat", stream=True, messages=[{"role": "user", "content": "yo"}])
            if c.choices and c.choices[0].delta.content]
        # A plain generator through the chat door: each event is content, text or not.
        counted = [c.choices[0].delta.content for c in openai.chat.completions.create(
            model="capability:sdk.counts", stream=True,
            messages=[{"role": "user", "content": "count"}])
            if c.choices and c.choices[0].delta.content]
        # Usage asked for, none streamed by the agent: the gateway's own count comes.
        usages = {model: [c.usage for c in openai.chat.completions.create(
            model=model, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "one two three"}]) if c.usage]
            for model in ("sdk-chat", "capability:sdk.counts")}
        # ... and a plain generator's own usage event reaches the caller in chat shape.
        reported_chunks = [c.usage for c in openai.chat.completions.create(
            model="capability:sdk.counts", stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "report"}]) if c.usage]
        # ... and called without a stream, its events read whole are the answer.
        with ReachClient(platform.base, platform.key) as reach:
            whole = reach.invoke("sdk.words", input={"text": "one two"})
            reported = reach.invoke("sdk.counts", input={"report": True})
        whole_chat = openai.chat.completions.create(
            model="capability:sdk.words", messages=[{"role": "user", "content": "a b"}])
    finally:
        running.stop()
        chatting.stop()

    assert chat.choices[0].message.content == "you said hi "  # an @agent.chat handler
    assert chat_stream == ["you ", "said ", "yo "]  # ... streamed chunk by chunk
    assert counted == ['{"i":0}', '{"i":1}']
    for model, usage in usages.items():
        assert len(usage) == 1 and usage[0].completion_tokens > 0, (model, usage)
    assert [(u.prompt_tokens, u.completion_tokens) for u in reported_chunks] == [(4, 6)]
    assert whole["output"] == {"events": [{"text": "one"}, {"text": "two"}], "text": "onetwo"}
    # What its events reported is the reply's usage, as it is what is metered.
    assert (reported["usage"]["input_tokens"], reported["usage"]["output_tokens"]) == (4, 6)
    assert whole_chat.choices[0].message.content == "ab"

    assert reply["output"]["echo"] == {"x": 1} and reply["agent"] == "sdk-agent"
    assert reply["output"]["idempotency_key"] == "sdk-1"
    assert 0 < reply["output"]["deadline_ms"] <= 5000  # the caller's deadline, passed on
    assert streamed == [{"text": "one"}, {"text": "two"}, {"text": "three"}]
    assert (asked["state"], asked["message"]) == ("input-required", "Which language?")
    assert done["state"] == "completed"
    assert done["result"]["output"] == {"text": "hello", "language": "fr",
                                        "task": task["task_id"]}
    assert async_reply["output"]["echo"] == {"y": 2}
    assert async_words == [{"text": "a"}, {"text": "b"}]
    assert Instance.objects.get(pk=running.registration.instance_id).state == "draining"


def test_a_stalled_handler_turns_its_instance_sub_healthy_within_one_heartbeat(platform):
    agent, release = sdk_agent("sdk-stalling")
    running = agent.start(platform=platform.base, key=platform.manage_key, heartbeat_s=1.0)
    pk = running.registration.instance_id
    try:
        with ReachClient(platform.base, platform.key) as reach, \
                concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(lambda: _quietly(reach.invoke, "sdk.stall", input={},
                                                   timeout=20))
            wait_for(lambda: agent.counters.in_flight == 1, timeout=10,
                     message="the call to reach the handler")
            stalled_at = time.monotonic()
            wait_for(lambda: instance(pk).health_tier == "sub_healthy", timeout=10,
                     interval=0.05, message="the instance to turn sub-healthy")
            took = time.monotonic() - stalled_at
            # ... and callers are kept away from it once the gateway has the change.
            wait_for(lambda: isinstance(_quietly(reach.invoke, "sdk.echo", input={},
                                                 timeout=5), NoHealthyInstance),
                     timeout=5, message="the gateway to keep callers away")
            release.set()
            pending.result(timeout=20)
            wait_for(lambda: instance(pk).health_tier == "healthy", timeout=10,
                     message="the instance to be healthy again")
    finally:
        release.set()
        running.stop()
    # One heartbeat interval (1 s) and the time to deliver it: not hidden for long.
    assert took <= 2.5, took


def answers(reach: ReachClient, capability: str) -> bool:
    """Whether ``capability`` answers through ``reach`` now (the refusal is printed)."""
    outcome = _quietly(reach.invoke, capability, input={}, timeout=5)
    if isinstance(outcome, ReachError):
        dry = httpx.get(f"{reach.base_url}/v1/route", params={"capability": capability},
                        headers=reach._auth).json()
        print(f"not yet: {outcome} {dry}")
        return False
    return True


def _quietly(function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except ReachError as error:
        return error


def test_an_agent_the_platform_forgot_registers_again(platform):
    agent, _ = sdk_agent("sdk-forgotten")
    running = agent.start(platform=platform.base, key=platform.manage_key, heartbeat_s=0.5)
    try:
        first = running.registration.instance_id
        Instance.objects.filter(pk=first).delete()
        wait_for(lambda: running.registrations == 2, timeout=10,
                 message="the agent to register again")
        with ReachClient(platform.base, platform.key) as reach:
            wait_for(lambda: not isinstance(_quietly(reach.invoke, "sdk.echo", input={}),
                                            ReachError), timeout=10,
                     message="the agent to be callable again")
    finally:
        running.stop()
    assert running.registration.instance_id != first


def test_an_agent_deleted_by_an_operator_registers_again(platform):
    """Its token dies with it (401): it registers again with the key it started with."""
    from registry.models import Agent as AgentRow

    agent, _ = sdk_agent("sdk-deleted")
    running = agent.start(platform=platform.base, key=platform.manage_key, heartbeat_s=0.5)
    try:
        first = running.registration
        AgentRow.objects.filter(pk=first.agent_id).delete()
        wait_for(lambda: running.registrations == 2, timeout=10,
                 message="the agent to register again")
        with ReachClient(platform.base, platform.key) as reach:
            wait_for(lambda: not isinstance(_quietly(reach.invoke, "sdk.echo", input={}),
                                            ReachError), timeout=10,
                     message="the agent to be callable again")
    finally:
        running.stop()
    assert running.registration.agent_token != first.agent_token


def test_an_agent_started_before_the_platform_waits_for_it(platform):
    from tests.support.forwarder import Forwarder

    agent, _ = sdk_agent("sdk-early")
    with Forwarder.for_url(platform.base) as door:
        door.cut()  # the platform is not up yet
        started: list = []
        thread = threading.Thread(target=lambda: started.append(agent.start(
            platform=door.url(platform.base), key=platform.manage_key, heartbeat_s=0.5)))
        thread.start()
        wait_for(lambda: door.refused >= 2, timeout=15, message="tries against the door")
        assert not started  # still waiting, not failed
        door.restore()
        thread.join(timeout=20)
        try:
            assert started and started[0].registration.instance_id
        finally:
            for running in started:
                running.stop()


def in_handler(proc) -> None:
    """Wait until the agent process says a call of ``sdk.slow`` is in its handler."""
    with concurrent.futures.ThreadPoolExecutor(1) as reader:
        line = reader.submit(proc.stdout.readline).result(timeout=20)
    assert line.strip() == "CALLED sdk.slow", line


def test_a_handler_stuck_past_the_grace_period_does_not_keep_the_process(platform):
    with sdk_agent_process(platform.base, platform.manage_key, "direct",
                           grace_s="1") as (proc, _), \
            ReachClient(platform.base, platform.key) as reach, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        wait_for(lambda: answers(reach, "sdk.echo"), timeout=15, message="the agent")
        pending = pool.submit(_quietly, reach.invoke, "sdk.slow", input={"s": 60},
                              timeout=90)
        in_handler(proc)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        proc.wait(timeout=30)
        exited_in = time.monotonic() - signalled
        error = pending.result(timeout=30)

    assert isinstance(error, ReachError) and error.status in (502, 503, 504), error
    assert exited_in < 10, exited_in  # the grace (1 s) and leaving, not the 60 s handler


def test_sigterm_deregisters_the_agent_and_lets_calls_in_flight_finish(platform):
    with sdk_agent_process(platform.base, platform.manage_key, "direct") as (proc, pk), \
            ReachClient(platform.base, platform.key) as reach, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(reach.invoke, "sdk.slow", input={"s": 2}, timeout=20)
        in_handler(proc)
        proc.send_signal(signal.SIGTERM)
        reply = pending.result(timeout=20)
        code = proc.wait(timeout=20)
        bye = proc.stdout.read()
        after = _quietly(reach.invoke, "sdk.echo", input={}, timeout=5)

    assert reply["output"] == {"slept": 2}
    assert code == 0 and "BYE" in bye
    assert instance(pk).state == "draining"
    assert isinstance(after, NoHealthyInstance)


def test_a_tunnelled_agent_is_reached_through_either_gateway_and_after_a_restart(
        platform, tmp_path):
    first = GatewayProcess(tmp_path, "gateway-1").start()
    second = GatewayProcess(tmp_path, "gateway-2").start()
    try:
        with sdk_agent_process(platform.base, platform.manage_key, "tunnel",
                               gateway=first.base) as (_, pk):
            assert instance(pk).reach_mode == "tunnel"
            replies = {}
            for gateway in (first, second, first, second):
                with ReachClient(gateway.base, platform.key) as reach:
                    wait_for(lambda reach=reach: answers(reach, "sdk.echo"), timeout=15,
                             message=f"{gateway.base} to reach the tunnel")
                    replies[gateway.base] = (
                        reach.invoke("sdk.echo", input={"via": gateway.base}),
                        list(reach.stream("sdk.words", input={"text": "over the tunnel"})))
            # Many relayed at once (the second gateway does not hold the tunnel).
            with ReachClient(second.base, platform.key) as reach, \
                    concurrent.futures.ThreadPoolExecutor(10) as pool:
                def timed(n: int) -> tuple[dict, float]:
                    started = time.monotonic()
                    reply = reach.invoke("sdk.echo", input={"n": n}, timeout=20)
                    return reply, time.monotonic() - started
                burst = list(pool.map(timed, range(20)))
            first.stop()
            first.start()
            back = time.monotonic()
            with ReachClient(second.base, platform.key) as reach:
                wait_for(lambda: not isinstance(
                    _quietly(reach.invoke, "sdk.echo", input={}, timeout=3), ReachError),
                    timeout=15, interval=0.1, message="the tunnel to be back")
            reachable_after = time.monotonic() - back
    finally:
        first.stop()
        second.stop()

    for base, (reply, words) in replies.items():
        assert reply["output"]["echo"] == {"via": base}
        assert words == [{"text": "over"}, {"text": "the"}, {"text": "tunnel"}]
    assert reachable_after <= 5.0, reachable_after
    assert [r["output"]["echo"] for r, _ in burst] == [{"n": n} for n in range(20)]
    # Relayed calls waited on one another's Redis reads (5 s each) once: a wide margin
    # over the milliseconds a relay takes, far under that stall.
    assert max(took for _, took in burst) < 4.0, [round(t, 2) for _, t in burst]
    for gateway in (first, second):
        assert "tunnel relay failed" not in gateway.log.read_text()


def test_a_gateway_killed_while_holding_a_tunnel_is_noticed_in_seconds(platform, tmp_path):
    """kill -9 of the holding gateway: the others stop routing to the tunnel within a few
    seconds (a call meanwhile fails fast, it does not wait out its deadline), and the
    tunnel is back within 5 s of the gateway's restart."""
    first = GatewayProcess(tmp_path, "gateway-1").start()
    second = GatewayProcess(tmp_path, "gateway-2").start()
    try:
        with sdk_agent_process(platform.base, platform.manage_key, "tunnel",
                               gateway=first.base) as _agent, \
                ReachClient(second.base, platform.key) as reach:
            wait_for(lambda: answers(reach, "sdk.echo"), timeout=15, message="the relay")
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(timeout=10)
            killed = time.monotonic()
            during = _quietly(reach.invoke, "sdk.echo", input={}, timeout=20)
            failed_in = time.monotonic() - killed

            def dropped() -> bool:
                dry = httpx.get(f"{second.base}/v1/route", params={"capability": "sdk.echo"},
                                headers=reach._auth).json()
                return any(d.get("reason") == "tunnel_down"
                           for d in dry.get("route", dry).get("dropped", []))
            wait_for(dropped, timeout=15, interval=0.1, message="the tunnel to be down")
            down_in = time.monotonic() - killed
            first.start()
            back = time.monotonic()
            wait_for(lambda: not isinstance(
                _quietly(reach.invoke, "sdk.echo", input={}, timeout=3), ReachError),
                timeout=15, interval=0.1, message="the tunnel to be back")
            back_in = time.monotonic() - back
    finally:
        first.stop()
        second.stop()

    assert isinstance(during, ReachError) and during.status in (502, 503), during
    assert failed_in <= 5.0, failed_in
    assert down_in <= 6.0, down_in  # the holder's records lapse 3 s after its last renewal
    assert back_in <= 5.0, back_in


def test_kill_9_of_a_tunnelled_agent_mid_call_gives_the_caller_an_error_at_once(platform):
    with sdk_agent_process(platform.base, platform.manage_key, "tunnel") as (proc, _), \
            ReachClient(platform.base, platform.key) as reach, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        wait_for(lambda: not isinstance(_quietly(reach.invoke, "sdk.echo", input={}),
                                        ReachError), timeout=15, message="the tunnel")
        pending = pool.submit(_quietly, reach.invoke, "sdk.slow", input={"s": 30},
                              timeout=60)
        in_handler(proc)
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        error = pending.result(timeout=30)
        answered = time.monotonic() - killed

    assert isinstance(error, UpstreamError | NoHealthyInstance), error
    assert error.status in (502, 503)
    assert answered <= 5.0, answered


@pytest.mark.parametrize("reach", ["direct", "tunnel"])
def test_the_sidecar_makes_a_plain_service_callable_and_reports_it_unhealthy(
        platform, tmp_path, reach):
    import os
    import subprocess
    import sys

    from tests.support.servers import ROOT, free_port
    from tests.tasks.conftest import start_helper

    port = free_port()
    service = start_helper("tests.agents.task_agent", str(port))
    config = tmp_path / "sidecar.yaml"
    config.write_text(f"""
platform: {platform.base}
key_env: SIDECAR_KEY
service: http://127.0.0.1:{port}
health: /healthz
probe_interval_s: 0.2
heartbeat_s: 1
reach: {reach}
agent:
  name: legacy-{reach}
  description: A plain HTTP service behind the sidecar
  capabilities:
    - id: legacy.work.{reach}
      description: does work
      endpoints: [{{path: /work}}]
""")
    log = tmp_path / "sidecar.log"
    with log.open("wb") as out:
        sidecar = subprocess.Popen([sys.executable, "-m", "agent_reach.sidecar", "--config",
                                    str(config)], cwd=ROOT, stdout=out,
                                   stderr=subprocess.STDOUT,
                                   env={**os.environ, "SIDECAR_KEY": platform.manage_key})
    try:
        wait_for(lambda: "READY" in log.read_text(), timeout=20,
                 message="the sidecar to start")
        with ReachClient(platform.base, platform.key) as reach_client:
            wait_for(lambda: not isinstance(_quietly(
                reach_client.invoke, f"legacy.work.{reach}", input={"n": 1}), ReachError),
                timeout=20, message="the service to be callable")
            reply = reach_client.invoke(f"legacy.work.{reach}", input={"n": 2})
            service.kill()
            service.wait(timeout=10)
            pk = Instance.objects.get(agent__name=f"legacy-{reach}").pk
            wait_for(lambda: instance(pk).health_tier == "sub_healthy", timeout=10,
                     message="the sidecar to report the service unhealthy")
            # The database knows first; the gateway's table follows through the bus. A
            # dry run calls nobody, so waiting on it sends nothing to the dead service.
            wait_for(lambda: httpx.get(
                f"{platform.base}/v1/route", params={"capability": f"legacy.work.{reach}"},
                headers={"Authorization": f"Bearer {platform.key}"}).status_code == 503,
                timeout=10, message="the gateway to drop the unhealthy instance")
            after = _quietly(reach_client.invoke, f"legacy.work.{reach}", input={})
    finally:
        sidecar.terminate()
        sidecar.wait(timeout=15)
        if service.poll() is None:
            service.kill()
        service.wait(timeout=10)
        service.stdout.close()

    assert reply["output"]["done"] == {"n": 2}
    assert isinstance(after, NoHealthyInstance)
    assert httpx.get(f"{platform.base}/healthz").status_code == 200
