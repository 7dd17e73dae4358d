"""The control plane's structured errors.

Every error the REST API returns has one shape::

    {"error": {"code": "...", "message": "...", "request_id": "...", "retryable": bool,
               "details": {...}?}}

the same shape and codes as the gateway's: both come from ``reach_core.errors``.
``details`` appears for validation errors and maps field paths to messages.
HTML error pages are kept for the admin; everything else gets JSON, including
Django's own 404 and 500 and a body that is not valid JSON.
"""

from __future__ import annotations

import logging
import sys

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.exceptions import ValidationError as ModelValidationError
from django.db import utils as db_utils
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_default_handler

from reach_core import requestid
from reach_core.errors import CATALOGUE, ReachError, error_body

logger = logging.getLogger(__name__)

class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body is larger than this server accepts."
    default_code = "payload_too_large"


# DRF exception class -> our code. Looked up along the MRO so subclasses inherit.
_CODES: dict[type[Exception], str] = {
    exceptions.ParseError: "malformed_json",
    exceptions.AuthenticationFailed: "unauthorized",
    exceptions.NotAuthenticated: "unauthorized",
    exceptions.PermissionDenied: "forbidden",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "rate_limited",
    exceptions.ValidationError: "invalid_input",
}


def flatten_details(detail, prefix: str = "") -> dict[str, list[str]]:
    """Turn DRF's nested error detail into ``{"field.sub[2].x": [messages]}``."""
    out: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            path = key if not prefix else f"{prefix}.{key}"
            if key == "non_field_errors" and not prefix:
                path = "__all__"
            out.update(flatten_details(value, path))
    elif isinstance(detail, list) and detail and all(isinstance(d, (dict, list)) for d in detail):
        for index, value in enumerate(detail):
            if value:
                out.update(flatten_details(value, f"{prefix}[{index}]"))
    elif isinstance(detail, list):
        out[prefix or "__all__"] = [str(d) for d in detail]
    else:
        out[prefix or "__all__"] = [str(detail)]
    return out


def _code_for(exc: Exception, http_status: int) -> str:
    """A catalogue code for any exception DRF answered (see ``reach_core.errors``)."""
    for klass in type(exc).__mro__:
        if klass in _CODES:
            return _CODES[klass]
    code = getattr(exc, "default_code", None)
    if isinstance(code, str) and code in CATALOGUE:
        return code
    return "internal_error" if http_status >= 500 else "bad_request"


class ReachAPIException(exceptions.APIException):
    """A ``ReachError`` raised inside a DRF view: its catalogue status and code."""

    def __init__(self, error: ReachError) -> None:
        super().__init__(error.message, code=error.code)
        self.status_code = error.kind.status
        self.default_code = error.code
        self.reach_error = error


def api_exception_handler(exc: Exception, context) -> Response | None:
    """DRF hook: the same structured body for every API error."""
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge()
    elif isinstance(exc, ReachError):
        exc = ReachAPIException(exc)
    elif isinstance(exc, ModelValidationError):
        # A model's own check run at save (``full_clean`` in a service) that the
        # serializer could not see: a unique slot taken by a concurrent request.
        exc = exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages})
    elif isinstance(exc, db_utils.DataError):
        # A value PostgreSQL cannot hold or compare (a NUL in a path, a number out of
        # range): the request's fault. Nothing of the value is echoed.
        exc = ReachAPIException(ReachError("invalid_input", _UNSTORABLE_MESSAGE))
    elif isinstance(exc, db_utils.IntegrityError):
        # Two requests (or one request and an existing object) claiming the same unique
        # slot: what a serializer's own check cannot see, decided by the database.
        exc = ReachAPIException(ReachError(
            "conflict", "This conflicts with an existing object: a field or combination "
            "that must be unique is taken."))
    response = drf_default_handler(exc, context)
    if response is None:
        return None
    request = context.get("request")
    rid = getattr(request, "request_id", None) or requestid.current.get()
    code = _code_for(exc, response.status_code)
    details = None
    if isinstance(exc, exceptions.ValidationError):
        details = flatten_details(exc.detail)
        message = "; ".join(f"{path}: {' '.join(msgs)}" for path, msgs in details.items())
    else:
        detail = getattr(exc, "detail", None)
        message = str(detail) if detail is not None else str(exc)
        if code == "malformed_json":
            message = f"Request body is not valid JSON: {message}"
    response.data = error_body(code=code, message=message, request_id=rid, details=details)
    retry_after = getattr(getattr(exc, "reach_error", None), "retry_after", None)
    if retry_after:
        response["Retry-After"] = str(retry_after)
    return response


# --- the database is away -------------------------------------------------------------

_DB_UNAVAILABLE_MESSAGE = "The database is unavailable; retry shortly."
_DB_UNAVAILABLE_PAGE = ("The database is unavailable; this page will work again shortly. "
                        "Please retry in a moment.")
_UNSTORABLE_MESSAGE = ("A value in this request cannot be stored or looked up (a NUL "
                       "character, or a number out of range).")


def _database_unavailable_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [db_utils.OperationalError, db_utils.InterfaceError]
    try:  # unwrapped driver errors, e.g. raised while Django was not wrapping them
        import psycopg
        from psycopg_pool import PoolTimeout

        types += [PoolTimeout, psycopg.OperationalError, psycopg.InterfaceError]
    except ImportError:  # pragma: no cover - psycopg is a dependency
        pass
    return tuple(types)


_DB_UNAVAILABLE_TYPES = _database_unavailable_types()


def is_database_unavailable(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it was raised from) says the database cannot be reached:
    connection refused or lost, the pool's wait timed out (``PoolTimeout``), and the other
    operational errors a retry can cure."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, _DB_UNAVAILABLE_TYPES):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def database_unavailable_response(request: HttpRequest, exc: BaseException) -> HttpResponse:
    """503 ``service_unavailable`` with ``Retry-After``: an HTML page for the admin, the
    structured JSON error everywhere else. The one translation of a database outage."""
    # The text of a connection error can carry the DSN: log the class only.
    logger.warning("database unavailable for %s %s (%s)", request.method, request.path,
                   type(exc).__name__)
    response = _page_or_json(request, code="service_unavailable", http_status=503,
                             title="Service unavailable", page=_DB_UNAVAILABLE_PAGE,
                             message=_DB_UNAVAILABLE_MESSAGE)
    response["Retry-After"] = str(settings.DB_UNAVAILABLE_RETRY_AFTER)
    return response


def unstorable_value_response(request: HttpRequest) -> HttpResponse:
    """400 ``invalid_input`` for a value PostgreSQL cannot hold or compare, reaching a
    view outside the REST API (an admin list filtered by ``?request_id=%00`` was a 500):
    the API's own handler says the same. Nothing of the value is echoed."""
    return _page_or_json(request, code="invalid_input", http_status=400, title="Bad request",
                         page=_UNSTORABLE_MESSAGE, message=_UNSTORABLE_MESSAGE)


def _page_or_json(request: HttpRequest, *, code: str, http_status: int, title: str,
                  page: str, message: str) -> HttpResponse:
    """A small HTML page for the admin, the structured JSON error everywhere else."""
    if not _wants_html(request):
        return _json_error(request, code=code, message=message, http_status=http_status)
    from django.utils.html import escape

    rid = getattr(request, "request_id", None) or requestid.current.get()
    return HttpResponse(
        f"<!doctype html><html><head><title>{title}</title></head><body><h1>{title}</h1>"
        f"<p>{escape(page)}</p><p>Request ID: {escape(rid)}</p></body></html>",
        status=http_status, content_type="text/html; charset=utf-8")


def _json_error(request: HttpRequest, *, code: str, message: str, http_status: int):
    rid = getattr(request, "request_id", None) or requestid.current.get()
    return JsonResponse(
        error_body(code=code, message=message, request_id=rid), status=http_status
    )


def _wants_html(request: HttpRequest) -> bool:
    return request.path.startswith("/admin/")


def _error_view(html_view: str, *, code: str, message: str, http_status: int):
    """A handler400/403/404/500: Django's HTML page for the admin, our JSON elsewhere."""

    def view(request: HttpRequest, exception=None):
        if html_view == "server_error":
            # Raised outside a view (a middleware): the database check still applies.
            exc = sys.exc_info()[1]
            if is_database_unavailable(exc):
                return database_unavailable_response(request, exc)
        if _wants_html(request):
            from django.views import defaults

            html = getattr(defaults, html_view)
            return html(request) if html_view == "server_error" else html(request, exception)
        text = message.format(path=request.path)
        return _json_error(request, code=code, message=text, http_status=http_status)

    view.__name__ = html_view
    return view


page_not_found = _error_view("page_not_found", code="not_found", message="No such path: {path}",
                             http_status=status.HTTP_404_NOT_FOUND)
server_error = _error_view(
    "server_error", code="internal_error",
    message="The server failed to handle this request; it has been logged.",
    http_status=status.HTTP_500_INTERNAL_SERVER_ERROR,
)
bad_request = _error_view("bad_request", code="bad_request",
                          message="The request could not be understood.",
                          http_status=status.HTTP_400_BAD_REQUEST)
permission_denied = _error_view("permission_denied", code="forbidden",
                                message="You may not do this.",
                                http_status=status.HTTP_403_FORBIDDEN)
