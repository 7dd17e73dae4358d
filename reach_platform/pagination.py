"""Limit/offset pagination with validated parameters.

``?limit=`` must be an integer from 1 to ``MAX_LIMIT`` (1000) and ``?offset=`` an
integer from 0 up; anything else (``-1``, ``null``, ``10**30``, ``abc``) is a 400
``invalid_input`` naming the parameter, never a silent default or a 500 from the
database. Without ``limit`` a page holds ``PAGE_SIZE`` (100) rows.
"""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.pagination import LimitOffsetPagination

MAX_LIMIT = 1000
# The largest OFFSET both PostgreSQL (bigint) and SQLite accept.
MAX_OFFSET = 2**63 - 1


def _integer(request, name: str, *, minimum: int, maximum: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        raise exceptions.ValidationError(
            {name: [f"must be an integer from {minimum} to {maximum}"]})
    value = int(text)
    if not minimum <= value <= maximum:
        raise exceptions.ValidationError(
            {name: [f"must be an integer from {minimum} to {maximum}"]})
    return value


class StrictLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request):
        value = _integer(request, self.limit_query_param, minimum=1, maximum=self.max_limit)
        return self.default_limit if value is None else value

    def get_offset(self, request):
        value = _integer(request, self.offset_query_param, minimum=0, maximum=MAX_OFFSET)
        return 0 if value is None else value

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.limit_query_param:
                parameter["schema"].update(minimum=1, maximum=self.max_limit)
            elif parameter["name"] == self.offset_query_param:
                parameter["schema"].update(minimum=0)
        return parameters
