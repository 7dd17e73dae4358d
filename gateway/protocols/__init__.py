"""Agent protocols, registered by name: ``PROTOCOLS["openai" | "http" | "a2a"]``.

Adding a protocol is one module with an ``AgentProtocol`` subclass and one entry
below; nothing else in the gateway tests a protocol's name.
"""

from __future__ import annotations

from gateway.protocols.a2a import A2AProtocol
from gateway.protocols.base import AgentProtocol, AgentResponse, StreamMeter, UpstreamRequest
from gateway.protocols.http import HttpProtocol
from gateway.protocols.openai import OpenAIProtocol
from reach_core.kinds import Protocol

PROTOCOLS: dict[str, AgentProtocol] = {
    Protocol.OPENAI: OpenAIProtocol(),
    Protocol.HTTP: HttpProtocol(),
    Protocol.A2A: A2AProtocol(),
}

__all__ = ["PROTOCOLS", "AgentProtocol", "AgentResponse", "StreamMeter", "UpstreamRequest"]
