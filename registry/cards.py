"""Fetching an A2A Agent Card by URL, with the same endpoint safety as agents' endpoints."""

from __future__ import annotations

import httpx
import orjson

from reach_core.endpoints import EndpointRefused, check_registration, resolve_and_check_blocking
from registry.spec import DescriptorError

MAX_CARD_BYTES = 1024 * 1024
CARD_TIMEOUT = httpx.Timeout(5.0, connect=2.0)


def fetch_agent_card(url: str, policy) -> dict:
    """GET the card at ``url``; raises ``DescriptorError`` at path ``card_url`` on any failure."""

    def refuse(message: str) -> DescriptorError:
        return DescriptorError({"card_url": [message]})

    try:
        url = check_registration(url, policy)
        resolve_and_check_blocking(url, policy)
    except EndpointRefused as exc:
        raise refuse(str(exc)) from exc
    except OSError as exc:
        raise refuse(f"cannot resolve host: {exc}") from exc
    try:
        with httpx.Client(timeout=CARD_TIMEOUT, follow_redirects=False, trust_env=False) as c, \
                c.stream("GET", url, headers={"Accept": "application/json"}) as response:
            if response.status_code != 200:
                raise refuse(f"fetching the card answered HTTP {response.status_code}")
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_CARD_BYTES:
                    raise refuse(f"the card is larger than {MAX_CARD_BYTES} bytes")
    except httpx.HTTPError as exc:
        raise refuse(f"fetching the card failed: {type(exc).__name__}") from exc
    try:
        card = orjson.loads(bytes(body))
    except orjson.JSONDecodeError as exc:
        raise refuse(f"the card is not JSON: {exc}") from exc
    if not isinstance(card, dict):
        raise refuse("the card is not a JSON object")
    return card

