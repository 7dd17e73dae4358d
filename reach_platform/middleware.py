from __future__ import annotations

import logging

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from reach_core import requestid


class HybridMiddleware:
    """A middleware that runs in the sync and the async stack alike."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)


class RequestIdMiddleware(HybridMiddleware):
    """Accept or generate ``X-Request-ID``, expose it as ``request.request_id``, echo it."""

    def _begin(self, request):
        scope = getattr(request, "scope", None)  # ASGI: the id the server side chose
        chosen = scope.get("reach.request_id") if scope is not None else None
        request.request_id = chosen or requestid.accept_or_new(
            request.headers.get(requestid.HEADER))
        return requestid.current.set(request.request_id)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        token = self._begin(request)
        try:
            response = self.get_response(request)
        finally:
            requestid.current.reset(token)
        response[requestid.HEADER] = request.request_id
        return response

    async def _acall(self, request):
        token = self._begin(request)
        try:
            response = await self.get_response(request)
        finally:
            requestid.current.reset(token)
        response[requestid.HEADER] = request.request_id
        return response


class RequestIdLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = requestid.current.get()
        return True


class DatabaseUnavailableMiddleware(HybridMiddleware):
    """A view (API, heartbeat, admin) that fails because the database cannot be reached
    answers 503 ``service_unavailable`` with ``Retry-After`` instead of a 500 with a
    traceback. ``reach_platform.errors.database_unavailable_response`` builds the reply;
    errors raised outside views reach it through ``handler500``. A value the database
    cannot hold (a NUL in an admin filter) is the request's fault: 400, not 500."""

    def __call__(self, request):
        # A coroutine in async mode, a response in sync mode: either way the caller's.
        return self.get_response(request)

    def process_exception(self, request, exception):
        from django.db import DataError

        from reach_platform.errors import (
            database_unavailable_response,
            is_database_unavailable,
            unstorable_value_response,
        )

        if is_database_unavailable(exception):
            return database_unavailable_response(request, exception)
        if isinstance(exception, DataError):  # the request's value, not the database
            return unstorable_value_response(request)
        return None
