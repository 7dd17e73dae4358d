"""Callback deliveries: a signed POST of the task to the caller's URL, retried until a 2xx.

The body is the task as ``GET /v1/tasks/<id>`` shows it (without its history), plus the
``delivery_id``; it is sent only after the task row holds it (``tasks.services``).
Headers::

    X-Reach-Delivery:  the delivery id (the same on every attempt of this announcement)
    X-Reach-Task:      the task id
    X-Reach-Timestamp: seconds since the epoch, when this attempt was signed
    X-Reach-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" with the secret>
    Idempotency-Key:   the task's key (the caller's own, if it sent one)
    X-Request-ID:      the submission's request id

The URL goes through the endpoint policy at delivery time too, resolved once and pinned
(``reach_platform.outbound``), so a name re-pointed at a refused address is refused then.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
from django.conf import settings
from django.db import close_old_connections

from reach_core.endpoints import EndpointRefused
from reach_platform.endpoints import endpoint_policy
from reach_platform.outbound import FetchFailed, bounded_request
from tasks.models import CallbackDelivery
from tasks.selectors import task_view
from tasks.services import deliveries_claim, delivery_record, signing_secret_value

logger = logging.getLogger(__name__)

ANSWER_MAX_BYTES = 4096
BATCH = 32


def signature(secret: str, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body,
                                hashlib.sha256).hexdigest()


def delivery_body(delivery: CallbackDelivery) -> bytes:
    task = delivery.task
    view = task_view(task, history=False)
    view.pop("callback", None)
    return orjson.dumps({"delivery_id": str(delivery.pk), "announces": delivery.state,
                         "task": view})


def delivery_send(delivery: CallbackDelivery) -> tuple[int | None, str]:
    """One attempt: ``(HTTP status or None, error text)``. Never raises for the network."""
    task = delivery.task
    if task.signing_secret is None:
        return None, "the task's signing secret was deleted"
    return signed_post(task.callback_url, signing_secret_value(task.signing_secret),
                       delivery_body(delivery), (
                           (b"X-Reach-Delivery", str(delivery.pk).encode()),
                           (b"X-Reach-Task", str(task.pk).encode()),
                           (b"Idempotency-Key", task.idempotency_key.encode()),
                           (b"X-Request-ID", task.request_id.encode())))


def signed_post(url: str, secret: str, body: bytes,
                headers: tuple[tuple[bytes, bytes], ...]) -> tuple[int | None, str]:
    """One signed JSON POST under the endpoint policy (a task's callback, an alert):
    ``(HTTP status or None, error text)``, a 2xx is an acknowledgement. Never raises for
    the network."""
    timestamp = str(int(time.time()))
    headers = ((b"Content-Type", b"application/json"), *headers,
               (b"X-Reach-Timestamp", timestamp.encode()),
               (b"X-Reach-Signature", signature(secret, timestamp, body).encode()))
    try:
        answer = bounded_request("POST", url, endpoint_policy(), max_bytes=ANSWER_MAX_BYTES,
                                 deadline_s=settings.CALLBACK_TIMEOUT_S,
                                 connect_timeout_s=min(2.0, settings.CALLBACK_TIMEOUT_S),
                                 headers=headers, body=body)
    except EndpointRefused as exc:
        return None, f"refused by the endpoint policy: {exc}"
    except (FetchFailed, OSError) as exc:
        return None, str(exc) or type(exc).__name__
    return answer.status, "" if 200 <= answer.status < 300 else f"HTTP {answer.status}"


def _deliver(delivery: CallbackDelivery) -> None:
    try:
        status, error = delivery_send(delivery)
        delivery_record(delivery=delivery, status=status, error=error)
    finally:
        close_old_connections()


def deliver_due(*, limit: int = BATCH) -> dict[str, int]:
    """Post the deliveries that are due, a few at a time; returns counts by result."""
    due = deliveries_claim(limit=limit)
    for delivery in due:  # their tasks, read now: a thread must not lazy-load them
        delivery.task = (type(delivery.task).objects.select_related("agent", "signing_secret")
                         .get(pk=delivery.task_id))
    if not due:
        return {"attempted": 0}
    with ThreadPoolExecutor(max_workers=min(8, len(due))) as pool:
        list(pool.map(_deliver, due))
    return {"attempted": len(due)}
