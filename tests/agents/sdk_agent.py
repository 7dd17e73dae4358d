"""An agent built with the SDK, in a process of its own, for tests that signal or kill it.

    python -m tests.agents.sdk_agent PLATFORM KEY {direct|tunnel} [GATEWAY]

Capabilities: ``sdk.echo`` (echo the input), ``sdk.slow`` (sleep ``input.s`` seconds, then
answer), ``sdk.words`` (stream the words of ``input.text``). Heartbeats every second.
Prints ``READY <instance id>`` once registered (and its tunnel up), serves until SIGTERM
(then leaves gracefully, ``agent.serve``'s way) and prints ``BYE``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from agent_reach import Agent

agent = Agent("sdk-proc-agent", description="the SDK test agent in its own process")


@agent.capability("sdk.echo", description="echo the input")
def echo(input, ctx):
    return {"echo": input, "task": ctx.task_id}


@agent.capability("sdk.slow", description="answer after a while")
def slow(input, ctx):
    print("CALLED sdk.slow", flush=True)
    time.sleep(float(input.get("s", 1)))
    return {"slept": input.get("s", 1)}


@agent.capability("sdk.words", description="stream words")
def words(input, ctx):
    yield from str(input.get("text", "")).split()


def main() -> None:
    platform, key, reach = sys.argv[1], sys.argv[2], sys.argv[3]
    gateway = sys.argv[4] if len(sys.argv) > 4 else None
    running = agent.start(platform=platform, key=key, reach=reach, gateway_url=gateway,
                          heartbeat_s=1.0,
                          grace_s=float(os.environ.get("SDK_AGENT_GRACE_S", "10")))
    if running.tunnel is not None:
        running.tunnel.connected.wait(10)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"READY {running.registration.instance_id}", flush=True)
    stop.wait()
    running.leave()
    print("BYE", flush=True)


if __name__ == "__main__":
    main()
