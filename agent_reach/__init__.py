"""The Agent-Reach Python SDK: what agents import to register and stay registered.

    from agent_reach import ControlPlane

    cp = ControlPlane("http://127.0.0.1:8000", token=REGISTRATION_KEY)
    reg = cp.register(descriptor)            # dict (JSON descriptor / Agent Card) or YAML text
    beat = cp.keep_alive(reg, load=lambda: {"cpu": 0.2})   # background heartbeats
    ...
    beat.stop(); cp.deregister(reg)

Plain ``httpx``; no Django. Errors from the platform raise ``ReachError``
carrying the structured error body.
"""

from agent_reach.control import ControlPlane, HeartbeatLoop, ReachError, Registration

__all__ = ["ControlPlane", "HeartbeatLoop", "ReachError", "Registration"]
