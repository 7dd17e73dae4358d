"""The Agent-Reach Python SDK, for agents and for callers.

Agents::

    from agent_reach import Agent

    agent = Agent("doc-summary-agent")            # or Agent.from_yaml("capability.yaml")

    @agent.capability("summarize_document")
    def summarize(input, ctx):
        return {"summary": input["text"][:200]}

    agent.serve(platform="http://127.0.0.1:8000", key=REGISTRATION_KEY)

Callers::

    from agent_reach import ReachClient

    with ReachClient("http://127.0.0.1:8000", API_KEY) as reach:
        reach.invoke("summarize_document", input={"text": "..."}, timeout=8)

Plain ``httpx`` and ``aiohttp``; no Django. Refusals raise the typed exceptions of
``agent_reach.errors`` (``RateLimited``, ``NoCapability``, ``DeadlineExceeded``, ...).
"""

from agent_reach.agent import Agent, Ask, Context, RunningAgent
from agent_reach.client import AsyncReachClient, Deadline, ReachClient
from agent_reach.control import ControlPlane, HeartbeatLoop, Registration
from agent_reach.errors import (
    DeadlineExceeded,
    GatewayUnreachable,
    NeedsConfirmation,
    NoCapability,
    NoHealthyInstance,
    RateLimited,
    ReachError,
)

__all__ = [
    "Agent", "Ask", "AsyncReachClient", "Context", "ControlPlane", "Deadline",
    "DeadlineExceeded", "GatewayUnreachable", "HeartbeatLoop", "NeedsConfirmation",
    "NoCapability",
    "NoHealthyInstance", "RateLimited", "ReachClient", "ReachError", "Registration", "RunningAgent",
]
