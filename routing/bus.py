"""Transports for route-table messages: in-process, or Redis pub/sub.

A message is a JSON-able dict (``routing.table`` wire format). Delivery is
at-most-once and may reorder across publishers; the subscriber's version
check turns any loss or reordering into a full reload, so the bus can stay
simple.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import orjson

logger = logging.getLogger(__name__)

Callback = Callable[[dict], None]


class Subscription:
    def __init__(self, close: Callable[[], None]) -> None:
        self._close = close

    def close(self) -> None:
        self._close()


class InProcessBus:
    """Delivers synchronously to every subscriber in this process (the embedded mode)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callback] = []

    def publish(self, message: dict) -> None:
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(message)
            except Exception:
                # One broken subscriber must not stop the publisher or the others.
                logger.exception("route-table subscriber failed on a message")

    def subscribe(self, callback: Callback) -> Subscription:
        with self._lock:
            self._callbacks.append(callback)

        def close() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return Subscription(close)


class RedisBus:
    """Redis pub/sub on one channel. ``subscribe`` runs a listener thread per subscription.

    Publishing while Redis is down logs and drops the message: subscribers
    notice the version gap on the next message (or their periodic version
    check) and reload.
    """

    def __init__(self, url: str, channel: str) -> None:
        import redis

        self._redis = redis
        self._url = url
        self.channel = channel
        self._client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._probe = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)

    def answers(self) -> bool:
        """Whether Redis answers a PING within a second. A hung Redis (stopped, or a
        partition that drops packets) breaks no connection, so the listener alone would
        never notice that load reports stopped coming."""
        try:
            return bool(self._probe.ping())
        except self._redis.RedisError:
            return False

    def publish(self, message: dict) -> bool:
        """False when Redis did not take it (logged; subscribers reconcile by version)."""
        try:
            self._client.publish(self.channel, orjson.dumps(message))
        except self._redis.RedisError as exc:
            logger.warning("route-table publish failed (%s); subscribers will reload", exc)
            return False
        return True

    def subscribe(self, callback: Callback, *, on_connect: Callable[[], None] | None = None,
                  on_disconnect: Callable[[], None] | None = None):
        """Listen until closed, reconnecting after Redis outages.

        ``on_connect`` runs after every (re)subscription: messages published
        while disconnected are lost, so the subscriber must reconcile then.
        ``on_disconnect`` runs when the connection is lost.
        """
        stop = threading.Event()
        thread = threading.Thread(
            target=self._listen, args=(callback, on_connect, on_disconnect, stop),
            name="route-bus", daemon=True
        )
        thread.start()

        def close() -> None:
            stop.set()
            thread.join(timeout=5)

        return Subscription(close)

    def _listen(self, callback: Callback, on_connect, on_disconnect,
                stop: threading.Event) -> None:
        backoff = 0.1
        while not stop.is_set():
            client = self._redis.Redis.from_url(
                self._url, socket_timeout=None, socket_connect_timeout=2, health_check_interval=10
            )
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self.channel)
                backoff = 0.1
                if on_connect is not None:
                    on_connect()
                while not stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is None or message.get("type") != "message":
                        continue
                    try:
                        payload = orjson.loads(message["data"])
                    except orjson.JSONDecodeError:
                        logger.warning("ignoring a malformed route-table message")
                        continue
                    try:
                        callback(payload)
                    except Exception:
                        logger.exception("route-table subscriber failed on a message")
            except self._redis.RedisError as exc:
                logger.warning("route-table bus disconnected (%s); retrying", exc)
                if on_disconnect is not None:
                    on_disconnect()
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                try:
                    pubsub.close()
                    client.close()
                except self._redis.RedisError:
                    pass
