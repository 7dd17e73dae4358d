"""Fetching an A2A Agent Card by URL, with the same endpoint safety as agents' endpoints.

The fetch is bounded like a probe (``reach_platform.outbound.bounded_get``): pinned to the
checked address, no redirects, at most ``MAX_CARD_BYTES`` read, one deadline.
"""

from __future__ import annotations

import orjson

from reach_core.endpoints import BlockingResolver, EndpointRefused, check_registration
from reach_platform.outbound import FetchFailed, bounded_get
from registry.spec import DescriptorError

MAX_CARD_BYTES = 256 * 1024
CARD_DEADLINE_S = 5.0
CARD_CONNECT_TIMEOUT_S = 2.0


def fetch_agent_card(url: str, policy, *, resolver: BlockingResolver | None = None) -> dict:
    """GET the card at ``url``; raises ``DescriptorError`` at path ``card_url`` on any failure."""

    def refuse(message: str) -> DescriptorError:
        return DescriptorError({"card_url": [message]})

    try:
        url = check_registration(url, policy)
        response = bounded_get(
            url, policy, max_bytes=MAX_CARD_BYTES, deadline_s=CARD_DEADLINE_S,
            connect_timeout_s=CARD_CONNECT_TIMEOUT_S, headers=((b"Accept", b"application/json"),),
            resolver=resolver,
        )
    except EndpointRefused as exc:
        raise refuse(str(exc)) from exc
    except OSError as exc:
        raise refuse(f"cannot resolve host: {exc}") from exc
    except FetchFailed as exc:
        raise refuse(f"fetching the card failed: {exc}") from exc
    if 300 <= response.status < 400:
        raise refuse(f"fetching the card answered HTTP {response.status}: "
                     "redirects are not followed")
    if response.status != 200:
        raise refuse(f"fetching the card answered HTTP {response.status}")
    if not response.complete:
        raise refuse(f"the card is larger than {MAX_CARD_BYTES} bytes")
    try:
        card = orjson.loads(response.body)
    except orjson.JSONDecodeError as exc:
        raise refuse(f"the card is not JSON: {exc}") from exc
    if not isinstance(card, dict):
        raise refuse("the card is not a JSON object")
    return card
