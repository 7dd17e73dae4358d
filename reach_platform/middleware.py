from __future__ import annotations

import logging

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from reach_core import requestid


class RequestIdMiddleware:
    """Accept or generate ``X-Request-ID``, expose it as ``request.request_id``, echo it."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def _begin(self, request):
        request.request_id = requestid.accept_or_new(request.headers.get(requestid.HEADER))
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
