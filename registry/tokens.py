"""Agent tokens: issued at registration, they let one agent act for itself only
(re-register, heartbeat, deregister, report on its tasks, hold its tunnel). Stored like API
keys: a visible prefix and the SHA-256 of the whole token."""

from __future__ import annotations

from reach_core import keys
from registry.models import Agent, AgentToken

AGENT_TOKEN_MARK = "rat_"  # noqa: S105  (a prefix, not a secret)


def agent_token_issue(*, agent: Agent) -> str:
    plaintext, prefix, key_hash = keys.generate(AGENT_TOKEN_MARK)
    AgentToken.objects.create(agent=agent, prefix=prefix, key_hash=key_hash)
    return plaintext


def agent_token_authenticate(*, plaintext: str) -> AgentToken | str:
    """The token for ``plaintext``, or the reason it is refused."""
    prefix = keys.prefix_of(plaintext, AGENT_TOKEN_MARK)
    if prefix is None:
        return "Agent token is malformed."
    token = (
        AgentToken.objects.select_related("agent__owner_tenant").filter(prefix=prefix).first()
    )
    if token is None or not keys.matches(plaintext, token.key_hash):
        return "Agent token is not known."
    if token.revoked_at is not None:
        return "Agent token has been revoked."
    if not token.agent.owner_tenant.is_active:
        return "The agent's tenant is disabled."
    return token
